//! `bench-grpc`: the gRPC transport on real API servers (from `testenv`),
//! with the release hub-controller binary serving gRPC.
//!
//! `bench-grpc latency`:
//! - Latency, one change at a time: a hub Application's spec is changed and
//!   the time until the managed cluster's watch shows it applied is taken;
//!   then the spoke copy's status is changed and the time until the hub's
//!   watch shows it on the hub copy. p50 and p99 over `--changes` each way,
//!   with a real spoke-agent (in this process) and a real managed cluster.
//! - Throughput of one agent: a synthetic agent (a plain gRPC client with
//!   the agent's certificate, so that the benchmark measures the hub and not
//!   a managed API server) sends `--updates` status reports over `--apps`
//!   Applications as fast as the hub acknowledges them, one in flight per
//!   Application as the protocol says. Reported: reports taken in per second,
//!   the hub's status writes (coalescing), and whether every hub copy ends up
//!   with the last status sent for it (the run fails if not).
//!
//! `bench-grpc fleet`: one hub, `--agents` managed clusters with
//! `--apps-per-agent` Applications each, and a **fleet load generator**: one
//! process playing every cluster's agent (see `fleet_load_generator.rs`).
//! Hub peak memory, the time until the fleet is connected and in sync, and
//! the time until it is again after the hub is killed (SIGKILL) and after
//! it is stopped (SIGTERM) and started again.
//!
//! `bench-grpc conn-cost`: what one more connected agent costs the hub,
//! the slope of its memory between two fleet sizes (see `conn_cost.rs`).
//!
//! `bench-grpc compare`: ours next to argocd-agent on the same API servers
//! (see `compare.rs`).
//!
//! `bench-grpc abuse`: good agents' latency while the hub is abused (see
//! `abuse.rs`).
//!
//! `bench-grpc live-compare`: the live views next to argocd-agent's
//! resource proxy (see `live_compare.rs`).
//!
//! `bench-grpc rollout`: one ApplicationSet over the fleet and one edit of
//! its template, timed against the API server's write ceiling (see
//! `rollout.rs`).
//!
//! `--repeat N` (any part) runs it N times and prints every figure as its
//! median (min–max) over the runs and its spread (max / min), flagged over
//! 1.5×; side by side, also where ours stands (ahead, equal, behind) on
//! each figure (the library's `table`, `report.rs`). The comparisons run
//! the two sides in ABBA order and so need an even N.
//!
//! `make bench-grpc` builds everything and runs every part;
//! `make bench-grpc-fleet` only the fleet. See docs/benchmarks.md.

#![forbid(unsafe_code)]

mod abuse;
mod argocd_agent;
mod compare;
mod conn_cost;
mod fleet;
mod fleet_compare;
mod fleet_ha;
mod fleet_load_generator;
mod hub;
mod latency;
mod live_compare;
mod logs;
mod report;
mod rollout;
mod trees;

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(about = "Benchmark the gRPC transport on real API servers")]
struct Args {
    /// The hub-controller binary (default: target/release/hub-controller).
    #[arg(long, global = true)]
    hub_controller: Option<PathBuf>,
    /// Runs of each part (of each side in `compare` and `fleet-compare`,
    /// in ABBA order: there it must be even); every figure is printed as
    /// median (min–max) over the runs with its spread (max / min), flagged
    /// over 1.5×.
    #[arg(long, global = true, default_value_t = 1)]
    repeat: usize,
    #[command(subcommand)]
    part: Part,
}

#[derive(Subcommand, Debug)]
enum Part {
    /// Latency both ways (p50, p99) and one agent's throughput.
    Latency(latency::LatencyArgs),
    /// A fleet of simulated agents (a load generator) on one hub: peak
    /// memory, time to connect, time to reconnect and resync after restarts.
    Fleet(fleet::FleetArgs),
    /// What one more connected agent costs the hub: the slope of its
    /// memory between two fleet sizes (`fleet`'s first start and steady
    /// state at each).
    ConnCost(conn_cost::ConnCostArgs),
    /// The fleet on several hub-controller replicas behind one Service:
    /// agents and memory per replica, and how long until every agent is
    /// back and every hub copy exact after a serving replica, then the
    /// leader, is killed.
    FleetHa(fleet_ha::FleetHaArgs),
    /// Ours and argocd-agent (principal and one managed agent, mTLS) side
    /// by side on the same API servers: latency, one agent's throughput,
    /// recovery after a hub restart.
    Compare(compare::CompareArgs),
    /// The fleet side by side: ours and argocd-agent, each with a load
    /// generator playing its agents (argocd-agent's runs its own agent
    /// code), on fresh hub API servers in alternating order.
    FleetCompare(fleet_compare::FleetCompareArgs),
    /// Good agents' latency, quiet and while 10,000 handshakes with bad
    /// certificates and one valid agent that floods and never reads abuse
    /// the hub; the hub's peak memory.
    Abuse(abuse::AbuseArgs),
    /// The cluster's own tree in the hub's Argo CD (capability `trees`):
    /// a change on the managed cluster to the hub's argocd-server showing
    /// it (p50, p99, min, max), and argocd-server's reads of the tree and
    /// the live states (p50, p99).
    Trees(trees::TreesArgs),
    /// A pod's log followed through the hub's argocd-server, the live
    /// endpoint and the agent, next to the same lines followed straight
    /// from the cluster: lines per second.
    Logs(logs::LogsArgs),
    /// The live views next to argocd-agent's resource proxy on the same
    /// reads (a ConfigMap, a pod's log followed) of the same cluster, with
    /// the cluster's own API server as the floor.
    LiveCompare(live_compare::LiveCompareArgs),
    /// A fleet-wide change as users make it: one ApplicationSet (Argo
    /// CD's applicationset-controller) over the fleet, one template edit;
    /// the time until every hub copy shows the new revision, next to what
    /// the API server's write ceiling, measured in the same run, allows;
    /// writes per Application.
    Rollout(rollout::RolloutArgs),
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    // The agents some parts run in this process log at their own default,
    // `info`, as every process of both sides does in the comparisons
    // (`argocd_agent::LOG_LEVEL`); the rest of this process only warns.
    testenv::init_tracing_stderr("warn,argocd_pull_spoke_agent=info,kube_client=off");
    let hub_bin = args
        .hub_controller
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/release/hub-controller"));
    if !hub_bin.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p argocd-pull-hub-controller`",
            hub_bin.display()
        );
    }
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    match args.part {
        Part::Latency(a) => latency::run(a, args.repeat, &hub_bin).await,
        Part::Fleet(a) => fleet::run(a, args.repeat, &hub_bin).await,
        Part::ConnCost(a) => conn_cost::run(a, args.repeat, &hub_bin).await,
        Part::FleetHa(a) => fleet_ha::run(a, args.repeat, &hub_bin).await,
        Part::Compare(a) => compare::run(a, args.repeat, &hub_bin).await,
        Part::Abuse(a) => abuse::run(a, args.repeat, &hub_bin).await,
        Part::FleetCompare(a) => fleet_compare::run(a, args.repeat, &hub_bin).await,
        Part::Trees(a) => trees::run(a, args.repeat, &hub_bin).await,
        Part::Logs(a) => logs::run(a, args.repeat, &hub_bin).await,
        Part::LiveCompare(a) => live_compare::run(a, args.repeat, &hub_bin).await,
        Part::Rollout(a) => rollout::run(a, args.repeat, &hub_bin).await,
    }
}
