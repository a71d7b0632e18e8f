//! The side-by-side gRPC table: every figure as median (min–max) over the
//! runs, and argocd-agent / ours.

use std::collections::HashMap;
use std::time::Duration;

use crate::latency::Percentiles;

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
            .field("error", &self.error)
            .finish()
    }
}

pub use testenv::stats::summary;

fn cell(values: &[Option<f64>], fmt: fn(f64) -> String) -> (String, Option<f64>) {
    let got: Vec<f64> = values.iter().flatten().copied().collect();
    let missing = values.len() - got.len();
    let Some((median, min, max)) = summary(&got) else {
        return ("–".into(), None);
    };
    let mut text = fmt(median);
    if got.len() > 1 {
        text.push_str(&format!(" ({}–{})", fmt(min), fmt(max)));
    }
    if missing > 0 {
        text.push_str(&format!(", missing in {missing} of {}", values.len()));
    }
    (text, Some(median))
}

fn secs(d: Option<std::time::Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

type Row = (
    &'static str,
    fn(&SideFigures) -> Option<f64>,
    fn(f64) -> String,
);

fn rows() -> Vec<Row> {
    let ms = |v: f64| format!("{:.1} ms", v * 1000.0);
    let s = |v: f64| format!("{v:.2} s");
    let rate = |v: f64| format!("{v:.0}/s");
    let count = |v: f64| format!("{v:.0}");
    vec![
        (
            "hub change -> applied on the spoke, p50",
            |f| secs(f.down.as_ref().map(|p| p.p50)),
            ms,
        ),
        (
            "hub change -> applied on the spoke, p99",
            |f| secs(f.down.as_ref().map(|p| p.p99)),
            ms,
        ),
        (
            "spoke status -> on the hub copy, p50",
            |f| secs(f.up.as_ref().map(|p| p.p50)),
            ms,
        ),
        (
            "spoke status -> on the hub copy, p99",
            |f| secs(f.up.as_ref().map(|p| p.p99)),
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
            |f| secs(f.updates_written),
            s,
        ),
        (
            "… every hub copy shows its last status, from the first write",
            |f| secs(f.updates_converged),
            s,
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
            "hub copies wrong a minute after the last write (lost)",
            |f| f.lost.map(|l| l as f64),
            count,
        ),
        (
            "after a hub SIGKILL and restart: hub change applied on the spoke",
            |f| secs(f.recovery_down),
            s,
        ),
        (
            "after a hub SIGKILL and restart: spoke status on the hub copy",
            |f| secs(f.recovery_up),
            s,
        ),
    ]
}

pub fn print_tables(title: &str, figures: &HashMap<Side, Vec<SideFigures>>) {
    let empty = Vec::new();
    let ours = figures.get(&Side::Ours).unwrap_or(&empty);
    let peer = figures.get(&Side::ArgocdAgent).unwrap_or(&empty);
    println!();
    println!("{title}");
    println!();
    println!("| figure | ours | argocd-agent | argocd-agent / ours |");
    println!("|---|---:|---:|---:|");
    for (name, value, fmt) in rows() {
        let (o, ov) = cell(&ours.iter().map(value).collect::<Vec<_>>(), fmt);
        let (p, pv) = cell(&peer.iter().map(value).collect::<Vec<_>>(), fmt);
        let ratio = match (pv, ov) {
            (Some(p), Some(o)) if o > 0.0 => format!("{:.2}×", p / o),
            _ => "–".into(),
        };
        println!("| {name} | {o} | {p} | {ratio} |");
    }
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

    #[test]
    fn median_and_spread() {
        assert_eq!(
            cell(&[Some(1.0), None], |v| format!("{v}")).0,
            "1, missing in 1 of 2"
        );
        assert_eq!(
            cell(&[Some(1.0), Some(3.0)], |v| format!("{v}")).0,
            "2 (1–3)"
        );
    }
}
