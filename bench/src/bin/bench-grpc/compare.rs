//! `bench-grpc compare`: ours and argocd-agent side by side on the same hub
//! and managed API servers, measured the same way from outside:
//!
//! - latency, one change at a time: a hub Application's spec change until
//!   the managed cluster's watch shows it, and a status change on the
//!   managed cluster's copy until the hub's watch shows it on the hub copy
//!   (p50 and p99 over `--changes` each way);
//! - one agent's status throughput: `--updates` status writes on the
//!   managed cluster's copies of `--apps` Applications (32 in flight, as
//!   Argo CD would write them), until every hub copy shows the last status
//!   written for it; what is still wrong after a minute is counted as lost;
//! - recovery: the hub side is killed (SIGKILL) and started again; the time
//!   from the restart until a hub change is applied on the managed cluster,
//!   and until a managed cluster's status change is on the hub copy.
//!
//! Both run their real agent as its own binary against the real managed
//! API server, each at its own defaults: no flag but those that say where
//! the hub, the cluster and the certificates are (and, for argocd-agent,
//! the mTLS and managed mode this comparison is about), every process
//! logging at `info` to its file in the benchmark's log folder. The
//! settings are printed above the table.
//! With `--repeat N` (N even) each side runs N times, in ABBA order (ours
//! first in half of the rounds, `argocd_pull_bench::order`), on the same
//! API servers; every figure is printed as median (min–max) over the runs
//! with its spread, and where ours stands (`argocd_pull_bench::table`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::application_resource;
use argocd_pull_bench::order::{abba, describe};
use argocd_pull_bench::stats::percentiles;
use clap::Parser;
use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::{Cluster, ClusterConfig, CrdSet};
use tokio::sync::mpsc;

use crate::argocd_agent::{AGENT_SPOKE_NS, ArgocdAgent, LOG_LEVEL, log_file, logs_dir};
use crate::hub::{self, HubOptions, HubProcess, Pki, SPOKE_NS, agent_subject};
use crate::latency::watch_one;
use crate::report::{Side, SideFigures, print_tables};

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// Changes timed one at a time, each way.
    #[arg(long, default_value_t = 1000)]
    changes: usize,
    /// Applications in the throughput part.
    #[arg(long, default_value_t = 100)]
    apps: usize,
    /// Status writes on the managed cluster in the throughput part.
    #[arg(long, default_value_t = 5000)]
    updates: usize,
    /// argocd-agent's binary (default: `<cache>/bin/argocd-agent`, built by
    /// test/tools/build-argocd-agent.sh).
    #[arg(long)]
    argocd_agent: Option<PathBuf>,
    /// Our spoke-agent's binary (default: the hub-controller's folder's
    /// `spoke-agent`, e.g. target/release/spoke-agent).
    #[arg(long)]
    spoke_agent: Option<PathBuf>,
}

const OURS_NS: &str = "bench";
/// Status writes in flight on the managed cluster in the throughput part.
const IN_FLIGHT: usize = 32;
const AGENT_NAME: &str = "agent1";

/// One side while it runs: where its Applications live and how its hub
/// part is killed and started again. One exists at a time: its size does
/// not matter.
#[allow(clippy::large_enum_variant)]
enum Running<'a> {
    Ours {
        hub: HubProcess,
        options: HubOptions<'a>,
        agent: tokio::process::Child,
    },
    Peer(ArgocdAgent),
}

impl Running<'_> {
    fn hub_ns(&self) -> &str {
        match self {
            Running::Ours { .. } => OURS_NS,
            Running::Peer(p) => &p.agent_name,
        }
    }

    fn spoke_ns(&self) -> &str {
        match self {
            Running::Ours { .. } => SPOKE_NS,
            Running::Peer(_) => AGENT_SPOKE_NS,
        }
    }

    /// The hub Application: ours needs the pull label and the cluster
    /// annotation; argocd-agent delivers every Application in the agent's
    /// namespace.
    fn app(&self, name: &str) -> Value {
        match self {
            Running::Ours { .. } => hub::application(OURS_NS, name, "spoke1"),
            Running::Peer(p) => json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": { "name": name, "namespace": p.agent_name },
                "spec": { "project": "default",
                    "source": { "repoURL": "https://git.example/bench.git", "path": "app", "targetRevision": "v0" },
                    "destination": { "server": "https://kubernetes.default.svc", "namespace": name } }
            }),
        }
    }

    /// SIGKILL, then start again; returns the moment of the new start.
    async fn restart_hub(&mut self, hub_cluster: &Cluster) -> Result<Instant> {
        match self {
            Running::Ours { hub, options, .. } => {
                hub.kill().await?;
                *hub = HubProcess::start(options)?;
                Ok(hub.started)
            }
            Running::Peer(p) => {
                p.kill_principal().await?;
                p.start_principal(hub_cluster)?;
                Ok(p.principal_started())
            }
        }
    }

    async fn stop(self) {
        match self {
            Running::Ours {
                mut hub, mut agent, ..
            } => {
                let _ = agent.kill().await;
                let _ = hub.kill().await;
            }
            Running::Peer(mut p) => {
                let _ = p.kill_principal().await;
            }
        }
    }
}

/// Waits until the watch shows `want`, at most `within`.
pub async fn seen(
    rx: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    want: &str,
    within: Duration,
) -> Result<Instant> {
    let deadline = tokio::time::sleep(within);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => bail!("{want:?} not seen within {within:?}"),
            got = rx.recv() => match got {
                Some((v, at)) if v == want => return Ok(at),
                Some(_) => {}
                None => bail!("the watch ended"),
            }
        }
    }
}

fn revision(v: &Value) -> Option<String> {
    v.pointer("/spec/source/targetRevision")?
        .as_str()
        .map(str::to_string)
}

fn message(v: &Value) -> Option<String> {
    v.pointer("/status/health/message")?
        .as_str()
        .map(str::to_string)
}

fn status_patch(message: &str) -> Patch<Value> {
    Patch::Merge(json!({ "status": {
        "health": { "status": "Healthy", "message": message },
        "sync": { "status": "Synced" } } }))
}

pub async fn run(args: CompareArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let rounds = abba(Side::Ours, Side::ArgocdAgent, repeat)?;
    let peer_bin = args
        .argocd_agent
        .clone()
        .unwrap_or_else(crate::argocd_agent::default_bin);
    let agent_bin = args
        .spoke_agent
        .clone()
        .unwrap_or_else(|| hub_bin.with_file_name("spoke-agent"));
    if !agent_bin.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p argocd-pull-spoke-agent`",
            agent_bin.display()
        );
    }
    let bins = Bins {
        hub: hub_bin,
        agent: &agent_bin,
        peer: &peer_bin,
    };
    let pki = Pki::new()?;
    let targets = vec![format!("{OURS_NS}=*")];

    let mut figures: HashMap<Side, Vec<SideFigures>> = HashMap::new();
    let mut version = String::new();
    for (round, sides) in rounds.iter().enumerate() {
        for &side in sides {
            let f = if side == Side::ArgocdAgent && !peer_bin.is_file() {
                SideFigures::not_run(format!("{} is missing", peer_bin.display()))
            } else {
                eprintln!(
                    "bench-grpc compare: round {}/{}: {}",
                    round + 1,
                    repeat,
                    side.label()
                );
                let (hub, spoke) = fresh_clusters().await?;
                version = hub.version().to_string();
                let running = start(side, &targets, &bins, &hub, &spoke, &pki).await?;
                one_side(&args, running, &hub, &spoke, round).await
                // The clusters stop here.
            };
            eprintln!("bench-grpc compare: {}: {f:?}", side.label());
            figures.entry(side).or_default().push(f);
        }
    }
    let title = format!(
        "gRPC transport side by side, real API servers (kube-apiserver {}, fresh ones for each \
         run), {} changes each way, {} status writes over {} Applications, {repeat} run(s) per \
         side in ABBA order ({})",
        version,
        args.changes,
        args.updates,
        args.apps,
        describe(&rounds, Side::label)
    );
    print_tables(&title, &settings()?, &figures);
    Ok(())
}

/// A hub and a managed cluster of their own for one side's run. On API
/// servers shared by every run, each of our runs was slower than the one
/// before (p50 hub -> spoke 7.7, 10.7, 11.7 and 13.7 ms over four rounds,
/// a spread of 1.8x, on a quiet machine): whatever a run leaves on the API
/// servers no longer reaches the next.
async fn fresh_clusters() -> Result<(Cluster, Cluster)> {
    eprintln!("bench-grpc compare: starting a hub and a managed cluster");
    let (hub, spoke) = tokio::join!(
        Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)),
        Cluster::start(ClusterConfig::new("spoke1", CrdSet::Managed)),
    );
    let (hub, spoke) = (hub?, spoke?);
    let hub_client = hub.client().await?;
    spoke.ensure_namespace(SPOKE_NS).await?;
    hub.ensure_namespace(OURS_NS).await?;
    hub.ensure_namespace(hub::CONTROLLER_NS).await?;
    hub::join(&hub_client, "spoke1").await?;
    Ok((hub, spoke))
}

/// The binaries of both sides.
struct Bins<'a> {
    hub: &'a Path,
    agent: &'a Path,
    peer: &'a Path,
}

/// What each side runs with, as printed above the table. Our agent's
/// defaults are read from its own flags, so that this cannot drift from
/// what the binary does.
fn settings() -> Result<String> {
    let defaults = argocd_pull_spoke_agent::Args::try_parse_from([
        "spoke-agent",
        "--cluster-name",
        "spoke1",
        "--hub-address",
        "https://hub",
    ])?;
    Ok(format!(
        "settings: each side at its own defaults. ours: spoke-agent with only --cluster-name, --hub-address, \
         --tls-cert/--tls-key/--hub-ca, --kubeconfig and --admin-addr (so reconnect backoff {:?} to {:?}, \
         {} workers, API client {}/s burst {}), hub-controller with the gRPC flags and {}; argocd-agent: agent \
         (managed mode, mTLS) and principal with the flags that connect them and {}; log levels: both agents \
         and the principal `{LOG_LEVEL}`, the hub-controller `{}` (BENCH_HUB_LOG); every log to its file in {}.",
        defaults.reconnect_min,
        defaults.reconnect_max,
        defaults.workers,
        defaults.client.qps,
        defaults.client.burst,
        hub::NOT_DEFAULT,
        crate::argocd_agent::NOT_DEFAULT,
        hub::file_log_level(),
        logs_dir()?.display()
    ))
}

async fn start<'a>(
    side: Side,
    targets: &'a [String],
    bins: &Bins<'a>,
    hub: &'a Cluster,
    spoke: &Cluster,
    pki: &'a Pki,
) -> Result<Running<'a>> {
    Ok(match side {
        Side::Ours => {
            let logs = logs_dir()?;
            let options = HubOptions {
                bin: bins.hub,
                hub,
                pki,
                grpc_addr: testenv::net::free_addr()?,
                allowed_targets: targets,
                log: Some(logs.join("compare-ours-hub.log")),
                max_connections: None,
                extra_args: &[],
            };
            let mut hub_process = HubProcess::start(&options)?;
            hub_process.ready(Duration::from_secs(60)).await?;
            let tls = pki.agent_files("spoke1", &agent_subject("spoke1", "bench"))?;
            let log = logs.join("compare-ours-agent.log");
            let agent = tokio::process::Command::new(bins.agent)
                .args(["--cluster-name", "spoke1"])
                .args(["--hub-address", &format!("https://{}", options.grpc_addr)])
                .arg("--tls-cert")
                .arg(&tls.cert)
                .arg("--tls-key")
                .arg(&tls.key)
                .arg("--hub-ca")
                .arg(&tls.ca)
                .arg("--kubeconfig")
                .arg(spoke.kubeconfig())
                .args(["--admin-addr", &testenv::net::free_addr()?.to_string()])
                .env("ARGOCD_PULL_LOG", LOG_LEVEL)
                .stdout(log_file(&log)?)
                .stderr(log_file(&log)?)
                .kill_on_drop(true)
                .spawn()
                .context("starting the spoke-agent")?;
            if let Some(pid) = agent.id() {
                // Killed with the spoke's API server if this benchmark is.
                spoke.adopt(pid);
            }
            Running::Ours {
                hub: hub_process,
                options,
                agent,
            }
        }
        Side::ArgocdAgent => {
            Running::Peer(ArgocdAgent::start(bins.peer, hub, spoke, pki, AGENT_NAME).await?)
        }
    })
}

/// Every part for one side; a part that fails is reported, not fatal.
async fn one_side(
    args: &CompareArgs,
    mut running: Running<'_>,
    hub: &Cluster,
    spoke: &Cluster,
    round: usize,
) -> SideFigures {
    let mut f = SideFigures::default();
    let result = async {
        let hub_client = hub.client().await?;
        let spoke_client = spoke.client().await?;
        let ar = application_resource();
        let hub_apps: Api<DynamicObject> =
            Api::namespaced_with(hub_client.clone(), running.hub_ns(), &ar);
        let spoke_apps: Api<DynamicObject> =
            Api::namespaced_with(spoke_client.clone(), running.spoke_ns(), &ar);

        // Latency.
        let name = format!("latency-r{round}");
        let obj: DynamicObject = serde_json::from_value(running.app(&name))?;
        hub_apps.create(&PostParams::default(), &obj).await?;
        let mut on_spoke = watch_one(spoke_client.clone(), running.spoke_ns(), &name, revision);
        let mut on_hub = watch_one(hub_client.clone(), running.hub_ns(), &name, message);
        seen(&mut on_spoke, "v0", Duration::from_secs(120))
            .await
            .context("the first delivery")?;
        let mut down = Vec::with_capacity(args.changes);
        for i in 1..=args.changes {
            let rev = format!("v{i}");
            let start = Instant::now();
            let spec = json!({ "spec": { "source": { "targetRevision": rev } } });
            hub_apps
                .patch(&name, &PatchParams::default(), &Patch::Merge(spec))
                .await?;
            // A change not seen in 30 s counts as missed; the next one
            // supersedes it, so the side goes on.
            match seen(&mut on_spoke, &rev, Duration::from_secs(30)).await {
                Ok(at) => down.push(at - start),
                Err(_) => f.down_missed += 1,
            }
        }
        f.down = percentiles(down);
        let mut up = Vec::with_capacity(args.changes);
        for i in 1..=args.changes {
            let m = format!("m{i}");
            let start = Instant::now();
            spoke_apps
                .patch(&name, &PatchParams::default(), &status_patch(&m))
                .await?;
            match seen(&mut on_hub, &m, Duration::from_secs(30)).await {
                Ok(at) => up.push(at - start),
                Err(_) => f.up_missed += 1,
            }
        }
        f.up = percentiles(up);

        // Recovery after the hub side is killed and started again.
        let restarted = running.restart_hub(hub).await?;
        let rev = "after-restart";
        hub_apps
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "source": { "targetRevision": rev } } })),
            )
            .await?;
        f.recovery_down =
            Some(seen(&mut on_spoke, rev, Duration::from_secs(300)).await? - restarted);
        spoke_apps
            .patch(&name, &PatchParams::default(), &status_patch(rev))
            .await?;
        f.recovery_up = Some(seen(&mut on_hub, rev, Duration::from_secs(300)).await? - restarted);
        drop((on_spoke, on_hub));

        // One agent's status throughput.
        let names: Vec<String> = (0..args.apps).map(|i| format!("tp-r{round}-{i}")).collect();
        for n in &names {
            let obj: DynamicObject = serde_json::from_value(running.app(n))?;
            hub_apps.create(&PostParams::default(), &obj).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let there = spoke_apps.list_metadata(&ListParams::default()).await?;
            let have: std::collections::HashSet<String> = there
                .items
                .iter()
                .filter_map(|a| a.metadata.name.clone())
                .collect();
            if names.iter().all(|n| have.contains(n)) {
                break;
            }
            if Instant::now() > deadline {
                bail!("the throughput Applications were not all delivered in 300 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The hub's etcd revision: its advance counts every write to the hub.
        let revision = |l: &kube::core::ObjectList<DynamicObject>| {
            l.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        };
        let rev0 = revision(&hub_apps.list(&ListParams::default().limit(1)).await?);
        let start = Instant::now();
        futures::stream::iter(0..args.updates)
            .for_each_concurrent(IN_FLIGHT, |k| {
                let spoke_apps = spoke_apps.clone();
                let name = names[k % names.len()].clone();
                async move {
                    let _ = spoke_apps
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &status_patch(&format!("u{k}")),
                        )
                        .await;
                }
            })
            .await;
        f.updates_written = Some(start.elapsed());
        // The last status of each, as its managed copy shows it now that
        // every write has returned: two writes of one Application in flight
        // at once land in either order, so the last one sent need not be
        // the last one written (taking it for that counted updates as lost
        // that were never the last).
        let on_spoke = spoke_apps.list(&ListParams::default()).await?;
        let last: HashMap<String, String> = on_spoke
            .items
            .iter()
            .filter_map(|a| {
                let name = a.metadata.name.clone()?;
                names.contains(&name).then_some(())?;
                Some((name, message(&a.data)?))
            })
            .collect();
        if last.len() != names.len() {
            bail!(
                "{} of {} managed copies show no status written by the benchmark",
                names.len() - last.len(),
                names.len()
            );
        }
        let settle = Instant::now() + Duration::from_secs(60);
        loop {
            let listed = hub_apps.list(&ListParams::default()).await?;
            let wrong = last
                .iter()
                .filter(|(n, want)| {
                    !listed.items.iter().any(|a| {
                        a.metadata.name.as_deref() == Some(n.as_str())
                            && message(&a.data).as_deref() == Some(want.as_str())
                    })
                })
                .count();
            f.lost = Some(wrong);
            if wrong == 0 {
                f.updates_converged = Some(start.elapsed());
                f.hub_writes = rev0
                    .zip(revision(&listed))
                    .map(|(a, b)| b.saturating_sub(a));
                f.updates = args.updates;
                break;
            }
            if Instant::now() > settle {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Leave the hub as found, while the side still runs to carry it out.
        let _ = hub_apps
            .delete_collection(&DeleteParams::background(), &ListParams::default())
            .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        f.error = Some(format!("{e:#}"));
    }
    running.stop().await;
    f
}
