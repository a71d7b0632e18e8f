//! Percentiles of latency samples.

use std::time::Duration;

/// p50, p99 and the largest of a set of latency samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// The nearest-rank percentiles of `samples`; `None` for no samples.
pub fn percentiles(mut samples: Vec<Duration>) -> Option<Percentiles> {
    samples.sort();
    let max = *samples.last()?;
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    Some(Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |v: u64| Duration::from_millis(v);
        // 1..=200 ms, shuffled: p50 is the 100th, p99 the 198th.
        let samples: Vec<Duration> = (1..=200).rev().map(ms).collect();
        let p = percentiles(samples).unwrap();
        assert_eq!((p.p50, p.p99, p.max), (ms(100), ms(198), ms(200)));
        let one = percentiles(vec![ms(7)]).unwrap();
        assert_eq!((one.p50, one.p99, one.max), (ms(7), ms(7), ms(7)));
        assert_eq!(percentiles(Vec::new()), None);
    }
}
