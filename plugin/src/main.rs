//! `kubectl argocd-pull`: the fleet as the hub sees it. Installed as
//! `kubectl-argocd-pull` on the PATH (`make install-plugin`), kubectl finds
//! it as a plugin. See docs/operations.md.

mod facts;
mod read;
mod view;

use std::io::Write;
use std::time::SystemTime;

use argocd_pull_core::report::secs;
use argocd_pull_core::route::decide::{Facts, Route, decide};
use argocd_pull_core::route::transport::Transport;
use clap::{Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::facts::Snapshot;
use crate::read::Hub;

/// The pull model's fleet as the hub sees it: agents, Applications, why one
/// is or is not delivered, certificates.
#[derive(Parser, Debug)]
#[command(name = "kubectl argocd-pull", version)]
struct Cli {
    /// The kubeconfig of the hub (default: $KUBECONFIG, then ~/.kube/config,
    /// then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace of the hub-controller and its CA Secrets.
    #[arg(long, global = true, default_value = argocd_pull_addon::HUB_NAMESPACE)]
    hub_namespace: String,
    /// Read the replicas' reports at these admin URLs (e.g. after `kubectl
    /// port-forward`) instead of through the API server's pod proxy; repeat
    /// for each replica.
    #[arg(long, global = true)]
    admin: Vec<String>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The agents: every cluster with the addon, the replica its agent is
    /// connected to, mode, version, connected since, last seen, lag,
    /// certificate expiry.
    Status,
    /// Each pulled Application: cluster, transport, revision, the
    /// cluster's sync and health, argocd-pull's condition.
    Apps {
        /// Only this namespace (default: all).
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Why NAMESPACE/APP is or is not delivered, in words.
    Explain {
        /// The hub Application, as NAMESPACE/NAME.
        application: String,
    },
    /// The hub's CAs and each replica's serving certificate, with expiry
    /// and next rotation.
    Certs,
    /// Denies the certificate CLUSTER's agent is connected with (the hub's
    /// deny list): its stream ends within seconds and the certificate is
    /// refused from then on.
    Revoke {
        cluster: String,
        /// Why: goes into the hub's log and the agent's refusal.
        #[arg(long, default_value = "revoked with kubectl argocd-pull")]
        note: String,
        /// The deny list ConfigMap (the hub-controller's
        /// --grpc-denied-certificates), in --hub-namespace.
        #[arg(long, default_value = argocd_pull_apis::keys::DENY_LIST)]
        deny_list: String,
    },
}

async fn client(cli: &Cli) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let mut config = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("cannot read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None if cli.context.is_some() => kube::Config::from_kubeconfig(&options).await?,
        None => kube::Config::infer().await?,
    };
    // A command answers at once: kube's default retries a 503 fifteen
    // times (20 s), and a pod the API server cannot reach through its pod
    // proxy answers 503 every time; the message says what to do instead.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Replicas whose report could not be read, on stderr: what is shown is
/// then only part of the picture.
fn warn_unreachable(snapshot: &Snapshot) {
    let mut err = std::io::stderr();
    for (replica, why) in &snapshot.unreachable {
        let _ = writeln!(
            err,
            "warning: no report from {}: {}",
            view::escape(replica),
            view::escape(why)
        );
    }
}

fn route(app: &argocd_pull_apis::argocd::Application, snapshot: &Snapshot) -> Route {
    let authorization = snapshot.authorization().unwrap_or_default();
    decide(
        app,
        &Facts {
            grpc_served: snapshot.grpc_served(),
            authorization: &authorization,
            world: snapshot,
        },
    )
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let hub = Hub {
        client: client(&cli).await?,
        namespace: cli.hub_namespace.clone(),
        admin: cli.admin.clone(),
    };
    let json = cli.output == Output::Json;
    match &cli.command {
        Command::Status => status(&hub, json).await,
        Command::Apps { namespace } => apps(&hub, namespace.as_deref(), json).await,
        Command::Explain { application } => explain(&hub, application, json).await,
        Command::Certs => certs(&hub, json).await,
        Command::Revoke {
            cluster,
            note,
            deny_list,
        } => revoke(&hub, cluster, note, deny_list, json).await,
    }
}

/// `status`: the agents, as the replicas that answered report them.
async fn status(hub: &Hub, json: bool) -> anyhow::Result<()> {
    let now = secs(SystemTime::now());
    let snapshot = hub.snapshot().await?;
    warn_unreachable(&snapshot);
    let rows = view::agent_rows(&snapshot);
    if json {
        print_json(&rows)?;
    } else {
        print!("{}", view::agent_table(&rows, now).render());
    }
    Ok(())
}

/// `apps`: each pulled Application of `namespace` (of all when `None`),
/// with its route decided by the hub's rule.
async fn apps(hub: &Hub, namespace: Option<&str>, json: bool) -> anyhow::Result<()> {
    let snapshot = hub.snapshot().await?;
    warn_unreachable(&snapshot);
    let rows: Vec<_> = hub
        .applications(namespace)
        .await?
        .iter()
        .map(|app| view::app_row(app, &route(app, &snapshot)))
        .collect();
    if json {
        print_json(&rows)?;
    } else {
        print!("{}", view::app_table(&rows).render());
    }
    Ok(())
}

/// `explain`: why the hub Application `application` (NAMESPACE/NAME) is
/// or is not delivered.
async fn explain(hub: &Hub, application: &str, json: bool) -> anyhow::Result<()> {
    let (ns, name) = application
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .ok_or_else(|| {
            anyhow::anyhow!("{application:?} is not NAMESPACE/NAME, e.g. argocd/guestbook")
        })?;
    let app = hub
        .application(ns, name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("Application {ns}/{name} does not exist on the hub"))?;
    let snapshot = hub.snapshot().await?;
    warn_unreachable(&snapshot);
    let route = route(&app, &snapshot);
    let work = match &route {
        Route::Deliver {
            transport: Transport::ManifestWork,
            target,
        } => {
            let work_name = argocd_pull_core::render::work::work_name(ns, name);
            hub.work(&target.cluster, &work_name).await?
        }
        _ => None,
    };
    let explained = view::explain(
        &app,
        &route,
        &snapshot,
        work.as_ref(),
        snapshot.authorization().is_some(),
    );
    if json {
        return print_json(&explained);
    }
    println!(
        "{}: {}",
        view::escape(&explained.application),
        if explained.delivered {
            "delivered"
        } else {
            "not delivered"
        }
    );
    for reason in &explained.reasons {
        println!("  - {}", view::escape(reason));
    }
    Ok(())
}

/// `certs`: the hub's CAs and each replica's serving certificate.
async fn certs(hub: &Hub, json: bool) -> anyhow::Result<()> {
    let now = secs(SystemTime::now());
    let (reports, unreachable) = hub.reports().await;
    warn_unreachable(&Snapshot {
        unreachable,
        ..Snapshot::default()
    });
    let rows = hub.certificates(&reports).await;
    if json {
        print_json(&rows)?;
    } else {
        print!("{}", view::cert_table(&rows, now).render());
    }
    Ok(())
}

/// `revoke`: denies the certificates `cluster`'s agent is connected with,
/// in the deny list ConfigMap `deny_list`, with `note` saying why.
async fn revoke(
    hub: &Hub,
    cluster: &str,
    note: &str,
    deny_list: &str,
    json: bool,
) -> anyhow::Result<()> {
    let snapshot = hub.snapshot().await?;
    warn_unreachable(&snapshot);
    let fingerprints = view::connected_certificates(&snapshot, cluster);
    if fingerprints.is_empty() {
        anyhow::bail!(
            "cluster {cluster:?}'s agent is not connected to any replica that answered: no certificate to deny. \
             To cut the cluster off, disable its addon (clusteradm addon disable --names {} --clusters {cluster}) \
             or delete its ManagedCluster (docs/security.md, Revoking a cluster)",
            argocd_pull_apis::keys::ADDON_NAME
        );
    }
    hub.deny(deny_list, &fingerprints, note).await?;
    let rows: Vec<_> = fingerprints
        .iter()
        .map(|f| serde_json::json!({ "cluster": cluster, "certificateFingerprint": f, "denyList": format!("{}/{deny_list}", hub.namespace), "note": note }))
        .collect();
    if json {
        return print_json(&rows);
    }
    for f in &fingerprints {
        let f = view::escape(f);
        println!(
            "denied certificate {f} of cluster {cluster} in ConfigMap {}/{deny_list}: the hub ends its stream within seconds",
            hub.namespace
        );
    }
    println!(
        "OCM renews the agent's certificate daily: to cut {cluster} off for good, also disable its addon or stop OCM signing for it (docs/security.md)"
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
