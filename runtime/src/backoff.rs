//! Retry delays: exponential, capped, with jitter, so that a fleet of
//! agents that lost the hub at the same moment does not come back at the
//! same moment (argocd-agent's backoff has no jitter: reconnect storms).
//! The one backoff of every component: the agents' reconnects, the hub's
//! writes to Argo CD's Redis.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min: min.max(Duration::from_millis(1)),
            max: max.max(min),
            attempt: 0,
        }
    }

    /// The next delay: "equal jitter", half of the exponential step plus a
    /// random part of the other half, so that the delay never collapses to
    /// zero and still spreads the fleet.
    pub fn next_with(&mut self, random: u64) -> Duration {
        let step = self
            .min
            .saturating_mul(1u32.checked_shl(self.attempt.min(30)).unwrap_or(u32::MAX))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        let half = step / 2;
        let spread = half.as_nanos().max(1) as u64;
        half + Duration::from_nanos(random % spread)
    }

    pub fn delay(&mut self) -> Duration {
        self.next_with(random())
    }

    /// After a connection that worked, start again from the minimum.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A random number good enough for jitter, without a dependency: the
/// standard library seeds every `RandomState` from the OS.
fn random() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64,
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_within_its_jitter_bounds() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut steps = Vec::new();
        for i in 0..10u64 {
            let step = Duration::from_millis(100 * (1 << i)).min(Duration::from_secs(5));
            let d = b.next_with(i * 7919);
            assert!(
                d >= step / 2 && d <= step,
                "attempt {i}: {d:?} outside {step:?}"
            );
            steps.push(d);
        }
        assert!(steps[9] >= Duration::from_millis(2500));
        b.reset();
        assert!(b.next_with(0) <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_agents_apart() {
        let delays: std::collections::BTreeSet<Duration> = (0..50)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(60)).delay())
            .collect();
        assert!(delays.len() > 40, "{} distinct delays of 50", delays.len());
    }
}
