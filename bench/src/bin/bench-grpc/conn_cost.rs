//! `bench-grpc conn-cost`: what one more connected agent costs the hub,
//! as the slope of its memory between two fleet sizes. Each round runs the
//! fleet's first start and steady state (`fleet`, without its restarts) at
//! `--agents` and at `--more-agents`, each on a fresh hub API server, and
//! divides the difference of the hub's peak RSS (and of its RSS in steady
//! state) by the difference of agents: what the hub holds whatever the
//! fleet's size (its caches' fixed part, the runtime, the binary) drops
//! out, the Applications' share is `--apps-per-agent` of them per agent.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};

use crate::fleet::{self, Copies, End, Figures, FleetArgs, Phase};
use crate::fleet_load_generator::LoadGenerator;
use crate::hub::HubProcess;
use crate::report::{self, Row, print_runs};

#[derive(clap::Args, Debug)]
pub struct ConnCostArgs {
    /// The smaller fleet (`--agents`) and what each run does.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// The larger fleet: simulated agents.
    #[arg(long, default_value_t = 4000)]
    pub more_agents: usize,
}

/// The two runs of a round.
struct Pair {
    small: Figures,
    large: Figures,
}

/// Runs both sizes `repeat` times and prints the slope over the rounds.
pub async fn run(args: ConnCostArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let (small, large) = (args.fleet.agents, args.more_agents);
    if large <= small {
        bail!("--more-agents ({large}) must be over --agents ({small})");
    }
    let per = args.fleet.apps_per_agent;
    let mut version = String::new();
    let runs = report::each_round("conn-cost", repeat, async |round| {
        let at = |agents: usize| {
            let mut a = args.fleet.clone();
            a.agents = agents;
            a.first_start_only = true;
            a
        };
        let (a, b) = (at(small), at(large));
        // Numbered apart, so that each run keeps its hub log.
        Ok(Pair {
            small: fleet::one_run(&a, hub_bin, 2 * round - 1, &mut version).await?,
            large: fleet::one_run(&b, hub_bin, 2 * round, &mut version).await?,
        })
    })
    .await;
    let kib = |f: fn(&Figures) -> Option<u64>, of: fn(&Pair) -> &Figures| {
        report::per_run(&runs, move |p| f(of(p)).map(|k| k as f64))
    };
    let slope = |f: fn(&Figures) -> Option<u64>| {
        report::per_run(&runs, move |p| {
            let d = f(&p.large)? as f64 - f(&p.small)? as f64;
            Some(d / (large - small) as f64)
        })
    };
    let peak = |f: &Figures| f.peak1;
    let steady = |f: &Figures| f.steady_rss;
    let per_agent: report::Format = |v| format!("{v:.1} KiB");
    let steady_secs = args.fleet.steady_secs;
    let rows = [
        Row::new(
            format!("hub peak RSS (VmHWM), first start and {steady_secs} s steady: {small} agents"),
            kib(peak, |p| &p.small),
            report::mib,
        ),
        Row::new(
            format!("hub peak RSS (VmHWM), first start and {steady_secs} s steady: {large} agents"),
            kib(peak, |p| &p.large),
            report::mib,
        ),
        Row::new(
            format!("hub RSS in steady state (VmRSS): {small} agents"),
            kib(steady, |p| &p.small),
            report::mib,
        ),
        Row::new(
            format!("hub RSS in steady state (VmRSS): {large} agents"),
            kib(steady, |p| &p.large),
            report::mib,
        ),
        Row::new(
            format!("**hub peak RSS per connected agent with {per} Application(s)**"),
            slope(peak),
            per_agent,
        ),
        Row::new(
            format!("hub RSS in steady state per connected agent with {per} Application(s)"),
            slope(steady),
            per_agent,
        ),
    ];
    print_runs(
        &format!(
            "gRPC transport, the cost of a connection: {small} and {large} simulated agents x {per} Application(s) on one hub (kube-apiserver {version}), the slope between them; {repeat} round(s), each run on a fresh hub API server"
        ),
        &rows,
    );
    fleet::check_runs(&runs, "conn-cost", |p| &p.small.end, small, small * per)?;
    fleet::check_runs(&runs, "conn-cost", |p| &p.large.end, large, large * per)
}

/// Stops the fleet and the hub after the first steady state (a run with
/// `first_start_only`); how it ended.
pub async fn stop_after_first_start(
    fleet: &LoadGenerator,
    hub: &mut HubProcess,
    copies: &Arc<Mutex<Copies>>,
    connected: f64,
    log: PathBuf,
) -> Result<End> {
    let pending = hub.metric("argocd_pull_hub_grpc_pending_objects").await;
    let matching = copies.lock().expect("never poisoned").matching.len();
    fleet.stop();
    hub.terminate(Duration::from_secs(60)).await?;
    Ok(End::new(matching, connected, pending, vec![log]))
}

impl Figures {
    /// A run that ended after its first steady state: the restarts'
    /// figures zero, the first start's to be filled in.
    pub fn without_restarts(end: End, failed_attempts: u64) -> Self {
        Self {
            joined: Duration::ZERO,
            created: Duration::ZERO,
            first: Phase::default(),
            first_writes: 0.0,
            first_app_writes: 0,
            holder_writes: [0; 3],
            steady_rss: None,
            steady_cpu: None,
            peak1: None,
            steady_connected: 0.0,
            killed: Phase::default(),
            killed_status_writes: 0.0,
            killed_app_writes: 0,
            killed_app_writes_steady: 0,
            peak2: None,
            stopped_in: Duration::ZERO,
            termed: Phase::default(),
            termed_status_writes: 0.0,
            termed_app_writes: 0,
            peak3: None,
            failed_attempts,
            end,
            live: None,
        }
    }
}
