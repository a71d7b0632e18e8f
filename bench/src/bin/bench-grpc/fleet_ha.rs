//! The fleet part of `bench-grpc` with several hub-controller replicas
//! (`fleet-ha`): the same hub API server, ManagedClusters, Applications and
//! fleet load generator as `fleet`, but `--replicas` release
//! hub-controllers with leader election behind one Service (a loopback TCP
//! balancer, [`testenv::balancer`]), every one serving gRPC.
//!
//! 1. First start: every replica Ready, then the fleet; timed until every
//!    agent is connected and in sync and every hub copy carries the status
//!    its agent sent. Then a steady state; each replica's agents and peak
//!    resident memory (VmHWM).
//! 2. A serving replica that does not lead (the one with the most agents)
//!    is killed (SIGKILL) and taken out of the Service; at that moment the
//!    benchmark erases the status of `--erase-per-cluster` hub copies of
//!    each of that replica's clusters (changes made while their writer was
//!    dead). Timed until its agents are connected elsewhere and in sync,
//!    and until every hub copy carries its agent's status again (the
//!    clusters' claims taken over and their status written). A replacement
//!    starts.
//! 3. The same for the leader, also timed until another replica leads.
//! 4. At the end: every copy right, every agent connected once, nothing
//!    pending.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use testenv::balancer::Balancer;
use testenv::{Cluster, ClusterConfig, CrdSet};
use tokio::time::Instant;

use crate::fleet::{
    AGENT_NAME, End, NS, app_name, check_runs, create_apps, end_rows, join_clusters, log_rows,
    watch_copies,
};
use crate::fleet_load_generator::LoadGenerator;
use crate::hub::{HubOptions, HubProcess, Pki};
use crate::report::{self, Row, print_runs};

#[derive(clap::Args, Debug)]
pub struct FleetHaArgs {
    /// Simulated agents, one per managed cluster.
    #[arg(long, default_value_t = 3000)]
    agents: usize,
    /// Applications per managed cluster.
    #[arg(long, default_value_t = 10)]
    apps_per_agent: usize,
    /// hub-controller replicas.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Seconds of steady state after the first start.
    #[arg(long, default_value_t = 40)]
    steady_secs: u64,
    /// Hub copies per moved cluster whose status is erased while their
    /// writer is dead (each must be rewritten by the replica that takes the
    /// cluster over). All of them measures the API server's write rate
    /// rather than the failover.
    #[arg(long, default_value_t = 1)]
    erase_per_cluster: usize,
    /// Creates and patches in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 1200)]
    timeout_secs: u64,
    /// Shortest reconnect delay of the agents (the spoke-agent's default).
    #[arg(long, default_value = "500ms", value_parser = argocd_pull_spoke_agent::parse_duration)]
    reconnect_min: Duration,
    /// Longest reconnect delay of the agents (the spoke-agent's default).
    #[arg(long, default_value = "30s", value_parser = argocd_pull_spoke_agent::parse_duration)]
    reconnect_max: Duration,
}

/// One replica: its process, gRPC address and name.
struct Replica {
    name: String,
    process: HubProcess,
    grpc: std::net::SocketAddr,
}

impl Replica {
    async fn agents(&self) -> Vec<String> {
        let Ok((200, body)) = testenv::net::http_get(self.process.admin, "/status").await else {
            return Vec::new();
        };
        let report: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        report["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["cluster"].as_str().map(String::from))
            .collect()
    }

    async fn leads(&self) -> bool {
        self.process.metric("argocd_pull_hub_leader").await == 1.0
    }
}

/// A failover: how long until the agents were back and in sync, the hub
/// copies right, and (for the leader) another replica led.
struct Failover {
    moved: usize,
    in_sync: Duration,
    exact: Duration,
    led: Option<Duration>,
}

struct Figures {
    first_in_sync: Duration,
    first_copies: Duration,
    /// Per replica after the first start: agents, VmRSS and VmHWM (KiB).
    per_replica: Vec<(usize, Option<u64>, Option<u64>)>,
    serving: Failover,
    leader: Failover,
    /// The highest VmHWM of any replica over the run.
    peak_any: Option<u64>,
    /// Replicas that ended on their own (restarted, as a kubelet would).
    exits: usize,
    /// Leader terms that ended with the Lease lost (the leader stepped
    /// down), over every replica of the run.
    terms_lost: f64,
    end: End,
}

pub async fn run(args: FleetHaArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let (n, per, r) = (args.agents, args.apps_per_agent, args.replicas);
    if r < 2 {
        bail!("--replicas must be at least 2 (one is killed)");
    }
    let total = n * per;
    let mut version = String::new();
    let runs = report::each_round("fleet-ha", repeat, async |round| {
        one_run(&args, hub_bin, round, &mut version).await
    })
    .await;
    let of = |f: &dyn Fn(&Figures) -> Option<f64>| report::per_run(&runs, f);
    let secs = |f: fn(&Figures) -> Duration| of(&|x| Some(f(x).as_secs_f64()));
    let mut rows = vec![
        Row::new(
            "first start: every agent connected and in sync",
            secs(|f| f.first_in_sync),
            report::secs,
        ),
        Row::new(
            "first start: every hub copy carries its agent's status",
            secs(|f| f.first_copies),
            report::secs,
        ),
    ];
    for i in 0..r {
        rows.push(Row::new(
            format!("replica {i}: agents connected to it (steady state)"),
            of(&|f| f.per_replica.get(i).map(|p| p.0 as f64)),
            report::count,
        ));
        rows.push(Row::new(
            format!("replica {i}: RSS in steady state (VmRSS)"),
            of(&|f| f.per_replica.get(i).and_then(|p| p.1).map(|k| k as f64)),
            report::mib,
        ));
        rows.push(Row::new(
            format!("replica {i}: peak RSS (VmHWM), first start and steady state"),
            of(&|f| f.per_replica.get(i).and_then(|p| p.2).map(|k| k as f64)),
            report::mib,
        ));
    }
    for (what, pick) in [
        (
            "a serving replica killed",
            (|f: &Figures| &f.serving) as fn(&Figures) -> &Failover,
        ),
        ("the leader killed", |f: &Figures| &f.leader),
    ] {
        rows.push(Row::new(
            format!("{what}: its agents"),
            of(&|f| Some(pick(f).moved as f64)),
            report::count,
        ));
        rows.push(Row::new(
            format!("{what}: every agent connected elsewhere and in sync"),
            of(&|f| Some(pick(f).in_sync.as_secs_f64())),
            report::secs,
        ));
        rows.push(
            Row::new(
                format!("{what}: every hub copy exact again (the erased statuses rewritten)"),
                of(&|f| Some(pick(f).exact.as_secs_f64())),
                report::secs,
            )
            .target("< 15 s", |v| v < 15.0),
        );
    }
    rows.push(Row::new(
        "the leader killed: another replica leads",
        of(&|f| f.leader.led.map(|d| d.as_secs_f64())),
        report::secs,
    ));
    rows.push(Row::new(
        "peak RSS of any replica over the run (VmHWM)",
        of(&|f| f.peak_any.map(|k| k as f64)),
        report::mib,
    ));
    rows.push(
        Row::new(
            "replicas that exited on their own (restarted as a kubelet would)",
            of(&|f| Some(f.exits as f64)),
            report::count,
        )
        .target("0", |v| v == 0.0),
    );
    rows.push(Row::new(
        "leader terms ended by a lost Lease (stepped down, kept serving)",
        of(&|f| Some(f.terms_lost)),
        report::count,
    ));
    rows.extend(end_rows(&runs, |f| &f.end, "the replicas count", n, total));
    rows.extend(log_rows(&runs, |f| &f.end, "the replicas' logs"));
    print_runs(
        &format!(
            "gRPC transport, fleet with {r} replicas: {n} simulated agents x {per} Applications = {total} on one hub (kube-apiserver {version}); failover times from the kill; {repeat} run(s), each on a fresh hub API server"
        ),
        &rows,
    );
    check_runs(&runs, "fleet-ha", |f| &f.end, n, total)
}

const TERMS_LOST: &str = "argocd_pull_hub_leader_terms_lost_total";

/// The replica that leads, once one does (a leader that stepped down
/// stands again: there may be a moment with none).
async fn leader(replicas: &[Replica], timeout: Duration) -> Result<usize> {
    let since = Instant::now();
    while since.elapsed() < timeout {
        for (i, rep) in replicas.iter().enumerate() {
            if rep.leads().await {
                return Ok(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("no replica leads")
}

/// Replaces every replica that ended on its own with a new one, as the
/// kubelet would restart it; returns how many there were.
async fn restart_exited(
    replicas: &mut [Replica],
    start: &mut dyn FnMut() -> Result<Replica>,
    timeout: Duration,
) -> Result<usize> {
    let mut restarted = 0;
    for rep in replicas.iter_mut() {
        if rep.process.exited() {
            eprintln!(
                "bench-grpc fleet-ha: {} exited on its own; starting another as a kubelet would",
                rep.name
            );
            *rep = start()?;
            rep.process.ready(timeout).await?;
            restarted += 1;
        }
    }
    Ok(restarted)
}

/// Every agent connected (on any stream since `epoch`) and in sync, and
/// every copy right since `since` or later; returns when both first held.
async fn wait_exact(
    what: &str,
    fleet: &LoadGenerator,
    copies: &std::sync::Arc<std::sync::Mutex<crate::fleet::Copies>>,
    per: usize,
    since: Instant,
    timeout: Duration,
) -> Result<(Duration, Duration)> {
    let mut in_sync_at = None;
    let mut last_print = Instant::now();
    loop {
        let progress = fleet.progress();
        let n = progress.len();
        let in_sync = progress
            .iter()
            .filter(|p| p.in_sync_at.is_some() && p.apps == per)
            .count();
        if in_sync == n && in_sync_at.is_none() {
            in_sync_at = Some(since.elapsed());
        }
        let (matching, all_since) = {
            let c = copies.lock().expect("never poisoned");
            (c.matching.len(), c.all_since)
        };
        if let (Some(s), Some(all)) = (in_sync_at, all_since)
            && in_sync == n
        {
            return Ok((s, all.saturating_duration_since(since)));
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            last_print = Instant::now();
            eprintln!(
                "bench-grpc fleet-ha: {what}, {:.0} s: {in_sync}/{n} agents in sync, {matching} hub copies carry their status",
                since.elapsed().as_secs_f64()
            );
        }
        if since.elapsed() > timeout {
            bail!(
                "{what}: not exact after {timeout:?}: {in_sync}/{n} in sync, {matching} copies right"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Erases the status of the first `per` hub copies of each of `clusters`
/// (Argo CD's Application has no status subresource: a plain patch).
async fn erase_status(
    client: &kube::Client,
    clusters: &[String],
    per: usize,
    concurrency: usize,
) -> Result<()> {
    let api: Api<Application> = Api::namespaced_with(client.clone(), NS, &application_resource());
    let names: Vec<String> = clusters
        .iter()
        .flat_map(|c| (0..per).map(move |i| app_name(c, i)))
        .collect();
    futures::stream::iter(names.iter())
        .map(|name| {
            let api = api.clone();
            async move {
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "status": null })),
                )
                .await
                .map(|_| ())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .context("erasing the hub copies' status")?;
    Ok(())
}

async fn one_run(
    args: &FleetHaArgs,
    hub_bin: &Path,
    round: usize,
    version: &mut String,
) -> Result<Figures> {
    let (n, per) = (args.agents, args.apps_per_agent);
    let timeout = Duration::from_secs(args.timeout_secs);
    eprintln!(
        "bench-grpc fleet-ha: starting a hub API server for {n} clusters x {per} Applications"
    );
    let hub = Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)).await?;
    *version = hub.version().to_string();
    let client = hub.client().await?;
    for ns in [NS, "argocd", "argocd-pull"] {
        hub.ensure_namespace(ns).await?;
    }
    let clusters = join_clusters(&client, n, args.concurrency).await?;
    let apps = create_apps(&client, &clusters, per, args.concurrency).await?;
    eprintln!(
        "bench-grpc fleet-ha: {n} clusters and {} Applications created",
        apps.len()
    );

    let pki = Pki::new()?;
    let service = Balancer::start().await?;
    let fleet = LoadGenerator::for_clusters(
        &pki,
        &clusters,
        &service.address(),
        AGENT_NAME,
        (args.reconnect_min, args.reconnect_max),
    )?;
    let copies = watch_copies(client.clone(), apps.len());
    let logs = testenv::paths::run_dir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;
    let allowed = [format!("{NS}=*")];
    let mut started = 0usize;
    let mut all_logs = Vec::new();
    let mut start = |all_logs: &mut Vec<PathBuf>| -> Result<Replica> {
        let grpc = testenv::net::free_addr()?;
        let name = format!("hub-{started}");
        let log = logs.join(format!("grpc-fleet-ha-run{round}-{name}.log"));
        let _ = std::fs::remove_file(&log);
        started += 1;
        all_logs.push(log.clone());
        let process = HubProcess::start_replica(
            &HubOptions {
                bin: hub_bin,
                hub: &hub,
                pki: &pki,
                grpc_addr: grpc,
                allowed_targets: &allowed,
                log: Some(log.clone()),
                max_connections: None,
                extra_args: &[],
            },
            &name,
        )?;
        Ok(Replica {
            name,
            process,
            grpc,
        })
    };
    let mut replicas = Vec::new();
    for _ in 0..args.replicas {
        replicas.push(start(&mut all_logs)?);
    }
    let mut exits = 0;
    let mut terms_lost = 0.0;
    for rep in &mut replicas {
        rep.process.ready(timeout).await?;
    }
    service.set(&replicas.iter().map(|x| x.grpc).collect::<Vec<_>>());
    eprintln!(
        "bench-grpc fleet-ha: {} replicas Ready; starting {n} simulated agents",
        replicas.len()
    );
    let epoch = fleet.new_epoch();
    fleet.start();
    let (first_in_sync, first_copies) =
        wait_exact("first start", &fleet, &copies, per, epoch, timeout).await?;
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let mut per_replica = Vec::new();
    for rep in &replicas {
        per_replica.push((
            rep.agents().await.len(),
            rep.process.memory_kib("VmRSS"),
            rep.process.memory_kib("VmHWM"),
        ));
    }
    eprintln!("bench-grpc fleet-ha: steady state: {per_replica:?} (agents, VmRSS KiB, VmHWM KiB)");
    let mut peak_any = per_replica.iter().filter_map(|p| p.2).max();

    let mut results = Vec::new();
    for kill_leader in [false, true] {
        exits += restart_exited(&mut replicas, &mut || start(&mut all_logs), timeout).await?;
        service.set(&replicas.iter().map(|x| x.grpc).collect::<Vec<_>>());
        let lead = leader(&replicas, timeout).await?;
        let mut on = BTreeMap::new();
        for (i, rep) in replicas.iter().enumerate() {
            on.insert(i, rep.agents().await);
        }
        let victim = if kill_leader {
            lead
        } else {
            *on.iter()
                .filter(|(i, _)| **i != lead)
                .max_by_key(|(_, a)| a.len())
                .map(|(i, _)| i)
                .context("no other replica")?
        };
        let moved = on[&victim].clone();
        let mut dead = replicas.remove(victim);
        for rep in &replicas {
            peak_any = peak_any.max(rep.process.memory_kib("VmHWM"));
        }
        peak_any = peak_any.max(dead.process.memory_kib("VmHWM"));
        eprintln!(
            "bench-grpc fleet-ha: killing {} ({}, {} agents)",
            dead.name,
            if kill_leader { "the leader" } else { "serving" },
            moved.len()
        );
        terms_lost += dead.process.metric(TERMS_LOST).await;
        let since = Instant::now();
        dead.process.kill().await?;
        service.set(&replicas.iter().map(|x| x.grpc).collect::<Vec<_>>());
        erase_status(
            &client,
            &moved,
            args.erase_per_cluster.min(per),
            args.concurrency,
        )
        .await?;
        let leading = async {
            if !kill_leader {
                return Ok(None);
            }
            while since.elapsed() < timeout {
                for rep in &replicas {
                    if rep.leads().await {
                        return Ok(Some(since.elapsed()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            bail!("no replica took the lead")
        };
        let what = if kill_leader {
            "leader killed"
        } else {
            "serving replica killed"
        };
        let (led, exact) = tokio::join!(
            leading,
            wait_exact(what, &fleet, &copies, per, since, timeout)
        );
        let (led, (in_sync, exact)) = (led?, exact?);
        eprintln!(
            "bench-grpc fleet-ha: {what}: in sync after {:.1} s, exact after {:.1} s{}",
            in_sync.as_secs_f64(),
            exact.as_secs_f64(),
            led.map(|d| format!(", led after {:.1} s", d.as_secs_f64()))
                .unwrap_or_default()
        );
        results.push(Failover {
            moved: moved.len(),
            in_sync,
            exact,
            led,
        });
        let mut fresh = start(&mut all_logs)?;
        fresh.process.ready(timeout).await?;
        replicas.push(fresh);
        service.set(&replicas.iter().map(|x| x.grpc).collect::<Vec<_>>());
    }
    exits += restart_exited(&mut replicas, &mut || start(&mut all_logs), timeout).await?;
    service.set(&replicas.iter().map(|x| x.grpc).collect::<Vec<_>>());
    let mut connected = 0.0;
    let mut pending = 0.0;
    for rep in &replicas {
        terms_lost += rep.process.metric(TERMS_LOST).await;
        connected += rep
            .process
            .metric("argocd_pull_hub_grpc_agents_connected")
            .await;
        pending += rep
            .process
            .metric("argocd_pull_hub_grpc_pending_objects")
            .await;
        peak_any = peak_any.max(rep.process.memory_kib("VmHWM"));
    }
    let matching = copies.lock().expect("never poisoned").matching.len();
    fleet.stop();
    for rep in &mut replicas {
        rep.process.terminate(Duration::from_secs(60)).await?;
    }
    let leader = results.pop().context("two failovers")?;
    let serving = results.pop().context("two failovers")?;
    Ok(Figures {
        first_in_sync,
        first_copies,
        per_replica,
        serving,
        leader,
        peak_any,
        exits,
        terms_lost,
        end: End::new(matching, connected, pending, all_logs),
    })
}
