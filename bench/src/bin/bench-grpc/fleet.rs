//! The fleet part of `bench-grpc`: one real hub API server with `--agents`
//! ManagedClusters (each with the `argocd-pull` ManagedClusterAddOn, so the
//! hub delivers over gRPC) and `--apps-per-agent` pull-model Applications
//! each; the release hub-controller; and the fleet load generator playing
//! every cluster's agent (`fleet_load_generator.rs`).
//!
//! 1. First start: the hub-controller and the load generator start together;
//!    timed until every agent is connected, holds its Applications, both
//!    digests agree, and every hub copy carries the status its agent sent.
//! 2. Steady state for `--steady-secs` (heartbeats only); then the hub's
//!    peak resident memory (VmHWM) covers connect, delivery and steady state.
//! 3. The hub is killed (SIGKILL) and started again; timed until every agent
//!    has reconnected and resynced (both digests agree again).
//! 4. After another steady state, the hub is stopped (SIGTERM), waited for,
//!    and started again; timed the same way.
//! 5. Every hub copy must still carry its agent's status, and the hub must
//!    count every agent connected with nothing pending.
//!
//! With `--repeat N` all of it runs N times, each on a fresh hub API server.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use testenv::{Cluster, ClusterConfig, CrdSet};
use tokio::time::Instant;

use crate::fleet_load_generator::{LoadGenerator, carries_its_status};
use crate::hub::{self, HubOptions, HubProcess};
use crate::report::{self, Row, print_runs};

#[derive(clap::Args, Clone, Debug)]
pub struct FleetArgs {
    /// Simulated agents, one per managed cluster.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Applications per managed cluster.
    #[arg(long, default_value_t = 10)]
    pub apps_per_agent: usize,
    /// Seconds of steady state before each restart (over 30, so that every
    /// agent's connection counts as healthy and its backoff starts afresh,
    /// as after any long-lived connection).
    #[arg(long, default_value_t = 40)]
    pub steady_secs: u64,
    /// Creates in flight while setting up the hub.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 1200)]
    pub timeout_secs: u64,
    /// Shortest reconnect delay of the agents (the spoke-agent's default).
    #[arg(long, default_value = "500ms", value_parser = argocd_pull_spoke_agent::parse_duration)]
    reconnect_min: Duration,
    /// Longest reconnect delay of the agents (the spoke-agent's default).
    #[arg(long, default_value = "30s", value_parser = argocd_pull_spoke_agent::parse_duration)]
    reconnect_max: Duration,
    /// Also serve the hub's live views (capability `live-views`): the hub
    /// with its live endpoint, every agent answering reads with what the
    /// hub's own API server answers; after the first steady state, every
    /// cluster read once as argocd-server reads a resource (discovery,
    /// then the object), and the hub's memory measured again.
    #[arg(long)]
    pub live: bool,
    /// Ends each run after the first steady state (no restarts): what
    /// `conn-cost` needs of a run.
    #[arg(skip)]
    pub first_start_only: bool,
}

/// The paths of one live read of each cluster, in the order argocd-server
/// asks them (discovery, then the object).
const LIVE_PATHS: [&str; 3] = [
    "/api",
    "/apis",
    "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
];

/// What `--live` measured.
pub struct LiveFigures {
    /// The hub's VmRSS after every cluster was read (KiB).
    pub rss: Option<u64>,
    /// How long the reads of every cluster took.
    pub took: Duration,
    /// Reads answered 200, of [`LIVE_PATHS`] for every cluster.
    pub ok: usize,
}

/// Namespace of the hub Applications.
pub const NS: &str = "fleet";
/// The `agent` part of the simulated agents' certificate subjects.
pub const AGENT_NAME: &str = "fleet-load-generator";
const PEAK_RSS_TARGET_MIB: f64 = 512.0;
const RESYNC_TARGET: Duration = Duration::from_secs(60);

/// `--grpc-max-connections` for a fleet of `agents`: the hub's default
/// (4096) unless the fleet needs more, then twice the agents, the room
/// docs/security.md asks for (a closing connection holds its place until
/// it is gone, so a mass reconnection briefly needs more than one each).
pub fn fleet_connections(agents: usize) -> Option<usize> {
    (agents * 2 > 4096).then_some(agents * 2)
}

/// Which hub Applications carry the status their agent sent, from a watch.
#[derive(Default)]
pub struct Copies {
    pub matching: HashSet<String>,
    /// Since when every one of them does.
    pub all_since: Option<Instant>,
    /// When half of them first did.
    pub half_since: Option<Instant>,
    /// Writes to hub Applications seen (watch events after the first list).
    pub writes: u64,
}

/// Watches the hub Applications and keeps [`Copies`] current.
pub fn watch_copies(client: kube::Client, total: usize) -> Arc<Mutex<Copies>> {
    let api: Api<Application> = Api::namespaced_with(client, NS, &application_resource());
    watch_copies_by(
        api,
        watcher::Config::default().labels(keys::PULL_LABEL),
        total,
        carries_its_status,
    )
}

/// Watches the Applications of `api` selected by `config` and keeps
/// [`Copies`] current, `ok` telling whether one carries the status its
/// agent sent (names are unique across namespaces).
pub fn watch_copies_by(
    api: Api<Application>,
    config: watcher::Config,
    total: usize,
    ok: impl Fn(&Application) -> bool + Send + 'static,
) -> Arc<Mutex<Copies>> {
    let copies = Arc::new(Mutex::new(Copies::default()));
    let shared = copies.clone();
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let (app, initial) = match event {
                Ok(watcher::Event::Apply(a)) => (a, false),
                Ok(watcher::Event::InitApply(a)) => (a, true),
                _ => continue,
            };
            let is_ok = ok(&app);
            let name = app.name_any();
            let mut c = shared.lock().expect("never poisoned");
            if !initial {
                c.writes += 1;
            }
            if is_ok {
                c.matching.insert(name);
            } else {
                c.matching.remove(&name);
            }
            if c.matching.len() * 2 >= total {
                c.half_since.get_or_insert_with(Instant::now);
            }
            if c.matching.len() == total {
                c.all_since.get_or_insert_with(Instant::now);
            } else {
                c.all_since = None;
            }
        }
    });
    copies
}

/// Counts the writes of the hub's record of what each agent holds (its
/// Leases labelled `argocd-pull.io/agent-holds`, one per cluster), after
/// the watch's first list.
pub fn count_holder_writes(client: kube::Client) -> Arc<std::sync::atomic::AtomicU64> {
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let shared = count.clone();
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client, hub::CONTROLLER_NS);
    tokio::spawn(async move {
        let config = watcher::Config::default().labels("argocd-pull.io/agent-holds");
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(_)) = event {
                shared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    count
}

/// What one phase measured, from the start of the hub process.
#[derive(Default)]
pub struct Phase {
    pub ready: Duration,
    pub connected: Duration,
    pub in_sync: Duration,
    pub copies: Option<Duration>,
    /// Until half of the hub copies first carried their status.
    pub half_copies: Option<Duration>,
}

/// What one run measured (the memory figures in KiB).
pub struct Figures {
    pub joined: Duration,
    pub created: Duration,
    pub first: Phase,
    pub first_writes: f64,
    /// Writes to hub Applications seen during the first start.
    pub first_app_writes: u64,
    /// Writes of the record of what the agents hold, per phase: the first
    /// start, after the SIGKILL, after the SIGTERM.
    pub holder_writes: [u64; 3],
    pub steady_rss: Option<u64>,
    /// The hub's CPU time from its start to the end of the steady state.
    pub steady_cpu: Option<Duration>,
    pub peak1: Option<u64>,
    pub steady_connected: f64,
    pub killed: Phase,
    pub killed_status_writes: f64,
    pub killed_app_writes: u64,
    /// The same, to the end of the steady state after the restart.
    pub killed_app_writes_steady: u64,
    pub peak2: Option<u64>,
    pub stopped_in: Duration,
    pub termed: Phase,
    pub termed_status_writes: f64,
    pub termed_app_writes: u64,
    pub peak3: Option<u64>,
    pub failed_attempts: u64,
    pub end: End,
    pub live: Option<LiveFigures>,
}

/// How a fleet run ended, as `fleet` and `fleet-ha` check it.
pub struct End {
    /// Hub copies carrying their agent's status.
    pub matching: usize,
    /// Agents the hub counts connected.
    pub connected: f64,
    /// Objects pending.
    pub pending: f64,
    /// The hub's logs, and their WARN and ERROR lines.
    pub logs: Vec<PathBuf>,
    pub warns: usize,
    pub errors: usize,
}

impl End {
    pub fn new(matching: usize, connected: f64, pending: f64, logs: Vec<PathBuf>) -> Self {
        Self {
            matching,
            connected,
            pending,
            warns: log_lines(&logs, "WARN"),
            errors: log_lines(&logs, "ERROR"),
            logs,
        }
    }

    /// Every hub copy carries its agent's status, every one of `n` agents
    /// is connected and nothing is pending.
    fn in_sync(&self, n: usize, total: usize) -> bool {
        self.matching == total && self.connected as usize == n && self.pending == 0.0
    }
}

/// The rows of how the runs ended, with their targets: every one of the
/// `total` hub copies carries its agent's status, every one of `n` agents
/// is connected as `who` counts them, nothing is pending.
pub fn end_rows<F>(
    runs: &[Result<F>],
    end: fn(&F) -> &End,
    who: &str,
    n: usize,
    total: usize,
) -> [Row; 3] {
    let of = |v: fn(&End) -> f64| report::per_run(runs, move |f| Some(v(end(f))));
    [
        Row::new(
            "at the end: hub copies carrying their agent's status",
            of(|e| e.matching as f64),
            report::count,
        )
        .target(format!("all ({total})"), move |v| v == total as f64),
        Row::new(
            format!("at the end: agents {who} connected"),
            of(|e| e.connected),
            report::count,
        )
        .target(format!("{n}"), move |v| v == n as f64),
        Row::new(
            "at the end: objects pending",
            of(|e| e.pending),
            report::count,
        )
        .target("0", |v| v == 0.0),
    ]
}

/// The WARN and ERROR lines in the runs' logs (`whose`: the hub's, ...).
pub fn log_rows<F>(runs: &[Result<F>], end: fn(&F) -> &End, whose: &str) -> [Row; 2] {
    let of = |v: fn(&End) -> usize| report::per_run(runs, move |f| Some(v(end(f)) as f64));
    [
        Row::new(
            format!("WARN lines in {whose}"),
            of(|e| e.warns),
            report::count,
        ),
        Row::new(
            format!("ERROR lines in {whose}"),
            of(|e| e.errors),
            report::count,
        ),
    ]
}

/// Runs the fleet `repeat` times, each on a fresh hub API server, and
/// prints every figure over the runs.
pub async fn run(args: FleetArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let (n, per) = (args.agents, args.apps_per_agent);
    let total = n * per;
    let mut version = String::new();
    let runs = report::each_round("fleet", repeat, async |round| {
        one_run(&args, hub_bin, round, &mut version).await
    })
    .await;
    let of = |f: &dyn Fn(&Figures) -> Option<f64>| report::per_run(&runs, f);
    let time = |f: fn(&Figures) -> Duration| of(&|r| Some(f(r).as_secs_f64()));
    let kib = |f: fn(&Figures) -> Option<u64>| of(&|r| f(r).map(|k| k as f64));
    let num = |f: fn(&Figures) -> f64| of(&|r| Some(f(r)));
    let under_rss = |v: f64| v / 1024.0 < PEAK_RSS_TARGET_MIB;
    let rss_target = format!("< {PEAK_RSS_TARGET_MIB:.0} MiB");
    let resync_target = format!("< {} s", RESYNC_TARGET.as_secs());
    let two = |v: f64| format!("{v:.2}");
    let steady = args.steady_secs;
    let mut rows = vec![
        Row::new(
            format!(
                "set-up (the benchmark, not timed against the hub): {n} ManagedClusters, namespaces and ManagedClusterAddOns created"
            ),
            time(|f| f.joined),
            report::secs,
        ),
        Row::new(
            format!(
                "set-up (the benchmark, not timed against the hub): {total} Applications created"
            ),
            time(|f| f.created),
            report::secs,
        ),
        Row::new(
            format!("hub peak RSS (VmHWM): first start, delivery, {steady} s steady"),
            kib(|f| f.peak1),
            report::mib,
        )
        .target(rss_target.clone(), under_rss),
        Row::new(
            "hub RSS in steady state (VmRSS)",
            kib(|f| f.steady_rss),
            report::mib,
        ),
        Row::new(
            format!("hub peak RSS after the SIGKILL restart (resync and {steady} s steady)"),
            kib(|f| f.peak2),
            report::mib,
        )
        .target(rss_target.clone(), under_rss),
        Row::new(
            "hub peak RSS after the SIGTERM restart",
            kib(|f| f.peak3),
            report::mib,
        )
        .target(rss_target, under_rss),
    ];
    let phase_rows = |what: &str, p: fn(&Figures) -> &Phase, restart: bool| {
        let mut rows = vec![
            Row::new(
                format!("{what}: hub ready (caches synced)"),
                of(&|f| Some(p(f).ready.as_secs_f64())),
                report::secs,
            ),
            Row::new(
                format!("{what}: every agent connected"),
                of(&|f| Some(p(f).connected.as_secs_f64())),
                report::secs,
            ),
        ];
        let in_sync = of(&|f| Some(p(f).in_sync.as_secs_f64()));
        rows.push(if restart {
            Row::new(
                format!("{what}: every agent reconnected and resynced (both digests agree)"),
                in_sync,
                report::secs,
            )
            .target(resync_target.clone(), |v| v < RESYNC_TARGET.as_secs_f64())
        } else {
            Row::new(
                format!("{what}: every agent holds its {per} Applications and both digests agree"),
                in_sync,
                report::secs,
            )
        });
        let half = of(&|f| p(f).half_copies.map(|d| d.as_secs_f64()));
        if !restart && half.iter().any(Option::is_some) {
            rows.push(Row::new(
                format!("{what}: half of the hub copies carry the status their agent sent"),
                half,
                report::secs,
            ));
        }
        let copies = of(&|f| p(f).copies.map(|d| d.as_secs_f64()));
        if copies.iter().any(Option::is_some) {
            rows.push(Row::new(
                format!("{what}: every hub copy carries the status its agent sent"),
                copies,
                report::secs,
            ));
        }
        rows
    };
    if args.live {
        rows.push(Row::new(
            format!(
                "live views: every cluster read once (discovery and an object, {} reads)",
                n * LIVE_PATHS.len()
            ),
            of(&|f| f.live.as_ref().map(|l| l.took.as_secs_f64())),
            report::secs,
        ));
        rows.push(Row::new(
            format!(
                "live views: reads answered 200 (of {})",
                n * LIVE_PATHS.len()
            ),
            of(&|f| f.live.as_ref().map(|l| l.ok as f64)),
            report::count,
        ));
        rows.push(Row::new(
            "live views: hub RSS after reading every cluster (VmRSS)",
            of(&|f| f.live.as_ref().and_then(|l| l.rss).map(|k| k as f64)),
            report::mib,
        ));
        rows.push(Row::new(
            "live views: hub RSS added per cluster by reading it (KiB)",
            of(&|f| {
                let after = f.live.as_ref()?.rss? as f64;
                Some((after - f.steady_rss? as f64) / n as f64)
            }),
            |v| format!("{v:.1}"),
        ));
    }
    rows.extend(phase_rows("first start", |f| &f.first, false));
    rows.push(Row::new(
        "first start: status writes to hub Applications",
        num(|f| f.first_writes),
        report::count,
    ));
    rows.push(Row::new(
        "first start: status writes per Application",
        of(&|f| Some(f.first_writes / total as f64)),
        two,
    ));
    rows.push(Row::new(
        "first start: writes of the record of what agents hold (Leases), to the end of the steady state",
        num(|f| f.holder_writes[0] as f64),
        report::count,
    ));
    rows.extend(phase_rows("SIGKILL, start", |f| &f.killed, true));
    rows.push(Row::new(
        "SIGKILL, start: status writes by the new hub",
        num(|f| f.killed_status_writes),
        report::count,
    ));
    rows.push(Row::new(
        "SIGKILL, start: writes to hub Applications seen",
        num(|f| f.killed_app_writes as f64),
        report::count,
    ));
    rows.push(Row::new(
        "SIGKILL, start: writes of the record of what agents hold",
        num(|f| f.holder_writes[1] as f64),
        report::count,
    ));
    rows.push(Row::new(
        "SIGTERM: the hub stopped in",
        time(|f| f.stopped_in),
        report::secs,
    ));
    rows.extend(phase_rows("SIGTERM, start", |f| &f.termed, true));
    rows.push(Row::new(
        "SIGTERM, start: status writes by the new hub",
        num(|f| f.termed_status_writes),
        report::count,
    ));
    rows.push(Row::new(
        "SIGTERM, start: writes to hub Applications seen",
        num(|f| f.termed_app_writes as f64),
        report::count,
    ));
    rows.push(Row::new(
        "SIGTERM, start: writes of the record of what agents hold",
        num(|f| f.holder_writes[2] as f64),
        report::count,
    ));
    rows.extend(end_rows(&runs, |f| &f.end, "the hub counts", n, total));
    rows.push(
        Row::new(
            "steady state: agents the hub counted connected",
            num(|f| f.steady_connected),
            report::count,
        )
        .target(format!("{n}"), move |v| v == n as f64),
    );
    rows.push(Row::new(
        "connection attempts of the agents that failed or ended (all phases)",
        num(|f| f.failed_attempts as f64),
        report::count,
    ));
    rows.extend(log_rows(
        &runs,
        |f| &f.end,
        "the hub's logs (three processes)",
    ));
    print_runs(
        &format!(
            "gRPC transport, fleet: {n} simulated agents (fleet load generator, one process) x {per} Applications = {total} on one hub (kube-apiserver {version}); times from the start of the hub-controller process; {repeat} run(s), each on a fresh hub API server"
        ),
        &rows,
    );
    check_runs(&runs, "fleet", |f| &f.end, n, total)
}

/// Prints each run's hub logs, and whether it failed or did not end in sync
/// (`end`: how a run ended; `n` agents, `total` Applications); an error if
/// any.
pub fn check_runs<F>(
    runs: &[Result<F>],
    what: &str,
    end: fn(&F) -> &End,
    n: usize,
    total: usize,
) -> Result<()> {
    println!();
    let mut failed = false;
    for (i, r) in runs.iter().enumerate() {
        match r {
            Ok(f) => {
                let end = end(f);
                let logs: Vec<String> = end.logs.iter().map(|p| p.display().to_string()).collect();
                println!("run {}: hub logs: {}", i + 1, logs.join(", "));
                if !end.in_sync(n, total) {
                    println!("run {}: the fleet did not end in sync with the hub", i + 1);
                    failed = true;
                }
            }
            Err(e) => {
                println!("run {}: {e:#}", i + 1);
                failed = true;
            }
        }
    }
    if failed {
        bail!("a {what} run failed or did not end in sync with the hub");
    }
    Ok(())
}

/// The name of cluster `cluster`'s `i`th Application.
pub fn app_name(cluster: &str, i: usize) -> String {
    format!("{cluster}-app-{i:02}")
}

/// `n` ManagedClusters with the addon (`cluster-0001`...), joined
/// `concurrency` at a time; their names.
pub async fn join_clusters(
    client: &kube::Client,
    n: usize,
    concurrency: usize,
) -> Result<Vec<String>> {
    let clusters: Vec<String> = (1..=n).map(|i| format!("cluster-{i:04}")).collect();
    futures::stream::iter(clusters.iter())
        .map(|c| hub::join(client, c))
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .context("joining the clusters")?;
    Ok(clusters)
}

/// `per` pull-model Applications for each of `clusters` in [`NS`]; their
/// (cluster, name) pairs.
pub async fn create_apps(
    client: &kube::Client,
    clusters: &[String],
    per: usize,
    concurrency: usize,
) -> Result<Vec<(String, String)>> {
    let apps: Vec<(String, String)> = clusters
        .iter()
        .flat_map(|c| (0..per).map(move |i| (c.clone(), app_name(c, i))))
        .collect();
    futures::stream::iter(apps.iter())
        .map(|(c, name)| hub::create(client, hub::application(NS, name, c), "applications"))
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .context("creating the Applications")?;
    Ok(apps)
}

/// Lines at `level` (`WARN`, `ERROR`) in the logs `paths`.
pub fn log_lines(paths: &[std::path::PathBuf], level: &str) -> usize {
    paths
        .iter()
        .map(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(&format!(" {level} ")))
                .count()
        })
        .sum()
}

/// One run on a fresh hub API server (see the module documentation).
pub async fn one_run(
    args: &FleetArgs,
    hub_bin: &Path,
    round: usize,
    version: &mut String,
) -> Result<Figures> {
    let n = args.agents;
    let per = args.apps_per_agent;
    let timeout = Duration::from_secs(args.timeout_secs);
    eprintln!("bench-grpc fleet: starting a hub API server for {n} clusters x {per} Applications");
    let hub = Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)).await?;
    *version = hub.version().to_string();
    let client = hub.client().await?;
    hub.ensure_namespace(NS).await?;
    // The hub's Argo CD namespace: the hub-controller keeps a cluster
    // Secret per ManagedCluster there.
    hub.ensure_namespace("argocd").await?;
    hub.ensure_namespace(hub::CONTROLLER_NS).await?;

    // ---------------------------------------------------------------- set-up
    let setup = Instant::now();
    let clusters = join_clusters(&client, n, args.concurrency).await?;
    let joined = setup.elapsed();
    eprintln!(
        "bench-grpc fleet: {n} ManagedClusters with the addon in {:.1} s; creating {} Applications",
        joined.as_secs_f64(),
        n * per
    );
    let apps = create_apps(&client, &clusters, per, args.concurrency).await?;
    let created = setup.elapsed() - joined;
    eprintln!(
        "bench-grpc fleet: {} Applications in {:.1} s",
        apps.len(),
        created.as_secs_f64()
    );

    let (pki, grpc_addr, fleet) = LoadGenerator::on_loopback(
        &clusters,
        AGENT_NAME,
        (args.reconnect_min, args.reconnect_max),
    )?;
    let copies = watch_copies(client.clone(), apps.len());
    let holder_writes = count_holder_writes(client.clone());
    let holders_now = || holder_writes.load(std::sync::atomic::Ordering::Relaxed);
    let logs = testenv::paths::run_dir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;
    let log = |i: usize| logs.join(format!("grpc-fleet-run{round}-hub-{i}.log"));
    for i in 1..=3 {
        let _ = std::fs::remove_file(log(i));
    }
    let live_dir = tempfile::tempdir()?;
    let live = if args.live {
        let (flags, url) = hub::live_endpoint(live_dir.path(), &pki)?;
        fleet.serve_live(std::sync::Arc::new(live_answers(&client).await?));
        Some((flags, hub::live_client(&pki, &url)?))
    } else {
        None
    };
    let live_flags = live.as_ref().map(|(f, _)| f.clone()).unwrap_or_default();
    let allowed = [format!("{NS}=*")];
    let options = |log: &Path| HubOptions {
        bin: hub_bin,
        hub: &hub,
        pki: &pki,
        grpc_addr,
        allowed_targets: &allowed,
        log: Some(log.to_path_buf()),
        max_connections: fleet_connections(args.agents),
        extra_args: &live_flags,
    };

    // ----------------------------------------------------------- first start
    eprintln!(
        "bench-grpc fleet: starting the hub-controller and the fleet load generator ({n} simulated agents)"
    );
    let log1 = log(1);
    let epoch = fleet.new_epoch();
    let mut hub1 = HubProcess::start(&options(&log1))?;
    fleet.start();
    let first = phase(
        "first start",
        &fleet,
        &mut hub1,
        epoch,
        Some(&copies),
        per,
        timeout,
    )
    .await?;
    let first_writes = hub1
        .metric("argocd_pull_hub_grpc_status_writes_total")
        .await;
    let first_app_writes = copies.lock().expect("never poisoned").writes;
    eprintln!("bench-grpc fleet: steady state for {} s", args.steady_secs);
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let holders_first = holders_now();
    let steady_rss = hub1.memory_kib("VmRSS");
    let steady_cpu = testenv::procfs::cpu_time(hub1.pid);
    let peak1 = hub1.memory_kib("VmHWM");
    let steady_connected = hub1.metric("argocd_pull_hub_grpc_agents_connected").await;
    let live = match &live {
        Some((_, endpoint)) => {
            eprintln!("bench-grpc fleet: reading every cluster through the live endpoint");
            let start = Instant::now();
            let (ok, reads) = read_every_cluster(endpoint, &clusters, args.concurrency).await;
            let took = start.elapsed();
            eprintln!("bench-grpc fleet: {ok} of {reads} live reads answered 200");
            Some(LiveFigures {
                rss: hub1.memory_kib("VmRSS"),
                took,
                ok,
            })
        }
        None => None,
    };
    if args.first_start_only {
        let end = crate::conn_cost::stop_after_first_start(
            &fleet,
            &mut hub1,
            &copies,
            steady_connected,
            log1,
        )
        .await?;
        return Ok(Figures {
            joined,
            created,
            first,
            first_writes,
            first_app_writes,
            holder_writes: [holders_first, 0, 0],
            steady_rss,
            steady_cpu,
            peak1,
            steady_connected,
            live,
            ..Figures::without_restarts(end, fleet.failed_attempts())
        });
    }

    // --------------------------------------------------------- SIGKILL + start
    eprintln!("bench-grpc fleet: killing the hub-controller (SIGKILL) and starting it again");
    hub1.kill().await?;
    let writes_before = copies.lock().expect("never poisoned").writes;
    let log2 = log(2);
    let epoch = fleet.new_epoch();
    let mut hub2 = HubProcess::start(&options(&log2))?;
    let killed = phase(
        "after SIGKILL",
        &fleet,
        &mut hub2,
        epoch,
        None,
        per,
        timeout,
    )
    .await?;
    let killed_status_writes = hub2
        .metric("argocd_pull_hub_grpc_status_writes_total")
        .await;
    let killed_app_writes = copies.lock().expect("never poisoned").writes - writes_before;
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let killed_app_writes_steady = copies.lock().expect("never poisoned").writes - writes_before;
    let holders_killed = holders_now() - holders_first;
    let peak2 = hub2.memory_kib("VmHWM");

    // -------------------------------------------------------- SIGTERM + start
    eprintln!("bench-grpc fleet: stopping the hub-controller (SIGTERM) and starting it again");
    let stopped_in = hub2.terminate(Duration::from_secs(60)).await?;
    let writes_before = copies.lock().expect("never poisoned").writes;
    let log3 = log(3);
    let epoch = fleet.new_epoch();
    let mut hub3 = HubProcess::start(&options(&log3))?;
    let termed = phase(
        "after SIGTERM",
        &fleet,
        &mut hub3,
        epoch,
        None,
        per,
        timeout,
    )
    .await?;
    let termed_status_writes = hub3
        .metric("argocd_pull_hub_grpc_status_writes_total")
        .await;
    let termed_app_writes = copies.lock().expect("never poisoned").writes - writes_before;
    let holders_termed = holders_now() - holders_first - holders_killed;
    let peak3 = hub3.memory_kib("VmHWM");

    // ------------------------------------------------------------------ check
    let connected = hub3.metric("argocd_pull_hub_grpc_agents_connected").await;
    let pending = hub3.metric("argocd_pull_hub_grpc_pending_objects").await;
    let matching = copies.lock().expect("never poisoned").matching.len();
    let failed_attempts = fleet.failed_attempts();
    fleet.stop();
    hub3.terminate(Duration::from_secs(60)).await?;

    Ok(Figures {
        joined,
        created,
        first,
        first_writes,
        first_app_writes,
        holder_writes: [holders_first, holders_killed, holders_termed],
        steady_rss,
        steady_cpu,
        peak1,
        steady_connected,
        killed,
        killed_status_writes,
        killed_app_writes,
        killed_app_writes_steady,
        peak2,
        stopped_in,
        termed,
        termed_status_writes,
        termed_app_writes,
        peak3,
        failed_attempts,
        end: End::new(matching, connected, pending, vec![log1, log2, log3]),
        live,
    })
}

/// What the hub's API server answers to [`LIVE_PATHS`]: the simulated
/// clusters answer the same.
async fn live_answers(client: &kube::Client) -> Result<crate::fleet_load_generator::LiveAnswers> {
    let mut answers = crate::fleet_load_generator::LiveAnswers::new();
    for path in LIVE_PATHS {
        let request = http::Request::get(path)
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())?;
        let body = client.request_text(request).await?;
        answers.insert(path.to_string(), body.into_bytes());
    }
    Ok(answers)
}

/// Every cluster read once through the live endpoint, `concurrency` at a
/// time: discovery, then the object.
async fn read_every_cluster(
    endpoint: &kube::Client,
    clusters: &[String],
    concurrency: usize,
) -> (usize, usize) {
    let results: Vec<bool> = futures::stream::iter(
        clusters
            .iter()
            .flat_map(|c| LIVE_PATHS.iter().map(move |p| format!("/clusters/{c}{p}"))),
    )
    .map(|path| async move {
        let request = http::Request::get(&path).body(Vec::new()).expect("a path");
        endpoint.request_text(request).await.is_ok()
    })
    .buffer_unordered(concurrency)
    .collect()
    .await;
    (results.iter().filter(|ok| **ok).count(), results.len())
}

/// Waits until every agent is connected to the hub process started at
/// `epoch`, holds `per` Applications and agrees with the hub both ways (and
/// every hub copy carries its agent's status); times are from `epoch`.
async fn phase(
    what: &str,
    fleet: &LoadGenerator,
    hub: &mut HubProcess,
    epoch: Instant,
    copies: Option<&Arc<Mutex<Copies>>>,
    per: usize,
    timeout: Duration,
) -> Result<Phase> {
    let ready = hub.ready(timeout).await?;
    eprintln!(
        "bench-grpc fleet: {what}: hub ready after {:.1} s",
        ready.as_secs_f64()
    );
    let mut last_print = Instant::now();
    loop {
        let progress = fleet.progress();
        let n = progress.len();
        let connected = progress.iter().filter(|p| p.welcomed_at.is_some()).count();
        let full = progress.iter().filter(|p| p.apps == per).count();
        let in_sync = progress.iter().filter(|p| p.in_sync_at.is_some()).count();
        let (matching, all_since, half_since) = match copies {
            Some(c) => {
                let c = c.lock().expect("never poisoned");
                (Some(c.matching.len()), c.all_since, c.half_since)
            }
            None => (None, None, None),
        };
        let copies_done = copies.is_none() || all_since.is_some();
        if in_sync == n && full == n && copies_done {
            let latest = |f: fn(&crate::fleet_load_generator::Progress) -> Option<Instant>| {
                progress
                    .iter()
                    .filter_map(f)
                    .max()
                    .map(|t| t.saturating_duration_since(epoch))
                    .unwrap_or_default()
            };
            return Ok(Phase {
                ready,
                connected: latest(|p| p.welcomed_at),
                in_sync: latest(|p| p.in_sync_at),
                copies: all_since.map(|t| t.saturating_duration_since(epoch)),
                half_copies: half_since.map(|t| t.saturating_duration_since(epoch)),
            });
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            last_print = Instant::now();
            eprintln!(
                "bench-grpc fleet: {what}, {:.0} s: {connected}/{n} agents connected, {full}/{n} hold their Applications, {in_sync}/{n} in sync{}",
                epoch.elapsed().as_secs_f64(),
                matching
                    .map(|m| format!(", {m} hub copies carry their status"))
                    .unwrap_or_default()
            );
        }
        if epoch.elapsed() > timeout {
            let stuck = fleet
                .agents
                .iter()
                .zip(&progress)
                .find(|(_, p)| p.in_sync_at.is_none())
                .map(|(a, _)| format!("{} (last error: {})", a.cluster, a.last_error()))
                .unwrap_or_default();
            bail!(
                "{what}: not in sync after {timeout:?}: {connected}/{n} connected, {in_sync}/{n} in sync; for example {stuck}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
