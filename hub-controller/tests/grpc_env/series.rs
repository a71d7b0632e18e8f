//! Reading the hub's metrics in tests.

/// The value of one series (name and labels, as printed) in `metrics`
/// (0 when absent).
pub fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}
