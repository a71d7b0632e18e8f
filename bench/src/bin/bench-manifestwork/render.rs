//! The results as Markdown: one table per Application count, a column per
//! implementation, every figure as its median (min–max) over the repeats,
//! and upstream / ours where both ran.

use std::collections::BTreeMap;

use crate::run::Figures;
use crate::stats::summary;
use crate::{Args, Impl, Results};

#[derive(Clone, Copy)]
enum Unit {
    Secs,
    PerSec,
    PerApp,
    MiB,
    Count,
    Percent,
}

fn fmt(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Secs => format!("{v:.1} s"),
        Unit::PerSec => format!("{v:.0}/s"),
        Unit::PerApp => format!("{v:.2}"),
        Unit::MiB => format!("{:.0} MiB", v / 1024.0),
        Unit::Count => format!("{v:.0}"),
        Unit::Percent => format!("{:.0} %", v * 100.0),
    }
}

/// One cell: median (min–max) over the runs that measured it, and how many
/// did not.
fn cell(unit: Unit, values: &[Option<f64>]) -> (String, Option<f64>) {
    let got: Vec<f64> = values.iter().flatten().copied().collect();
    let missing = values.len() - got.len();
    let Some((median, min, max)) = summary(&got) else {
        return ("–".into(), None);
    };
    let mut text = fmt(unit, median);
    if got.len() > 1 {
        text.push_str(&format!(" ({}–{})", fmt(unit, min), fmt(unit, max)));
    }
    if missing > 0 {
        text.push_str(&format!(", missing in {missing} of {}", values.len()));
    }
    (text, Some(median))
}

fn ratio(upstream: Option<f64>, ours: Option<f64>) -> String {
    match (upstream, ours) {
        (Some(u), Some(o)) if o > 0.0 => format!("{:.2}×", u / o),
        _ => "–".into(),
    }
}

fn secs(d: Option<std::time::Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

type Value = fn(&Figures, usize, f64) -> Option<f64>;

/// (title, unit, value of one run given N and the ceiling, compared).
fn rows() -> Vec<(&'static str, Unit, Value, bool)> {
    vec![
        (
            "Applications created (benchmark)",
            Unit::Secs,
            |f, _, _| secs(f.create),
            false,
        ),
        (
            "benchmark's creates per second during the run",
            Unit::PerSec,
            |f, n, _| f.create.map(|d| n as f64 / d.as_secs_f64()),
            true,
        ),
        (
            "every ManifestWork exists (from the first create)",
            Unit::Secs,
            |f, _, _| secs(f.works),
            true,
        ),
        (
            "… of which after the last create",
            Unit::Secs,
            |f, _, _| secs(f.works.zip(f.create).map(|(w, c)| w.saturating_sub(c))),
            true,
        ),
        (
            "work agent's feedback written (benchmark)",
            Unit::Secs,
            |f, _, _| secs(f.feedback_written),
            false,
        ),
        (
            "benchmark's feedback writes per second during the run",
            Unit::PerSec,
            |f, n, _| f.feedback_written.map(|d| n as f64 / d.as_secs_f64()),
            true,
        ),
        (
            "every status on its hub Application (from the first feedback write)",
            Unit::Secs,
            |f, _, _| secs(f.status),
            true,
        ),
        (
            "… of which after the last feedback write",
            Unit::Secs,
            |f, _, _| {
                secs(
                    f.status
                        .zip(f.feedback_written)
                        .map(|(s, w)| s.saturating_sub(w)),
                )
            },
            true,
        ),
        (
            "controller's status writes per second (until every status shows)",
            Unit::PerSec,
            |f, _, _| f.status.map(|d| f.status_writes as f64 / d.as_secs_f64()),
            true,
        ),
        (
            "… as a share of the API server's write ceiling",
            Unit::Percent,
            |f, _, c| {
                f.status
                    .filter(|_| c > 0.0)
                    .map(|d| f.status_writes as f64 / d.as_secs_f64() / c)
            },
            true,
        ),
        (
            "alone: status writes per second (restarted with every status to write again; first to last write)",
            Unit::PerSec,
            |f, _, _| f.alone.map(|(w, d)| w as f64 / d.as_secs_f64()),
            true,
        ),
        (
            "… as a share of the API server's write ceiling",
            Unit::Percent,
            |f, _, c| {
                f.alone
                    .filter(|_| c > 0.0)
                    .map(|(w, d)| w as f64 / d.as_secs_f64() / c)
            },
            true,
        ),
        (
            "reconciles per Application",
            Unit::PerApp,
            |f, n, _| f.reconciles.map(|r| r / n as f64),
            true,
        ),
        (
            "… until every work exists",
            Unit::PerApp,
            |f, n, _| f.delivery_reconciles.map(|r| r / n as f64),
            true,
        ),
        (
            "controller's writes to Applications, per Application",
            Unit::PerApp,
            |f, n, _| Some(f.app_writes as f64 / n as f64),
            true,
        ),
        (
            "controller's writes to ManifestWorks, per Application",
            Unit::PerApp,
            |f, n, _| Some(f.work_writes as f64 / n as f64),
            true,
        ),
        (
            "reconcile errors",
            Unit::Count,
            |f, _, _| f.reconcile_errors,
            false,
        ),
        (
            "controller peak RSS (VmHWM)",
            Unit::MiB,
            |f, _, _| f.peak_rss_kib.map(|k| k as f64),
            true,
        ),
        (
            "controller RSS once converged (VmRSS)",
            Unit::MiB,
            |f, _, _| f.end_rss_kib.map(|k| k as f64),
            true,
        ),
        (
            "controller CPU time (user + system)",
            Unit::Secs,
            |f, _, _| secs(f.cpu),
            true,
        ),
        (
            "error lines in the controller's log",
            Unit::Count,
            |f, _, _| f.log_errors.map(|e| e as f64),
            false,
        ),
    ]
}

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

pub fn render(args: &Args, version: &str, results: &BTreeMap<usize, Results>) -> String {
    let mut out = format!(
        "ManifestWork transport, {} managed clusters, {} team namespaces, kube-apiserver {version}, \
         benchmark concurrency {}, {} run(s) of each implementation per size in alternating order; \
         figures are median (min–max)\n",
        args.clusters,
        args.namespaces,
        args.concurrency,
        // The rounds done so far (the table is also written after each).
        results
            .values()
            .flat_map(|r| r.runs.values().map(Vec::len))
            .max()
            .unwrap_or(0)
    );
    for (n, res) in results {
        let impls: Vec<Impl> = res.runs.keys().copied().collect();
        let both = impls.len() == 2;
        let ceiling = summary(&res.ceiling).map_or(0.0, |s| s.0);
        out.push_str(&format!("\n| N = {n} |"));
        for i in &impls {
            out.push_str(&format!(" {} |", i.label()));
        }
        if both {
            out.push_str(" upstream / ours |");
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(impls.len() + usize::from(both)));
        out.push('\n');
        let mut line = |title: &str, cells: Vec<(String, Option<f64>)>, compared: bool| {
            out.push_str(&format!("| {title} |"));
            for (text, _) in &cells {
                out.push_str(&format!(" {text} |"));
            }
            if both {
                let r = if compared {
                    ratio(cells[1].1, cells[0].1)
                } else {
                    String::new()
                };
                out.push_str(&format!(" {r} |"));
            }
            out.push('\n');
        };
        let ran = |i: &Impl| -> Vec<&Figures> {
            res.runs[i].iter().filter(|f| f.skipped.is_none()).collect()
        };
        let (cl, _) = cell(
            Unit::PerSec,
            &res.ceiling.iter().map(|c| Some(*c)).collect::<Vec<_>>(),
        );
        line(
            "API server's write ceiling (Application status writes, no controller running)",
            impls.iter().map(|_| (cl.clone(), None)).collect(),
            false,
        );
        let (cw, _) = cell(
            Unit::PerSec,
            &res.ceiling_watched
                .iter()
                .map(|c| Some(*c))
                .collect::<Vec<_>>(),
        );
        line(
            "… with two watches of the written Applications open (as a controller's and the benchmark's are in a run)",
            impls.iter().map(|_| (cw.clone(), None)).collect(),
            false,
        );
        for (title, unit, value, compared) in rows() {
            let cells = impls
                .iter()
                .map(|i| {
                    let runs = ran(i);
                    if runs.is_empty() {
                        return ("not run".to_string(), None);
                    }
                    cell(
                        unit,
                        &runs
                            .iter()
                            .map(|f| value(f, *n, ceiling))
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            line(title, cells, compared);
        }
        for method in METHODS {
            let cells = impls
                .iter()
                .map(|i| {
                    let runs = ran(i);
                    if runs.iter().all(|f| f.requests.is_none()) {
                        return ("n/a".to_string(), None);
                    }
                    let per = |f: &&Figures| {
                        f.requests
                            .as_ref()
                            .map(|r| r.get(method).copied().unwrap_or(0.0) / *n as f64)
                    };
                    cell(Unit::PerApp, &runs.iter().map(per).collect::<Vec<_>>())
                })
                .collect();
            line(
                &format!("controller's {method} requests per Application (whole life)"),
                cells,
                true,
            );
        }
        type Case = fn(&crate::cases::Outcome) -> (usize, usize);
        let cases: [(&str, Case); 4] = [
            ("right: feedback matched by resource, not index", |o| {
                o.by_resource
            }),
            ("right: 253-character names delivered with status", |o| {
                o.long_names
            }),
            (
                "right: deleted (also with the work deleted first), nothing left",
                |o| o.deleted_works,
            ),
            ("right: refresh delivered", |o| o.refresh),
        ];
        for (title, get) in cases {
            let cells = impls
                .iter()
                .map(|i| {
                    let outcomes: Vec<_> = ran(i).iter().filter_map(|f| f.cases).collect();
                    if outcomes.is_empty() {
                        return ("–".to_string(), None);
                    }
                    let (ok, of) = outcomes
                        .iter()
                        .map(get)
                        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
                    (format!("{ok}/{of}"), None)
                })
                .collect();
            line(title, cells, false);
        }
        for (i, runs) in &res.runs {
            for f in runs {
                if let Some(why) = &f.skipped {
                    out.push_str(&format!("\n{} not run: {why}\n", i.label()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_show_median_spread_and_missing_runs() {
        assert_eq!(cell(Unit::Secs, &[Some(2.0)]).0, "2.0 s");
        assert_eq!(
            cell(Unit::Secs, &[Some(3.0), Some(1.0), Some(2.0)]).0,
            "2.0 s (1.0 s–3.0 s)"
        );
        assert_eq!(
            cell(Unit::PerSec, &[Some(100.0), None]).0,
            "100/s, missing in 1 of 2"
        );
        assert_eq!(cell(Unit::Secs, &[None]).0, "–");
        assert_eq!(ratio(Some(3.0), Some(1.5)), "2.00×");
        assert_eq!(ratio(None, Some(1.5)), "–");
    }
}
