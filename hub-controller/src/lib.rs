//! The hub-controller: watches pull-model Argo CD Applications on the hub,
//! delivers each to its managed cluster and writes the spoke's status back
//! onto the dormant hub copy.

#![forbid(unsafe_code)]

pub mod delivery;

use argocd_pull_runtime::{AdminArgs, ClientArgs, LogArgs, Readiness, admin::Admin, shutdown};
use clap::Parser;
use prometheus_client::registry::Registry;

#[derive(Parser, Clone, Debug)]
#[command(
    name = "hub-controller",
    version,
    about = "Delivers pull-model Argo CD Applications from the OCM hub to managed clusters and writes their status back"
)]
pub struct Args {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Namespace of the hub's Argo CD.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_NAMESPACE", default_value = "argocd")]
    pub argocd_namespace: String,
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let shutdown = shutdown::on_signals()?;
    let readiness = Readiness::default();
    let registry = Registry::with_prefix("argocd_pull_hub");
    let admin = Admin::new(readiness.clone(), registry);
    let server = tokio::spawn(admin.serve(args.admin.addr, shutdown.clone()));

    let client = args.client.client().await?;
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the hub API server: {e}"))?;
    tracing::info!(server = %version.git_version, argocd_namespace = %args.argocd_namespace, "connected to the hub");
    readiness.set("hub-api", true);

    server.await??;
    tracing::info!("stopped");
    Ok(())
}
