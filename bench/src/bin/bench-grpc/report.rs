//! How `bench-grpc` prints figures over `--repeat N` runs: every figure as
//! its median (min–max) over the runs and its spread (max / min), flagged
//! when over 1.5×; side by side (`compare`) with argocd-agent / ours.

use std::collections::HashMap;
use std::time::Duration;

use argocd_pull_bench::stats::Percentiles;

pub use testenv::stats::summary;

/// A spread (max / min over the runs) above this is flagged: the runs
/// disagree by more than the difference a comparison should rest on.
pub const SPREAD_LIMIT: f64 = 1.5;

/// How a figure's value is written.
pub type Format = fn(f64) -> String;

/// Seconds, written in milliseconds.
pub fn ms(v: f64) -> String {
    format!("{:.1} ms", v * 1000.0)
}

pub fn secs(v: f64) -> String {
    format!("{v:.2} s")
}

pub fn rate(v: f64) -> String {
    format!("{v:.0}/s")
}

pub fn count(v: f64) -> String {
    format!("{v:.0}")
}

/// KiB, written in MiB.
pub fn mib(v: f64) -> String {
    format!("{:.0} MiB", v / 1024.0)
}

pub fn seconds(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// One figure over the runs, as printed.
#[derive(Debug, PartialEq)]
pub struct Cell {
    /// Median (min–max), and how many runs lack it.
    pub text: String,
    /// max / min, flagged over [`SPREAD_LIMIT`]; `–` for fewer than two runs.
    pub spread: String,
    pub median: Option<f64>,
}

pub fn cell(values: &[Option<f64>], fmt: Format) -> Cell {
    let got: Vec<f64> = values.iter().flatten().copied().collect();
    let missing = values.len() - got.len();
    let Some((median, min, max)) = summary(&got) else {
        return Cell {
            text: "–".into(),
            spread: "–".into(),
            median: None,
        };
    };
    let mut text = fmt(median);
    if got.len() > 1 {
        text.push_str(&format!(" ({}–{})", fmt(min), fmt(max)));
    }
    if missing > 0 {
        text.push_str(&format!(", missing in {missing} of {}", values.len()));
    }
    Cell {
        text,
        spread: spread(min, max, got.len()),
        median: Some(median),
    }
}

/// max / min over `runs` runs, with `⚠` when over [`SPREAD_LIMIT`] (a
/// count that is 0 in one run and not in another is flagged as `∞`).
pub fn spread(min: f64, max: f64, runs: usize) -> String {
    if runs < 2 {
        return "–".into();
    }
    if max == min {
        return "1.00×".into();
    }
    if min <= 0.0 {
        return "∞ ⚠".into();
    }
    let r = max / min;
    if r > SPREAD_LIMIT {
        format!("{r:.2}× ⚠")
    } else {
        format!("{r:.2}×")
    }
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
        let c = cell(&row.values, row.fmt);
        println!(
            "| {} | {} | {} | {} |",
            row.name,
            c.text,
            c.spread,
            row.verdict()
        );
    }
    legend();
}

pub fn legend() {
    println!();
    println!(
        "spread: max / min over the runs; ⚠: over {SPREAD_LIMIT}×, the runs disagree too much to rest a comparison on"
    );
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

type SideRow = (&'static str, fn(&SideFigures) -> Option<f64>, Format);

fn side_rows() -> Vec<SideRow> {
    vec![
        (
            "hub change -> applied on the spoke, p50",
            |f| seconds(f.down.as_ref().map(|p| p.p50)),
            ms,
        ),
        (
            "hub change -> applied on the spoke, p99",
            |f| seconds(f.down.as_ref().map(|p| p.p99)),
            ms,
        ),
        (
            "spoke status -> on the hub copy, p50",
            |f| seconds(f.up.as_ref().map(|p| p.p50)),
            ms,
        ),
        (
            "spoke status -> on the hub copy, p99",
            |f| seconds(f.up.as_ref().map(|p| p.p99)),
            ms,
        ),
        (
            "hub changes not applied on the spoke within 30 s",
            |f| f.down.as_ref().map(|_| f.down_missed as f64),
            count,
        ),
        (
            "spoke statuses not on the hub copy within 30 s",
            |f| f.up.as_ref().map(|_| f.up_missed as f64),
            count,
        ),
        (
            "status writes on the spoke, written in (benchmark)",
            |f| seconds(f.updates_written),
            secs,
        ),
        (
            "… every hub copy shows its last status, from the first write",
            |f| seconds(f.updates_converged),
            secs,
        ),
        (
            "status updates per second one agent carries, final state correct",
            |f| {
                f.updates_converged
                    .map(|d| f.updates as f64 / d.as_secs_f64())
            },
            rate,
        ),
        (
            "… writes to the hub meanwhile (its etcd revision's advance, every object)",
            |f| f.hub_writes.map(|w| w as f64),
            count,
        ),
        (
            "hub copies wrong a minute after the last write (lost)",
            |f| f.lost.map(|l| l as f64),
            count,
        ),
        (
            "after a hub SIGKILL and restart: hub change applied on the spoke",
            |f| seconds(f.recovery_down),
            secs,
        ),
        (
            "after a hub SIGKILL and restart: spoke status on the hub copy",
            |f| seconds(f.recovery_up),
            secs,
        ),
    ]
}

/// The header of a table of ours next to argocd-agent.
pub fn side_by_side_header() {
    println!("| figure | ours | spread | argocd-agent | spread | argocd-agent / ours |");
    println!("|---|---:|---:|---:|---:|---:|");
}

/// One row of that table from each side's values over the runs: each
/// side's median (min–max) and spread, and argocd-agent's median over ours.
pub fn side_by_side_row(name: &str, ours: &[Option<f64>], peer: &[Option<f64>], fmt: Format) {
    let (o, p) = (cell(ours, fmt), cell(peer, fmt));
    let ratio = match (p.median, o.median) {
        (Some(p), Some(o)) if o > 0.0 => format!("{:.2}×", p / o),
        _ => "–".into(),
    };
    println!(
        "| {name} | {} | {} | {} | {} | {ratio} |",
        o.text, o.spread, p.text, p.spread
    );
}

/// Ours next to argocd-agent: each side's median (min–max) and spread, and
/// argocd-agent's median over ours.
pub fn print_tables(title: &str, figures: &HashMap<Side, Vec<SideFigures>>) {
    let empty = Vec::new();
    let ours = figures.get(&Side::Ours).unwrap_or(&empty);
    let peer = figures.get(&Side::ArgocdAgent).unwrap_or(&empty);
    println!();
    println!("{title}");
    println!();
    side_by_side_header();
    for (name, value, fmt) in side_rows() {
        side_by_side_row(
            name,
            &ours.iter().map(value).collect::<Vec<_>>(),
            &peer.iter().map(value).collect::<Vec<_>>(),
            fmt,
        );
    }
    legend();
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
    fn median_min_max_and_spread() {
        let c = cell(&[Some(1.0), None], plain);
        assert_eq!(c.text, "1, missing in 1 of 2");
        assert_eq!(c.spread, "–", "one run has no spread");
        let c = cell(&[Some(1.0), Some(3.0)], plain);
        assert_eq!((c.text.as_str(), c.spread.as_str()), ("2 (1–3)", "3.00× ⚠"));
        let c = cell(&[Some(10.0), Some(14.0), Some(12.0)], plain);
        assert_eq!(
            (c.text.as_str(), c.spread.as_str()),
            ("12 (10–14)", "1.40×")
        );
        assert_eq!(cell(&[None, None], plain).text, "–");
    }

    #[test]
    fn spread_flags_runs_that_disagree() {
        assert_eq!(spread(2.0, 3.0, 2), "1.50×", "1.5× itself is not flagged");
        assert_eq!(spread(2.0, 3.1, 2), "1.55× ⚠");
        assert_eq!(spread(0.0, 0.0, 3), "1.00×");
        assert_eq!(spread(0.0, 3.0, 3), "∞ ⚠");
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
