//! The results as Markdown: one table per Application count. With both
//! implementations, ours next to upstream as the library's `table` prints
//! it (each figure's median (min–max) and spread over the repeats, upstream
//! / ours, and whether ours is ahead, equal or behind); with one, its
//! figures alone.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use argocd_pull_bench::table::{
    Better, Compared, Format, cells, count, legend, mib, rate, side_by_side, summary,
};

use crate::run::Figures;
use crate::{Args, Impl, Results};

fn secs1(v: f64) -> String {
    format!("{v:.1} s")
}

fn per_app(v: f64) -> String {
    format!("{v:.2}")
}

fn percent(v: f64) -> String {
    format!("{:.0} %", v * 100.0)
}

fn secs(d: Option<std::time::Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

type Value = fn(&Figures, usize, f64) -> Option<f64>;

/// (title, format, value of one run given N and the ceiling, which way is
/// better: `None` for the benchmark's own figures and for rates whose
/// better direction depends on how many writes a controller needs).
fn rows() -> Vec<(&'static str, Format, Value, Option<Better>)> {
    use Better::Lower;
    vec![
        (
            "Applications created (benchmark)",
            secs1,
            |f, _, _| secs(f.create),
            None,
        ),
        (
            "benchmark's creates per second during the run",
            rate,
            |f, n, _| f.create.map(|d| n as f64 / d.as_secs_f64()),
            None,
        ),
        (
            "every ManifestWork exists (from the first create)",
            secs1,
            |f, _, _| secs(f.works),
            Some(Lower),
        ),
        (
            "… of which after the last create",
            secs1,
            |f, _, _| secs(f.works.zip(f.create).map(|(w, c)| w.saturating_sub(c))),
            Some(Lower),
        ),
        (
            "work agent's feedback written (benchmark)",
            secs1,
            |f, _, _| secs(f.feedback_written),
            None,
        ),
        (
            "benchmark's feedback writes per second during the run",
            rate,
            |f, n, _| f.feedback_written.map(|d| n as f64 / d.as_secs_f64()),
            None,
        ),
        (
            "every status on its hub Application (from the first feedback write)",
            secs1,
            |f, _, _| secs(f.status),
            Some(Lower),
        ),
        (
            "… of which after the last feedback write",
            secs1,
            |f, _, _| {
                secs(
                    f.status
                        .zip(f.feedback_written)
                        .map(|(s, w)| s.saturating_sub(w)),
                )
            },
            Some(Lower),
        ),
        (
            "controller's status writes per second (until every status shows)",
            rate,
            |f, _, _| f.status.map(|d| f.status_writes as f64 / d.as_secs_f64()),
            None,
        ),
        (
            "… as a share of the API server's write ceiling",
            percent,
            |f, _, c| {
                f.status
                    .filter(|_| c > 0.0)
                    .map(|d| f.status_writes as f64 / d.as_secs_f64() / c)
            },
            None,
        ),
        (
            "alone: status writes per second (restarted with every status to write again; first to last write)",
            rate,
            |f, _, _| f.alone.map(|(w, d)| w as f64 / d.as_secs_f64()),
            None,
        ),
        (
            "… as a share of the API server's write ceiling",
            percent,
            |f, _, c| {
                f.alone
                    .filter(|_| c > 0.0)
                    .map(|(w, d)| w as f64 / d.as_secs_f64() / c)
            },
            None,
        ),
        (
            "reconciles per Application",
            per_app,
            |f, n, _| f.reconciles.map(|r| r / n as f64),
            Some(Lower),
        ),
        (
            "… until every work exists",
            per_app,
            |f, n, _| f.delivery_reconciles.map(|r| r / n as f64),
            Some(Lower),
        ),
        (
            "controller's writes to Applications, per Application",
            per_app,
            |f, n, _| Some(f.app_writes as f64 / n as f64),
            Some(Lower),
        ),
        (
            "controller's writes to ManifestWorks, per Application",
            per_app,
            |f, n, _| Some(f.work_writes as f64 / n as f64),
            Some(Lower),
        ),
        (
            // Counted by each side's own library (controller-runtime and
            // zap against ours and tracing): shown, not compared.
            "reconcile errors",
            count,
            |f, _, _| f.reconcile_errors,
            None,
        ),
        (
            "controller peak RSS (VmHWM)",
            mib,
            |f, _, _| f.peak_rss_kib.map(|k| k as f64),
            Some(Lower),
        ),
        (
            "controller RSS once converged (VmRSS)",
            mib,
            |f, _, _| f.end_rss_kib.map(|k| k as f64),
            Some(Lower),
        ),
        (
            "controller CPU time (user + system)",
            secs1,
            |f, _, _| secs(f.cpu),
            Some(Lower),
        ),
        (
            "error lines in the controller's log",
            count,
            |f, _, _| f.log_errors.map(|e| e as f64),
            None,
        ),
    ]
}

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

pub fn render(args: &Args, version: &str, results: &BTreeMap<usize, Results>) -> String {
    let mut out = format!(
        "ManifestWork transport, {} managed clusters, {} team namespaces, kube-apiserver {version}, \
         benchmark concurrency {}, {} run(s) of each implementation per size in ABBA order; \
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
        let _ = writeln!(out, "\n### N = {n}\n");
        let ceiling = summary(&res.ceiling).map_or(0.0, |s| s.0);
        let all = |v: &[f64]| cells(&v.iter().map(|c| Some(*c)).collect::<Vec<_>>(), rate).0;
        let _ = writeln!(
            out,
            "API server's write ceiling (Application status writes, no controller running): {}; \
             with two watches of the written Applications open (as a controller's and the benchmark's \
             are in a run): {}\n",
            all(&res.ceiling),
            all(&res.ceiling_watched)
        );
        let values = |i: Impl, value: &dyn Fn(&Figures) -> Option<f64>| -> Vec<Option<f64>> {
            res.runs
                .get(&i)
                .into_iter()
                .flatten()
                .filter(|f| f.skipped.is_none())
                .map(value)
                .collect()
        };
        let mut figures: Vec<Compared> = rows()
            .into_iter()
            .map(|(title, fmt, value, better)| {
                let v = |f: &Figures| value(f, *n, ceiling);
                Compared::new(
                    title,
                    values(Impl::Ours, &v),
                    values(Impl::Upstream, &v),
                    fmt,
                    better,
                )
            })
            .collect();
        // All requests together carry the verdict: one side's PATCH does
        // what the other's GET and PUT do, so a verb alone says nothing of
        // which asks less of the API server.
        let all = |f: &Figures| {
            f.requests
                .as_ref()
                .map(|r| METHODS.iter().filter_map(|m| r.get(*m)).sum::<f64>() / *n as f64)
        };
        figures.push(Compared::new(
            "controller's requests per Application (whole life, every verb)".to_string(),
            values(Impl::Ours, &all),
            values(Impl::Upstream, &all),
            per_app,
            Some(Better::Lower),
        ));
        for method in METHODS {
            let per = |f: &Figures| {
                f.requests
                    .as_ref()
                    .map(|r| r.get(method).copied().unwrap_or(0.0) / *n as f64)
            };
            figures.push(Compared::new(
                format!("… of which {method}"),
                values(Impl::Ours, &per),
                values(Impl::Upstream, &per),
                per_app,
                None,
            ));
        }
        let impls: Vec<Impl> = res.runs.keys().copied().collect();
        match impls[..] {
            [Impl::Ours, Impl::Upstream] => out.push_str(&side_by_side("upstream", &figures)),
            [one] => out.push_str(&alone(one, &figures)),
            _ => {}
        }
        out.push_str(&cases(res, &impls));
        for (i, runs) in &res.runs {
            for f in runs {
                if let Some(why) = &f.skipped {
                    let _ = writeln!(out, "\n{} not run: {why}", i.label());
                }
            }
        }
    }
    out
}

/// One implementation's figures (the `ours` column of `figures`, or the
/// other one), each as median (min–max) with its spread.
fn alone(which: Impl, figures: &[Compared]) -> String {
    let mut out = format!("| figure | {} | spread |\n|---|---:|---:|\n", which.label());
    for f in figures {
        let values = if which == Impl::Ours {
            &f.ours
        } else {
            &f.peer
        };
        let (text, spread) = cells(values, f.fmt);
        let _ = writeln!(out, "| {} | {text} | {spread} |", f.name);
    }
    out.push_str(&legend());
    out
}

/// The correctness cases: right out of tried, over every run.
fn cases(res: &Results, impls: &[Impl]) -> String {
    type Case = fn(&crate::cases::Outcome) -> (usize, usize);
    let cases: [(&str, Case); 4] = [
        ("feedback matched by resource, not index", |o| o.by_resource),
        ("253-character names delivered with status", |o| {
            o.long_names
        }),
        (
            "deleted (also with the work deleted first), nothing left",
            |o| o.deleted_works,
        ),
        ("refresh delivered", |o| o.refresh),
    ];
    let mut out = String::from("\n| right, over every run |");
    for i in impls {
        let _ = write!(out, " {} |", i.label());
    }
    let _ = write!(out, "\n|---|{}\n", "---:|".repeat(impls.len()));
    for (title, get) in cases {
        let _ = write!(out, "| {title} |");
        for i in impls {
            let outcomes: Vec<_> = res.runs[i]
                .iter()
                .filter(|f| f.skipped.is_none())
                .filter_map(|f| f.cases)
                .collect();
            if outcomes.is_empty() {
                out.push_str(" – |");
                continue;
            }
            let (ok, of) = outcomes
                .iter()
                .map(get)
                .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
            let _ = write!(out, " {ok}/{of} |");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_implementation_alone_has_its_own_table() {
        let figures = [Compared::new(
            "every ManifestWork exists",
            vec![Some(3.0), Some(1.0), Some(2.0)],
            vec![],
            secs1,
            Some(Better::Lower),
        )];
        let table = alone(Impl::Ours, &figures);
        assert!(table.starts_with("| figure | ours | spread |\n|---|---:|---:|\n"));
        assert!(
            table.contains("| every ManifestWork exists | 2.0 s (1.0 s–3.0 s) | 3.00× ⚠ |"),
            "{table}"
        );
        let table = alone(Impl::Upstream, &figures);
        assert!(
            table.contains("| every ManifestWork exists | – | – |"),
            "{table}"
        );
    }
}
