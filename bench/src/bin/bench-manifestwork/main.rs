//! `bench-manifestwork`: the ManifestWork transport under load, ours next to
//! upstream's Go controller, on one real hub API server.
//!
//! For each Application count and each implementation in turn, on the same
//! hub: start the controller binary, create N labelled Applications spread
//! round-robin over the managed clusters and the team namespaces, time until
//! every ManifestWork exists, then play the OCM work agent for every work
//! (status feedback written through the status subresource, as the work
//! agent does) and time until every hub Application shows the fed-back
//! status. Alongside the load, a few Applications check what the controller
//! gets right (cases.rs). Then read the controller's counters from its
//! metrics, its peak resident memory (VmHWM) and CPU time from /proc, stop it
//! and clean up before the next run. With `--repeat N` every implementation
//! runs N times, in alternating order, and every figure is printed as its
//! median with min and max. Before each round, with no controller running,
//! the API server's own write ceiling is measured (the library's `ceiling`). Both
//! controllers are only ever seen from the outside: their binary, flags,
//! metrics and the objects they write.
//!
//! `make bench-manifestwork` builds everything and runs this; see
//! docs/benchmarks.md.

#![forbid(unsafe_code)]

mod cases;
mod controller;
mod hub;
mod render;
mod run;
mod stats;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use argocd_pull_bench::ceiling;
use argocd_pull_bench::order::abba;
use clap::{Parser, ValueEnum};
use testenv::{Cluster, ClusterConfig, CrdSet, paths};

#[derive(Parser, Debug)]
#[command(
    about = "Benchmark the ManifestWork transport: our hub-controller and upstream's, on one real hub"
)]
pub struct Args {
    /// Application counts, one run per count and implementation.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    apps: Vec<usize>,
    /// Managed clusters on the hub.
    #[arg(long, default_value_t = 50)]
    clusters: usize,
    /// Team namespaces the Applications are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// Implementations to run, in this order (reversed every other round:
    /// ABBA), on the same hub.
    #[arg(long = "impl", value_delimiter = ',', default_value = "ours,upstream")]
    impls: Vec<Impl>,
    /// Runs of each implementation per Application count (even with two
    /// implementations, for the ABBA order); figures are printed as median
    /// (min–max) over them.
    #[arg(long, default_value_t = 2)]
    repeat: usize,
    /// Our controller (default: target/release/hub-controller).
    #[arg(long)]
    hub_controller: Option<PathBuf>,
    /// Upstream's controller (default: `<cache>/bin/argocd-pull-integration`,
    /// built by test/tools/build-upstream.sh).
    #[arg(long)]
    upstream: Option<PathBuf>,
    /// Concurrent requests of the benchmark itself (creating Applications,
    /// writing the work agent's feedback, measuring the ceiling).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Applications per correctness case (0: no cases).
    #[arg(long, default_value_t = 5)]
    cases: usize,
    /// Skip measuring the API server's write ceiling.
    #[arg(long)]
    no_ceiling: bool,
    /// Skip the catch-up phase (the controller restarted alone on the hub
    /// with every status to write again).
    #[arg(long)]
    no_catch_up: bool,
    /// Give up on one phase of one run after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// After convergence, wait until the reconcile counter has not moved for
    /// this many seconds before reading it (late and looping reconciles count).
    #[arg(long, default_value_t = 5)]
    settle: u64,
    /// Also write the results table (Markdown) to this file, after every
    /// round (an interrupted run keeps the rounds it finished).
    #[arg(long)]
    output: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Impl {
    /// argocd-pull's hub-controller.
    Ours,
    /// open-cluster-management.io/argocd-pull-integration, `--mode=basic`.
    Upstream,
}

impl Impl {
    pub fn label(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Upstream => "upstream",
        }
    }
}

/// All runs of one Application count.
#[derive(Default)]
pub struct Results {
    pub runs: BTreeMap<Impl, Vec<run::Figures>>,
    /// The API server's write ceiling (writes per second), once per round.
    pub ceiling: Vec<f64>,
    /// The same with two watches of the written Applications open.
    pub ceiling_watched: Vec<f64>,
}

/// The implementations of each round, in the order they run: two in ABBA
/// order over an even number of rounds (each first as often as second, so
/// that neither always runs on the fresher hub), one alone in every round.
pub fn order(impls: &[Impl], rounds: usize) -> Result<Vec<Vec<Impl>>> {
    Ok(match impls {
        [a, b] => abba(*a, *b, rounds)?.into_iter().map(Vec::from).collect(),
        _ => vec![impls.to_vec(); rounds],
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    testenv::init_tracing_stderr("info,kube_client::client::builder=off");
    if args.apps.is_empty()
        || args.impls.is_empty()
        || args.clusters == 0
        || args.namespaces == 0
        || args.repeat == 0
    {
        bail!("--apps, --impl, --clusters, --namespaces and --repeat must not be empty or zero");
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ sits inside the workspace")
        .to_path_buf();
    let ours = args
        .hub_controller
        .clone()
        .unwrap_or_else(|| workspace.join("target/release/hub-controller"));
    let upstream = args
        .upstream
        .clone()
        .unwrap_or_else(|| paths::bin_dir().join("argocd-pull-integration"));

    if args.impls.len() > 2 || (args.impls.len() == 2 && args.impls[0] == args.impls[1]) {
        bail!("--impl: ours, upstream or both, each once");
    }
    let rounds = order(&args.impls, args.repeat)?;
    let mut results: BTreeMap<usize, Results> = BTreeMap::new();
    let mut version = String::new();
    let mut run = 0;
    for &n in &args.apps {
        for (round, impls) in rounds.iter().enumerate() {
            // A fresh hub for every round: one hub for all of them slowed
            // down round after round (its write ceiling fell from 696/s to
            // 431/s over five rounds at 1,000 as etcd's file grew), which
            // made later runs slower whatever ran in them.
            let hub = Cluster::start(ClusterConfig::new("bench-hub", CrdSet::Hub)).await?;
            let client = hub.client().await?;
            let clusters = hub::setup_clusters(&hub, &client, args.clusters).await?;
            // Both controllers keep an Argo CD cluster Secret per ManagedCluster there.
            hub.ensure_namespace("argocd").await?;
            version = hub.version().to_string();
            if !args.no_ceiling {
                run += 1;
                let c = ceiling::measure(&hub, &client, n, args.concurrency, run).await?;
                eprintln!(
                    "bench: API server write ceiling at {n} Applications: {:.0}/s, {:.0}/s with two watches open",
                    c.bare, c.watched
                );
                let res = results.entry(n).or_default();
                res.ceiling.push(c.bare);
                res.ceiling_watched.push(c.watched);
            }
            for &which in impls {
                run += 1;
                let bin = match which {
                    Impl::Ours => &ours,
                    Impl::Upstream => &upstream,
                };
                let figures = if !bin.is_file() {
                    let why = format!("{} is missing", bin.display());
                    tracing::warn!(implementation = which.label(), "not run: {why}");
                    run::Figures {
                        skipped: Some(why),
                        ..Default::default()
                    }
                } else {
                    eprintln!(
                        "bench: run {run} (round {}/{}): {} with {n} Applications over {} clusters",
                        round + 1,
                        args.repeat,
                        which.label(),
                        args.clusters
                    );
                    let figures =
                        run::one_run(&hub, &client, &args, which, bin, n, run, &clusters).await?;
                    eprintln!("bench: run {run} done: {figures:?}");
                    figures
                };
                results
                    .entry(n)
                    .or_default()
                    .runs
                    .entry(which)
                    .or_default()
                    .push(figures);
            }
            // What is done so far survives an interrupted run.
            if let Some(path) = &args.output {
                std::fs::write(path, render::render(&args, &version, &results))
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("bench: the rounds done so far are in {}", path.display());
            }
        }
    }

    // `--output` already holds this table: it was written after the last round.
    println!("{}", render::render(&args, &version, &results));
    Ok(())
}

/// How long phases may take before a case gives up, after the load is done.
pub const GRACE: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_implementations_alternate_abba_over_even_rounds() {
        use Impl::{Ours as A, Upstream as B};
        assert_eq!(
            order(&[A, B], 4).unwrap(),
            vec![vec![A, B], vec![B, A], vec![A, B], vec![B, A]]
        );
        assert_eq!(order(&[B, A], 2).unwrap(), vec![vec![B, A], vec![A, B]]);
        assert!(order(&[A, B], 3).is_err(), "ours would go first twice");
        // One implementation alone has no order to balance.
        assert_eq!(order(&[A], 3).unwrap(), vec![vec![A]; 3]);
    }
}
