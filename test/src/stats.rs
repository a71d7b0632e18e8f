//! Figures over repeated benchmark runs, shared by the benchmarks.

/// Median, min and max of the values (the median of an even count is the
/// mean of the middle two); `None` for no values.
pub fn summary(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Some((median, v[0], v[v.len() - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_and_max() {
        assert_eq!(summary(&[]), None);
        assert_eq!(summary(&[3.0]), Some((3.0, 3.0, 3.0)));
        assert_eq!(summary(&[5.0, 1.0, 3.0]), Some((3.0, 1.0, 5.0)));
        assert_eq!(summary(&[4.0, 1.0, 2.0, 10.0]), Some((3.0, 1.0, 10.0)));
        assert_eq!(summary(&[f64::NAN, 2.0]), Some((2.0, 2.0, 2.0)));
        assert_eq!(summary(&[2.0, 9.0, 1.0]), Some((2.0, 1.0, 9.0)));
    }
}
