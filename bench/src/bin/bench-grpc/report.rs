//! How `bench-grpc` prints figures over `--repeat N` runs (the library's
//! `table`: median (min–max), spread flagged over 1.5×): our transport
//! alone with its targets, and `compare`'s figures side by side with
//! argocd-agent, with where ours stands on each.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;

use argocd_pull_bench::stats::Percentiles;
use argocd_pull_bench::table::{Better, Compared, cells, legend, side_by_side};
pub use argocd_pull_bench::table::{Format, count, mib, ms, rate, secs};

pub fn seconds(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// A run as kept: its figures, or why it failed (said on stderr at once).
pub fn kept<T>(part: &str, round: usize, run: Result<T>) -> Result<T> {
    if let Err(e) = &run {
        eprintln!("bench-grpc {part}: run {round} failed: {e:#}");
    }
    run
}

/// Runs `one` for rounds 1..=`repeat`, saying which on stderr; a failed
/// run is kept as its error (said at once) and the others go on.
pub async fn each_round<T>(
    part: &str,
    repeat: usize,
    mut one: impl AsyncFnMut(usize) -> Result<T>,
) -> Vec<Result<T>> {
    let mut runs = Vec::with_capacity(repeat);
    for round in 1..=repeat {
        eprintln!("bench-grpc {part}: run {round}/{repeat}");
        runs.push(kept(part, round, one(round).await));
    }
    runs
}

/// Prints why each failed run of `whose` failed; whether any did.
pub fn print_failures<T>(whose: &str, runs: &[Result<T>]) -> bool {
    let mut failed = false;
    for (i, r) in runs.iter().enumerate() {
        if let Err(e) = r {
            println!("\n{whose}run {}: {e:#}", i + 1);
            failed = true;
        }
    }
    failed
}

/// One figure over the runs: `None` for a run that failed or did not
/// measure it.
pub fn per_run<T>(runs: &[Result<T>], value: impl Fn(&T) -> Option<f64>) -> Vec<Option<f64>> {
    runs.iter()
        .map(|r| r.as_ref().ok().and_then(&value))
        .collect()
}

/// What a figure must be in every run.
pub struct Target {
    pub text: String,
    pub met: Box<dyn Fn(f64) -> bool>,
}

/// A figure of one implementation: its value in each run (`None`: that run
/// did not measure it).
pub struct Row {
    pub name: String,
    pub values: Vec<Option<f64>>,
    pub fmt: Format,
    pub target: Option<Target>,
}

impl Row {
    pub fn new(name: impl Into<String>, values: Vec<Option<f64>>, fmt: Format) -> Self {
        Self {
            name: name.into(),
            values,
            fmt,
            target: None,
        }
    }

    pub fn target(mut self, text: impl Into<String>, met: impl Fn(f64) -> bool + 'static) -> Self {
        self.target = Some(Target {
            text: text.into(),
            met: Box::new(met),
        });
        self
    }

    /// The target cell: met in every run that measured it, or in how many not.
    fn verdict(&self) -> String {
        let Some(t) = &self.target else {
            return String::new();
        };
        let got: Vec<f64> = self.values.iter().flatten().copied().collect();
        let missed = got.iter().filter(|v| !(t.met)(**v)).count();
        match (got.len(), missed) {
            (0, _) => format!("{}: not measured", t.text),
            (_, 0) => format!("{}: met", t.text),
            (1, _) => format!("{}: MISSED", t.text),
            (n, m) => format!("{}: MISSED in {m} of {n} runs", t.text),
        }
    }
}

/// The figures of our transport alone over the runs, one table.
pub fn print_runs(title: &str, rows: &[Row]) {
    println!();
    println!("{title}");
    println!();
    println!("| figure | median (min–max) | spread (max/min) | target |");
    println!("|---|---:|---:|---|");
    for row in rows {
        let (text, spread) = cells(&row.values, row.fmt);
        println!("| {} | {text} | {spread} | {} |", row.name, row.verdict());
    }
    print!("{}", legend());
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Ours,
    ArgocdAgent,
}

impl Side {
    pub fn label(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::ArgocdAgent => "argocd-agent",
        }
    }
}

/// What one run of one side measured; `None`: not measured.
#[derive(Default)]
pub struct SideFigures {
    pub down: Option<Percentiles>,
    pub up: Option<Percentiles>,
    /// Changes not seen on the other side within 30 s (each way).
    pub down_missed: usize,
    pub up_missed: usize,
    pub recovery_down: Option<Duration>,
    pub recovery_up: Option<Duration>,
    /// Status writes on the managed cluster, and how long writing them took.
    pub updates: usize,
    pub updates_written: Option<Duration>,
    /// From the first write until every hub copy showed its last status.
    pub updates_converged: Option<Duration>,
    /// Hub copies not showing their last status a minute after the writes.
    pub lost: Option<usize>,
    /// Writes to the hub's etcd (any object: the advance of its revision)
    /// from the first status write on the spoke until every hub copy
    /// showed its last status.
    pub hub_writes: Option<u64>,
    pub error: Option<String>,
}

impl SideFigures {
    pub fn not_run(why: String) -> Self {
        Self {
            error: Some(format!("not run: {why}")),
            ..Default::default()
        }
    }
}

impl std::fmt::Debug for SideFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = |p: &Option<Percentiles>| p.as_ref().map(|p| (p.p50, p.p99, p.max));
        f.debug_struct("SideFigures")
            .field("down", &p(&self.down))
            .field("up", &p(&self.up))
            .field("down_missed", &self.down_missed)
            .field("up_missed", &self.up_missed)
            .field("recovery_down", &self.recovery_down)
            .field("recovery_up", &self.recovery_up)
            .field("updates_written", &self.updates_written)
            .field("updates_converged", &self.updates_converged)
            .field("lost", &self.lost)
            .field("hub_writes", &self.hub_writes)
            .field("error", &self.error)
            .finish()
    }
}

/// A figure of `compare`: its name, its value in one run, how it is
/// written, and which way is better (`None`: the benchmark's own figure).
type SideRow = (
    &'static str,
    fn(&SideFigures) -> Option<f64>,
    Format,
    Option<Better>,
);

fn side_rows() -> Vec<SideRow> {
    use Better::{Higher, Lower};
    fn p50(p: &Option<Percentiles>) -> Option<f64> {
        seconds(p.as_ref().map(|p| p.p50))
    }
    fn p99(p: &Option<Percentiles>) -> Option<f64> {
        seconds(p.as_ref().map(|p| p.p99))
    }
    vec![
        (
            "hub change -> applied on the spoke, p50",
            |f| p50(&f.down),
            ms,
            Some(Lower),
        ),
        (
            "hub change -> applied on the spoke, p99",
            |f| p99(&f.down),
            ms,
            Some(Lower),
        ),
        (
            "spoke status -> on the hub copy, p50",
            |f| p50(&f.up),
            ms,
            Some(Lower),
        ),
        (
            "spoke status -> on the hub copy, p99",
            |f| p99(&f.up),
            ms,
            Some(Lower),
        ),
        (
            "hub changes not applied on the spoke within 30 s",
            |f| f.down.as_ref().map(|_| f.down_missed as f64),
            count,
            Some(Lower),
        ),
        (
            "spoke statuses not on the hub copy within 30 s",
            |f| f.up.as_ref().map(|_| f.up_missed as f64),
            count,
            Some(Lower),
        ),
        (
            "status writes on the spoke, written in (benchmark)",
            |f| seconds(f.updates_written),
            secs,
            None,
        ),
        (
            "… every hub copy shows its last status, from the first write",
            |f| seconds(f.updates_converged),
            secs,
            Some(Lower),
        ),
        (
            "status updates per second one agent carries, final state correct",
            |f| {
                f.updates_converged
                    .map(|d| f.updates as f64 / d.as_secs_f64())
            },
            rate,
            Some(Higher),
        ),
        (
            "… writes to the hub meanwhile (its etcd revision's advance, every object)",
            |f| f.hub_writes.map(|w| w as f64),
            count,
            Some(Lower),
        ),
        (
            "hub copies wrong a minute after the last write (lost)",
            |f| f.lost.map(|l| l as f64),
            count,
            Some(Lower),
        ),
        (
            "after a hub SIGKILL and restart: hub change applied on the spoke",
            |f| seconds(f.recovery_down),
            secs,
            Some(Lower),
        ),
        (
            "after a hub SIGKILL and restart: spoke status on the hub copy",
            |f| seconds(f.recovery_up),
            secs,
            Some(Lower),
        ),
    ]
}

/// Ours next to argocd-agent, as [`side_by_side`] prints it, under `title`
/// and the sides' `settings`; then each failed run's error.
pub fn print_tables(title: &str, settings: &str, figures: &HashMap<Side, Vec<SideFigures>>) {
    let empty = Vec::new();
    let ours = figures.get(&Side::Ours).unwrap_or(&empty);
    let peer = figures.get(&Side::ArgocdAgent).unwrap_or(&empty);
    let rows: Vec<Compared> = side_rows()
        .into_iter()
        .map(|(name, value, fmt, better)| {
            Compared::new(
                name,
                ours.iter().map(value).collect(),
                peer.iter().map(value).collect(),
                fmt,
                better,
            )
        })
        .collect();
    println!("\n{title}\n\n{settings}\n");
    print!("{}", side_by_side(Side::ArgocdAgent.label(), &rows));
    for (side, runs) in [(Side::Ours, ours), (Side::ArgocdAgent, peer)] {
        for (i, f) in runs.iter().enumerate() {
            if let Some(e) = &f.error {
                println!("\n{} run {}: {e}", side.label(), i + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(v: f64) -> String {
        format!("{v}")
    }

    #[test]
    fn targets_are_held_in_every_run() {
        let row =
            Row::new("x", vec![Some(10.0), Some(60.0), None], plain).target("< 50", |v| v < 50.0);
        assert_eq!(row.verdict(), "< 50: MISSED in 1 of 2 runs");
        let row = Row::new("x", vec![Some(10.0)], plain).target("< 50", |v| v < 50.0);
        assert_eq!(row.verdict(), "< 50: met");
    }
}
