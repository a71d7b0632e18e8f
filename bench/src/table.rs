//! Figures over repeated runs, as the benchmarks print them: each figure's
//! median, min and max over the runs, its spread (max / min) flagged over
//! [`SPREAD_LIMIT`], and, for two sides measured the same way, whether ours
//! is ahead of, equal to or behind the other side on that figure. The
//! tables are Markdown, to be pasted into docs/benchmarks.md as printed.

use std::fmt::Write as _;

pub use testenv::stats::summary;

/// A spread (max / min over the runs) above this is flagged: the runs
/// disagree by more than the difference a comparison should rest on.
pub const SPREAD_LIMIT: f64 = 1.5;

/// Two sides whose medians differ by at most this share of the larger are
/// equal on a figure even where their min..max ranges do not overlap.
pub const TOLERANCE: f64 = 0.05;

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

/// One figure over the runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Runs that measured it.
    pub runs: usize,
    /// Runs that did not (no value, or not a finite one).
    pub missing: usize,
}

impl Summary {
    /// The figure over the runs (`None`: a run that did not measure it);
    /// `None` when no run did.
    pub fn of(values: &[Option<f64>]) -> Option<Self> {
        let got: Vec<f64> = values
            .iter()
            .flatten()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        let (median, min, max) = summary(&got)?;
        Some(Self {
            median,
            min,
            max,
            runs: got.len(),
            missing: values.len() - got.len(),
        })
    }

    /// max / min; `None` with fewer than two runs; infinite when the
    /// smallest is 0 and the largest is not (a count that is 0 in one run
    /// and not in another).
    pub fn spread(&self) -> Option<f64> {
        if self.runs < 2 {
            return None;
        }
        Some(if self.max == self.min {
            1.0
        } else if self.min <= 0.0 {
            f64::INFINITY
        } else {
            self.max / self.min
        })
    }

    /// Whether the runs disagree by more than [`SPREAD_LIMIT`].
    pub fn flagged(&self) -> bool {
        self.spread().is_some_and(|s| s > SPREAD_LIMIT)
    }

    /// `median (min–max)`, and how many runs lack it.
    pub fn text(&self, fmt: Format) -> String {
        let mut text = fmt(self.median);
        if self.runs > 1 {
            let _ = write!(text, " ({}–{})", fmt(self.min), fmt(self.max));
        }
        if self.missing > 0 {
            let _ = write!(
                text,
                ", missing in {} of {}",
                self.missing,
                self.runs + self.missing
            );
        }
        text
    }

    /// The spread as printed: `1.40×`, `3.00× ⚠`, `∞ ⚠`, `–` for one run.
    pub fn spread_text(&self) -> String {
        match self.spread() {
            None => "–".into(),
            Some(s) if s.is_infinite() => "∞ ⚠".into(),
            Some(s) if s > SPREAD_LIMIT => format!("{s:.2}× ⚠"),
            Some(s) => format!("{s:.2}×"),
        }
    }
}

/// The cells of one figure: `median (min–max)` and its spread; `–` for
/// both when no run measured it.
pub fn cells(values: &[Option<f64>], fmt: Format) -> (String, String) {
    match Summary::of(values) {
        Some(s) => (s.text(fmt), s.spread_text()),
        None => ("–".into(), "–".into()),
    }
}

/// Which way a figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    /// Times, memory, CPU, writes, losses.
    Lower,
    /// Rates, hub copies right.
    Higher,
}

/// Where ours stands on one figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ahead,
    /// The two sides' min..max ranges overlap, or their medians are within
    /// [`TOLERANCE`] of each other.
    Equal,
    Behind,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ahead => "ahead",
            Verdict::Equal => "equal",
            Verdict::Behind => "behind",
        }
    }
}

/// Ours against the other side on a figure where `better` says which way
/// is better.
pub fn verdict(ours: &Summary, peer: &Summary, better: Better) -> Verdict {
    let overlap = ours.min <= peer.max && peer.min <= ours.max;
    let larger = ours.median.abs().max(peer.median.abs());
    let close = (ours.median - peer.median).abs() <= TOLERANCE * larger;
    if overlap || close {
        return Verdict::Equal;
    }
    let ours_lower = ours.median < peer.median;
    if ours_lower == (better == Better::Lower) {
        Verdict::Ahead
    } else {
        Verdict::Behind
    }
}

/// One row of a side-by-side table: a figure of each side over its runs.
pub struct Compared {
    pub name: String,
    pub ours: Vec<Option<f64>>,
    pub peer: Vec<Option<f64>>,
    pub fmt: Format,
    /// `None`: not a figure of either side (the benchmark's own), no verdict.
    pub better: Option<Better>,
}

impl Compared {
    pub fn new(
        name: impl Into<String>,
        ours: Vec<Option<f64>>,
        peer: Vec<Option<f64>>,
        fmt: Format,
        better: Option<Better>,
    ) -> Self {
        Self {
            name: name.into(),
            ours,
            peer,
            fmt,
            better,
        }
    }

    /// Ours against the other side; `None` when not compared or a side
    /// has no value.
    pub fn verdict(&self) -> Option<Verdict> {
        let (o, p) = (Summary::of(&self.ours)?, Summary::of(&self.peer)?);
        Some(verdict(&o, &p, self.better?))
    }
}

/// Ours next to `peer` as a Markdown table: each side's median (min–max)
/// and spread, the other side's median over ours, and where ours stands;
/// then a line that counts the rows ahead, equal and behind.
pub fn side_by_side(peer: &str, rows: &[Compared]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| figure | ours | spread | {peer} | spread | {peer} / ours | ours is |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|");
    let (mut ahead, mut equal, mut behind, mut flagged) = (0, 0, 0, 0);
    for row in rows {
        let (o, p) = (Summary::of(&row.ours), Summary::of(&row.peer));
        let (ot, os) = cells(&row.ours, row.fmt);
        let (pt, ps) = cells(&row.peer, row.fmt);
        let ratio = match (p, o) {
            (Some(p), Some(o)) if o.median > 0.0 => format!("{:.2}×", p.median / o.median),
            _ => "–".into(),
        };
        let v = row.verdict();
        match v {
            Some(Verdict::Ahead) => ahead += 1,
            Some(Verdict::Equal) => equal += 1,
            Some(Verdict::Behind) => behind += 1,
            None => {}
        }
        if o.is_some_and(|s| s.flagged()) || p.is_some_and(|s| s.flagged()) {
            flagged += 1;
        }
        let _ = writeln!(
            out,
            "| {} | {ot} | {os} | {pt} | {ps} | {ratio} | {} |",
            row.name,
            v.map_or("–", Verdict::label)
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "ours is ahead on {ahead}, equal on {equal} and behind on {behind} of the {} figures compared; \
         {flagged} row(s) with a spread flagged (⚠).",
        ahead + equal + behind
    );
    out.push_str(&legend());
    out
}

/// What the columns mean, printed under every table.
pub fn legend() -> String {
    format!(
        "\nmedian (min–max) over the runs; spread: max / min, ⚠ over {SPREAD_LIMIT}× (the runs disagree too much \
         to rest a comparison on); ours is: ahead or behind where the two sides' min..max ranges do not \
         overlap and their medians differ by more than {:.0} %, equal otherwise, – where the figure is \
         not one of the sides (the benchmark's own) or a side has no value.\n",
        TOLERANCE * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(v: f64) -> String {
        format!("{v}")
    }

    fn s(values: &[f64]) -> Summary {
        Summary::of(&values.iter().map(|v| Some(*v)).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn median_min_max_and_missing_runs() {
        let c = Summary::of(&[Some(1.0), None]).unwrap();
        assert_eq!(c.text(plain), "1, missing in 1 of 2");
        assert_eq!(c.spread_text(), "–", "one run has no spread");
        assert_eq!(s(&[1.0, 3.0]).text(plain), "2 (1–3)");
        assert_eq!(s(&[10.0, 14.0, 12.0]).text(plain), "12 (10–14)");
        assert_eq!(Summary::of(&[None, None]), None);
        // A value that is not finite is a run that did not measure it.
        let nan = Summary::of(&[Some(f64::NAN), Some(4.0)]).unwrap();
        assert_eq!((nan.runs, nan.missing), (1, 1));
        assert_eq!(cells(&[None], plain), ("–".into(), "–".into()));
    }

    #[test]
    fn spread_is_flagged_over_one_and_a_half() {
        assert_eq!(
            s(&[2.0, 3.0]).spread_text(),
            "1.50×",
            "1.5× itself is not flagged"
        );
        assert!(!s(&[2.0, 3.0]).flagged());
        assert_eq!(s(&[2.0, 3.1]).spread_text(), "1.55× ⚠");
        assert!(s(&[2.0, 3.1]).flagged());
        assert_eq!(s(&[0.0, 0.0, 0.0]).spread_text(), "1.00×");
        assert_eq!(s(&[0.0, 3.0, 3.0]).spread_text(), "∞ ⚠");
        assert!(s(&[0.0, 3.0]).flagged());
        assert!(!s(&[5.0]).flagged(), "one run cannot disagree with itself");
    }

    #[test]
    fn verdict_follows_the_better_direction() {
        let fast = s(&[8.0, 9.0, 10.0, 11.0]);
        let slow = s(&[190.0, 200.0, 205.0, 210.0]);
        assert_eq!(verdict(&fast, &slow, Better::Lower), Verdict::Ahead);
        assert_eq!(verdict(&slow, &fast, Better::Lower), Verdict::Behind);
        assert_eq!(verdict(&fast, &slow, Better::Higher), Verdict::Behind);
        assert_eq!(verdict(&slow, &fast, Better::Higher), Verdict::Ahead);
    }

    #[test]
    fn overlapping_ranges_or_close_medians_are_equal() {
        // 213/s against 206/s with ranges that overlap: equal, not ahead.
        let ours = s(&[200.0, 213.0, 230.0]);
        let peer = s(&[180.0, 206.0, 210.0]);
        assert_eq!(verdict(&ours, &peer, Better::Higher), Verdict::Equal);
        // 0 lost in every run against 0, 0 and 2: the ranges overlap.
        assert_eq!(
            verdict(&s(&[0.0, 0.0]), &s(&[0.0, 2.0]), Better::Lower),
            Verdict::Equal
        );
        // Apart, but the medians within 5 %.
        assert_eq!(
            verdict(&s(&[100.0]), &s(&[104.0]), Better::Lower),
            Verdict::Equal
        );
        // Apart by more than 5 %.
        assert_eq!(
            verdict(&s(&[100.0]), &s(&[106.0]), Better::Lower),
            Verdict::Ahead
        );
        // Ranges just touching still overlap.
        assert_eq!(
            verdict(&s(&[1.0, 2.0]), &s(&[2.0, 3.0]), Better::Lower),
            Verdict::Equal
        );
    }

    #[test]
    fn side_by_side_prints_and_counts_every_verdict() {
        let v = |x: &[f64]| x.iter().map(|v| Some(*v)).collect::<Vec<_>>();
        let row = |name, ours: &[f64], peer: &[f64], better| {
            Compared::new(name, v(ours), v(peer), plain, better)
        };
        let rows = [
            row("latency", &[1.0, 2.0], &[10.0, 20.0], Some(Better::Lower)),
            row("rate", &[5.0, 6.0], &[5.5, 7.0], Some(Better::Higher)),
            row("memory", &[9.0, 9.0], &[3.0, 3.0], Some(Better::Lower)),
            row("benchmark's own", &[1.0], &[1.0], None),
            Compared::new(
                "not measured",
                vec![None],
                v(&[1.0]),
                plain,
                Some(Better::Lower),
            ),
        ];
        let table = side_by_side("peer", &rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| figure | ours | spread | peer | spread | peer / ours | ours is |"
        );
        assert_eq!(
            lines[2],
            "| latency | 1.5 (1–2) | 2.00× ⚠ | 15 (10–20) | 2.00× ⚠ | 10.00× | ahead |"
        );
        assert!(lines[3].ends_with("| equal |"), "{}", lines[3]);
        assert!(lines[4].ends_with("| 0.33× | behind |"), "{}", lines[4]);
        assert!(lines[5].ends_with("| – |"), "{}", lines[5]);
        assert_eq!(lines[6], "| not measured | – | – | 1 | – | – | – |");
        assert!(
            table.contains(
                "ours is ahead on 1, equal on 1 and behind on 1 of the 3 figures compared; \
                 1 row(s) with a spread flagged"
            ),
            "{table}"
        );
    }
}
