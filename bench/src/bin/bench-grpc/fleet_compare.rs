//! `bench-grpc fleet-compare`: the fleet of `fleet.rs`, ours next to
//! argocd-agent, each on a fresh hub API server, in alternating order.
//!
//! Both sides get a load generator that runs their agents in one process,
//! each agent with its own TCP connection, its own client certificate and
//! the real protocol, and no cluster of its own: the Applications it
//! receives are kept in memory and the load generator plays each cluster's
//! Argo CD by giving every one a synced, healthy status at once.
//!
//! - ours: `fleet_load_generator.rs` (the spoke-agent's session and state
//!   code, in this benchmark's process);
//! - argocd-agent: `argocd-agent-fleet` (test/tools/argocd-agent-fleet,
//!   built by test/tools/build-argocd-agent.sh), which runs argocd-agent's
//!   own `agent` package once per agent in managed mode, with client-go's
//!   and Argo CD's in-memory clientsets in place of a managed API server.
//!   It is more of the real agent than ours' generator is (its informers,
//!   queues and resync all run); it is the same load for the hub side.
//!
//! The hub side is the release hub-controller for ours and argocd-agent's
//! principal (`--allowed-namespaces '*'`, mTLS, the agent named by its
//! certificate's CN) for the peer; in managed mode the principal delivers
//! the Applications in the hub namespace named after each agent.
//! Compared: time until every agent is connected and every hub copy
//! carries the status its agent sent; writes to hub Applications; the hub
//! side's memory; after a SIGKILL of the hub side, time until every agent
//! is connected again and the writes that restart causes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::json;
use testenv::{Cluster, ClusterConfig, CrdSet, paths};
use tokio::io::AsyncBufReadExt;
use tokio::time::Instant;

use crate::argocd_agent::{
    AGENT_SPOKE_NS, LOG_LEVEL, PRINCIPAL_NS, Principal, logs_dir, low_port, start_redis, trim_log,
};
use crate::fleet::{self, Copies, FleetArgs, app_name, watch_copies_by};
use crate::hub::{self, Pki};
use crate::report::{self, Format, count, mib, secs};
use argocd_pull_bench::order::{abba, describe};
use argocd_pull_bench::table::{Better, Compared, cells, side_by_side};
use testenv::procfs::{cpu_time, memory_kib as proc_kib};

#[derive(clap::Args, Debug)]
pub struct FleetCompareArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// argocd-agent's binary (default: `<cache>/bin/argocd-agent`).
    #[arg(long)]
    pub argocd_agent: Option<PathBuf>,
    /// Its fleet load generator (default: `<cache>/bin/argocd-agent-fleet`).
    #[arg(long)]
    pub argocd_agent_fleet: Option<PathBuf>,
    /// Run only one side (`ours` or `argocd-agent`).
    #[arg(long)]
    pub only: Option<String>,
}

/// One line of the load generator's progress (see its main.go).
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    connected: usize,
    apps: usize,
    statuses: usize,
}

/// The health message the peer's load generator gives Application `app`
/// of agent `agent` (its `message`).
fn peer_message(agent: &str, app: &str) -> String {
    format!("synced by {agent}/{app}")
}

/// What one run of argocd-agent measured (memory in KiB).
struct PeerFigures {
    connected: Duration,
    copies: Option<Duration>,
    first_app_writes: u64,
    steady_rss: Option<u64>,
    steady_cpu: Option<Duration>,
    peak1: Option<u64>,
    killed_connected: Duration,
    killed_app_writes_steady: u64,
    peak2: Option<u64>,
    matching: usize,
    load_generator_peak: Option<u64>,
    load_generator_cpu: Option<Duration>,
}

/// The load generator's latest progress line, and the moments its lines
/// said every agent was connected, or not.
#[derive(Default)]
struct Seen {
    last: Progress,
    /// Moments a line said every agent is connected.
    all_connected: Vec<Instant>,
    /// Moments a line said some agent is not.
    not_all: Vec<Instant>,
}

pub async fn run(args: FleetCompareArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let peer_bin = args
        .argocd_agent
        .clone()
        .unwrap_or_else(crate::argocd_agent::default_bin);
    let loadgen_bin = args
        .argocd_agent_fleet
        .clone()
        .unwrap_or_else(|| paths::bin_dir().join("argocd-agent-fleet"));
    for b in [&peer_bin, &loadgen_bin] {
        if !b.is_file() {
            bail!(
                "{} is missing: build it with `bash test/tools/build-argocd-agent.sh` (docs/benchmarks.md)",
                b.display()
            );
        }
    }
    let f = &args.fleet;
    let (n, per) = (f.agents, f.apps_per_agent);
    let label = |ours: bool| if ours { "ours" } else { "argocd-agent" };
    // One side alone (`--only`) has no order to balance.
    let rounds = match args.only {
        Some(_) => vec![[true, false]; repeat],
        None => abba(true, false, repeat)?,
    };
    let mut ours: Vec<Result<fleet::Figures>> = Vec::new();
    let mut peer: Vec<Result<PeerFigures>> = Vec::new();
    let mut version = String::new();
    for (round, sides) in (1..).zip(&rounds) {
        for &ours_now in sides {
            let side = label(ours_now);
            if args.only.as_deref().is_some_and(|o| o != side) {
                continue;
            }
            if ours_now {
                eprintln!("bench-grpc fleet-compare: run {round}/{repeat}: ours");
                let r = fleet::one_run(f, hub_bin, round, &mut version).await;
                ours.push(report::kept("fleet-compare, ours", round, r));
            } else {
                eprintln!("bench-grpc fleet-compare: run {round}/{repeat}: argocd-agent");
                let r = peer_run(f, &peer_bin, &loadgen_bin, round, &mut version).await;
                peer.push(report::kept("fleet-compare, argocd-agent", round, r));
            }
        }
    }
    let total = n * per;
    let steady = f.steady_secs;
    let rows: Vec<Compared> = rows(steady)
        .into_iter()
        .map(|(name, o, p, fmt, better)| {
            Compared::new(
                name,
                report::per_run(&ours, o),
                report::per_run(&peer, p),
                fmt,
                better,
            )
        })
        .collect();
    println!(
        "\ngRPC transport, fleet side by side: {n} agents (a load generator each side, one process) x {per} \
         Applications = {total} on one hub (kube-apiserver {version}), each run on a fresh hub API server; \
         {repeat} run(s) per side in ABBA order ({}); a phase not done within {} s is cut there \
         (--timeout-secs)\n",
        describe(&rounds, label),
        f.timeout_secs
    );
    println!(
        "settings: the hub-controller at its defaults but for the gRPC flags and {}, logging at `{}` \
         (BENCH_HUB_LOG); argocd-agent's principal with the flags that connect its agents (mTLS, the agent \
         named by its certificate's CN) and {}, logging at `{LOG_LEVEL}`; both load generators log their \
         agents' warnings only; every log to its file in {} (the principal's and its load generator's \
         cut to their last {} MiB after each run).\n",
        hub::NOT_DEFAULT,
        hub::file_log_level(),
        crate::argocd_agent::NOT_DEFAULT,
        logs_dir()?.display(),
        LOG_KEEP >> 20
    );
    print!("{}", side_by_side("argocd-agent", &rows));
    let peer_figure =
        |v: fn(&PeerFigures) -> Option<f64>, fmt| cells(&report::per_run(&peer, v), fmt).0;
    println!(
        "\nargocd-agent's load generator (its agents' own code, {n} in one process): peak RSS {}, CPU time to the end of the first steady state {} (ours' runs in the benchmark's own process and is not measured apart)",
        peer_figure(|p| p.load_generator_peak.map(|k| k as f64), mib),
        peer_figure(|p| p.load_generator_cpu.map(|d| d.as_secs_f64()), secs),
    );
    // Both printed, whatever the first says.
    let failed =
        report::print_failures("ours, ", &ours) | report::print_failures("argocd-agent, ", &peer);
    if failed {
        bail!("a fleet-compare run failed");
    }
    Ok(())
}

/// A figure of both sides: its name, its value in a run of ours and in one
/// of argocd-agent's, how it is written and which way is better (`None`:
/// shown side by side, no verdict, where the two are not measured alike).
type Row = (
    String,
    fn(&fleet::Figures) -> Option<f64>,
    fn(&PeerFigures) -> Option<f64>,
    Format,
    Option<Better>,
);

fn rows(steady: u64) -> Vec<Row> {
    use Better::{Higher, Lower};
    fn s(d: Duration) -> Option<f64> {
        Some(d.as_secs_f64())
    }
    vec![
        (
            "first start: every agent connected (from the start of the hub side)".into(),
            |o| s(o.first.connected),
            |p| s(p.connected),
            secs,
            Some(Lower),
        ),
        (
            "first start: every hub copy carries the status its agent sent".into(),
            |o| o.first.copies.and_then(s),
            |p| p.copies.and_then(s),
            secs,
            Some(Lower),
        ),
        (
            "first start: writes to hub Applications seen".into(),
            |o| Some(o.first_app_writes as f64),
            |p| Some(p.first_app_writes as f64),
            count,
            Some(Lower),
        ),
        (
            format!("hub side peak RSS (VmHWM): first start, delivery, {steady} s steady"),
            |o| o.peak1.map(|k| k as f64),
            |p| p.peak1.map(|k| k as f64),
            mib,
            Some(Lower),
        ),
        (
            "hub side RSS in steady state (VmRSS)".into(),
            |o| o.steady_rss.map(|k| k as f64),
            |p| p.steady_rss.map(|k| k as f64),
            mib,
            Some(Lower),
        ),
        (
            format!("hub side CPU time, from its start to the end of {steady} s steady"),
            |o| o.steady_cpu.and_then(s),
            |p| p.steady_cpu.and_then(s),
            secs,
            Some(Lower),
        ),
        (
            "after a SIGKILL of the hub side: every agent connected again (from the new start)"
                .into(),
            |o| s(o.killed.connected),
            |p| s(p.killed_connected),
            secs,
            // No verdict: argocd-agent's principal is started again only
            // once its agents noticed the kill (part of their backoff has
            // passed by then) and is timed off a 500 ms progress ticker;
            // ours starts at once and is timed per agent.
            None,
        ),
        (
            format!("after the SIGKILL: writes to hub Applications seen, to {steady} s after"),
            |o| Some(o.killed_app_writes_steady as f64),
            |p| Some(p.killed_app_writes_steady as f64),
            count,
            Some(Lower),
        ),
        (
            "hub side peak RSS after the SIGKILL restart".into(),
            |o| o.peak2.map(|k| k as f64),
            |p| p.peak2.map(|k| k as f64),
            mib,
            Some(Lower),
        ),
        (
            "at the end: hub copies carrying their agent's status".into(),
            |o| Some(o.end.matching as f64),
            |p| Some(p.matching as f64),
            count,
            Some(Higher),
        ),
    ]
}

/// What is kept of the principal's and its load generator's logs after a
/// run (their tails; see [`trim_log`]).
const LOG_KEEP: u64 = 64 << 20;

/// One run of argocd-agent's principal and load generator on a fresh hub.
async fn peer_run(
    f: &FleetArgs,
    bin: &Path,
    loadgen_bin: &Path,
    round: usize,
    version: &mut String,
) -> Result<PeerFigures> {
    let (n, per) = (f.agents, f.apps_per_agent);
    let total = n * per;
    let timeout = Duration::from_secs(f.timeout_secs);
    eprintln!(
        "bench-grpc fleet-compare: starting a hub API server for {n} agents x {per} Applications"
    );
    let hub = Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)).await?;
    *version = hub.version().to_string();
    let client = hub.client().await?;
    hub.ensure_namespace(PRINCIPAL_NS).await?;
    let agents: Vec<String> = (1..=n).map(|i| format!("cluster-{i:04}")).collect();
    futures::stream::iter(agents.iter())
        .map(|a| hub.ensure_namespace(a))
        .buffer_unordered(f.concurrency)
        .try_collect::<Vec<()>>()
        .await
        .context("creating the agents' namespaces")?;
    let apps: Vec<(String, String)> = agents
        .iter()
        .flat_map(|a| (0..per).map(move |i| (a.clone(), app_name(a, i))))
        .collect();
    futures::stream::iter(apps.iter())
        .map(|(a, name)| {
            let app = json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": { "name": name, "namespace": a },
                "spec": { "project": "default",
                    "source": { "repoURL": "https://git.example/fleet.git", "path": "guestbook", "targetRevision": "HEAD" },
                    "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" } }
            });
            hub::create(&client, app, "applications")
        })
        .buffer_unordered(f.concurrency)
        .try_collect::<Vec<()>>()
        .await
        .context("creating the Applications")?;
    eprintln!("bench-grpc fleet-compare: {total} Applications in {n} namespaces");

    let pki = Pki::new()?;
    for a in &agents {
        pki.agent_files(a, a)?;
    }
    let certs = pki
        .ca_file()
        .parent()
        .context("the PKI folder")?
        .to_path_buf();
    let api: Api<Application> = Api::all_with(client.clone(), &application_resource());
    let copies: Arc<Mutex<Copies>> =
        watch_copies_by(api, watcher::Config::default(), total, |app| {
            let (ns, name) = (app.namespace().unwrap_or_default(), app.name_any());
            let health = app.data.pointer("/status/health");
            health
                .and_then(|h| h.get("status"))
                .and_then(|s| s.as_str())
                == Some("Healthy")
                && health
                    .and_then(|h| h.get("message"))
                    .and_then(|s| s.as_str())
                    == Some(peer_message(&ns, &name).as_str())
        });
    let (_redis, redis_addr) = start_redis(&hub)?;
    let logs = logs_dir()?;
    let grpc = low_port()?;

    // ----------------------------------------------------------- first start
    let mut principal = Principal::start(
        bin,
        &hub,
        &pki,
        grpc,
        // At info, its default, it logs every event of every agent: 1 GB
        // in the first six minutes at 1,000 agents, a load of its own on
        // this machine, as it would be on a hub.
        &format!("fleet-compare-run{round}-principal.log"),
    )?;
    let epoch = Instant::from_std(principal.started);
    let loadgen_log = logs.join(format!("fleet-compare-run{round}-argocd-agent-fleet.log"));
    let mut loadgen = tokio::process::Command::new(loadgen_bin)
        .args(["--server", "127.0.0.1", "--port", &grpc.port().to_string()])
        .arg("--ca")
        .arg(pki.ca_file())
        .arg("--certs")
        .arg(&certs)
        .args(["--namespace", AGENT_SPOKE_NS])
        .args(["--redis", &redis_addr.to_string()])
        .args(["--agents", &n.to_string()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&loadgen_log)?)
        .kill_on_drop(true)
        .spawn()
        .context("starting argocd-agent-fleet")?;
    let loadgen_pid = loadgen.id().context("argocd-agent-fleet exited at once")?;
    // Killed with the hub's API server if this benchmark is.
    hub.adopt(loadgen_pid);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let lines = tokio::io::BufReader::new(loadgen.stdout.take().context("its stdout")?).lines();
    tokio::spawn(read_progress(lines, seen.clone(), n));

    let watch = Watch {
        seen: seen.clone(),
        copies: copies.clone(),
        n,
        timeout,
    };
    if !watch
        .until("first start", epoch, &mut loadgen, &loadgen_log, |s, _| {
            !s.all_connected.is_empty()
        })
        .await?
    {
        bail!("first start: not every agent connected within {timeout:?}");
    }
    // Not every copy right within the timeout is a result (printed as
    // missing, with the count at the end), not a failed run.
    watch
        .until("first start", epoch, &mut loadgen, &loadgen_log, |_, c| {
            c.all_since.is_some()
        })
        .await?;
    let (connected, copies_at, first_app_writes) = {
        let s = seen.lock().expect("never poisoned");
        let c = copies.lock().expect("never poisoned");
        (
            s.all_connected[0].saturating_duration_since(epoch),
            c.all_since.map(|t| t.saturating_duration_since(epoch)),
            c.writes,
        )
    };
    eprintln!(
        "bench-grpc fleet-compare: every agent connected after {:.1} s, every hub copy right after {}; steady state for {} s",
        connected.as_secs_f64(),
        copies_at.map_or(format!("no: not within {timeout:?}"), |d| format!(
            "{:.1} s",
            d.as_secs_f64()
        )),
        f.steady_secs
    );
    tokio::time::sleep(Duration::from_secs(f.steady_secs)).await;
    let pid = principal.pid().context("the principal exited")?;
    let (steady_rss, peak1) = (proc_kib(pid, "VmRSS"), proc_kib(pid, "VmHWM"));
    let steady_cpu = cpu_time(pid);
    let load_generator_cpu = cpu_time(loadgen_pid);

    // --------------------------------------------------------- SIGKILL + start
    eprintln!("bench-grpc fleet-compare: killing the principal (SIGKILL) and starting it again");
    principal.kill().await?;
    // The new start is timed once the agents have seen the old one go.
    let killed_at = Instant::now();
    loop {
        if seen
            .lock()
            .expect("never poisoned")
            .not_all
            .iter()
            .any(|t| *t > killed_at)
        {
            break;
        }
        if killed_at.elapsed() > Duration::from_secs(60) {
            bail!("no agent noticed the principal's SIGKILL within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let writes_before = copies.lock().expect("never poisoned").writes;
    principal.restart(&hub)?;
    let epoch = Instant::from_std(principal.started);
    if !watch
        .until(
            "after SIGKILL",
            epoch,
            &mut loadgen,
            &loadgen_log,
            |s, _| s.all_connected.iter().any(|t| *t > epoch),
        )
        .await?
    {
        bail!("after SIGKILL: not every agent connected again within {timeout:?}");
    }
    let killed_connected = {
        let s = seen.lock().expect("never poisoned");
        s.all_connected
            .iter()
            .find(|t| **t > epoch)
            .expect("waited for")
            .saturating_duration_since(epoch)
    };
    eprintln!(
        "bench-grpc fleet-compare: every agent connected again after {:.1} s; steady state for {} s",
        killed_connected.as_secs_f64(),
        f.steady_secs
    );
    tokio::time::sleep(Duration::from_secs(f.steady_secs)).await;
    let killed_app_writes_steady = copies.lock().expect("never poisoned").writes - writes_before;
    let pid = principal.pid().context("the principal exited")?;
    let peak2 = proc_kib(pid, "VmHWM");
    let matching = copies.lock().expect("never poisoned").matching.len();
    let load_generator_peak = proc_kib(loadgen_pid, "VmHWM");
    let _ = loadgen.start_kill();
    let _ = loadgen.wait().await;
    principal.kill().await?;
    trim_log(principal.log_path(), LOG_KEEP)?;
    trim_log(&loadgen_log, LOG_KEEP)?;
    Ok(PeerFigures {
        connected,
        copies: copies_at,
        first_app_writes,
        steady_rss,
        steady_cpu,
        peak1,
        killed_connected,
        killed_app_writes_steady,
        peak2,
        matching,
        load_generator_peak,
        load_generator_cpu,
    })
}

/// What a phase waits on: the load generator's progress and the hub copies.
struct Watch {
    seen: Arc<Mutex<Seen>>,
    copies: Arc<Mutex<Copies>>,
    n: usize,
    timeout: Duration,
}

impl Watch {
    /// Waits until `done` (true), printing progress every 5 s; false once
    /// the timeout (from `since`) has passed, an error when the load
    /// generator exits.
    async fn until(
        &self,
        what: &str,
        since: Instant,
        loadgen: &mut tokio::process::Child,
        loadgen_log: &Path,
        done: impl Fn(&Seen, &Copies) -> bool,
    ) -> Result<bool> {
        let mut last_print = Instant::now();
        loop {
            let (p, matching) = {
                let s = self.seen.lock().expect("never poisoned");
                let c = self.copies.lock().expect("never poisoned");
                if done(&s, &c) {
                    return Ok(true);
                }
                (s.last, c.matching.len())
            };
            let n = self.n;
            let state = format!(
                "{}/{n} agents connected, {} Applications held, {} with their status, {matching} hub copies carry it",
                p.connected, p.apps, p.statuses
            );
            if since.elapsed() > self.timeout {
                eprintln!(
                    "bench-grpc fleet-compare: {what}: not done after {:?}: {state}",
                    self.timeout
                );
                return Ok(false);
            }
            if let Ok(Some(status)) = loadgen.try_wait() {
                bail!(
                    "argocd-agent-fleet exited with {status}; see {}",
                    loadgen_log.display()
                );
            }
            if last_print.elapsed() > Duration::from_secs(5) {
                last_print = Instant::now();
                eprintln!(
                    "bench-grpc fleet-compare: {what}, {:.0} s: {state}",
                    since.elapsed().as_secs_f64()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Keeps `seen` current from the load generator's progress lines.
async fn read_progress(
    mut lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    seen: Arc<Mutex<Seen>>,
    n: usize,
) {
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let field = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
        let p = Progress {
            connected: field("connected"),
            apps: field("apps"),
            statuses: field("statuses"),
        };
        let mut s = seen.lock().expect("never poisoned");
        s.last = p;
        if p.connected == n {
            s.all_connected.push(Instant::now());
        } else {
            s.not_all.push(Instant::now());
        }
    }
}
