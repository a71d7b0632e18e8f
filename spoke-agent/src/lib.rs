//! The spoke-agent: dials the hub, applies the Applications it is sent for
//! the local Argo CD, and streams their status back.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use argocd_pull_runtime::{AdminArgs, ClientArgs, LogArgs, Readiness, admin::Admin, shutdown};
use clap::{Parser, ValueEnum};
use prometheus_client::registry::Registry;

#[derive(Parser, Clone, Debug)]
#[command(
    name = "spoke-agent",
    version,
    about = "Pulls Argo CD Applications from the argocd-pull hub into this cluster and reports their status back"
)]
pub struct Args {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Name of this managed cluster, as known to OCM. Only used in logs: the
    /// hub takes the cluster's identity from the client certificate.
    #[arg(long, env = "ARGOCD_PULL_CLUSTER_NAME")]
    pub cluster_name: String,
    /// gRPC address of the hub-controller, e.g. `https://hub.example.com:8443`.
    #[arg(long, env = "ARGOCD_PULL_HUB_ADDRESS")]
    pub hub_address: String,
    /// Client certificate (PEM) issued by OCM; reloaded when it changes.
    #[arg(
        long,
        env = "ARGOCD_PULL_TLS_CERT",
        default_value = "/managed/argocd-pull/tls.crt"
    )]
    pub tls_cert: PathBuf,
    /// Private key (PEM) of the client certificate; reloaded when it changes.
    #[arg(
        long,
        env = "ARGOCD_PULL_TLS_KEY",
        default_value = "/managed/argocd-pull/tls.key"
    )]
    pub tls_key: PathBuf,
    /// CA bundle (PEM) that signed the hub's serving certificate.
    #[arg(
        long,
        env = "ARGOCD_PULL_HUB_CA",
        default_value = "/managed/argocd-pull/ca.crt"
    )]
    pub hub_ca: PathBuf,
    /// Namespace of this cluster's Argo CD, where Applications are applied.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_NAMESPACE", default_value = "argocd")]
    pub argocd_namespace: String,
    /// Who owns the Applications: the hub (`managed`) or this cluster (`autonomous`).
    #[arg(long, env = "ARGOCD_PULL_MODE", value_enum, default_value_t = Mode::Managed)]
    pub mode: Mode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The hub owns spec; this agent owns status and reverts local edits.
    Managed,
    /// Applications are defined here; the hub shows a read-only mirror.
    Autonomous,
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let shutdown = shutdown::on_signals()?;
    let readiness = Readiness::default();
    let registry = Registry::with_prefix("argocd_pull_agent");
    let admin = Admin::new(readiness.clone(), registry);
    let server = tokio::spawn(admin.serve(args.admin.addr, shutdown.clone()));

    let client = args.client.client().await?;
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the managed cluster's API server: {e}"))?;
    tracing::info!(cluster = %args.cluster_name, server = %version.git_version, mode = ?args.mode, "connected to the managed cluster");
    readiness.set("cluster-api", true);

    server.await??;
    tracing::info!("stopped");
    Ok(())
}
