//! The adaptive cap on requests in flight: additive increase while the API
//! server answers about as fast as it does when idle, multiplicative
//! decrease when its latency climbs well above that. Alone on an API
//! server, a process then opens up to `--api-max-in-flight` and takes
//! what the server can give; when other clients load it, their requests
//! queue beside ours, our latency rises, and we step back to as few as
//! `--api-min-in-flight`, leaving them the room. It is the same idea as TCP
//! Vegas: read the queue from the delay, before anything is dropped.
//!
//! Pure arithmetic over the instants and latencies it is given, so that it
//! is tested without time or a server.

use std::time::Duration;

use tokio::time::Instant;

/// How long a lowest latency counts as "what the server does when idle"
/// before a newer window's lowest may replace it (the server may have
/// become slower for good, say with a bigger etcd).
const BASE_WINDOW: Duration = Duration::from_secs(15);
/// Latency above `TOLERANCE` times the idle one (plus `SLACK`) means the
/// server is queueing.
const TOLERANCE: f64 = 2.0;
/// Absolute slack above the idle latency: below a few milliseconds, a
/// doubling is noise (a GC pause, a scheduler tick), not a queue.
const SLACK: Duration = Duration::from_millis(5);
/// The cap after a congested answer, as a fraction of what it was.
const BACKOFF: f64 = 0.75;

#[derive(Debug)]
pub struct Window {
    limit: f64,
    min: f64,
    max: f64,
    /// Lowest latency of the previous and of the current base window.
    base_prev: Option<Duration>,
    base_cur: Option<Duration>,
    base_since: Instant,
    /// No second cut before this instant (one per round trip: the answers
    /// already on their way were sent under the old cap).
    next_cut: Instant,
}

impl Window {
    /// A cap between `min` and `max` (at least 1), starting halfway.
    pub fn new(min: usize, max: usize, now: Instant) -> Self {
        let max = max.max(1) as f64;
        let min = (min.max(1) as f64).min(max);
        Self {
            limit: ((min + max) / 2.0).floor(),
            min,
            max,
            base_prev: None,
            base_cur: None,
            base_since: now,
            next_cut: now,
        }
    }

    /// Requests that may be in flight now.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    /// The latency taken for an idle server's.
    pub fn base(&self) -> Option<Duration> {
        match (self.base_prev, self.base_cur) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// One answer came, `latency` after its request went, while
    /// `in_flight` requests (this one included) were out.
    pub fn answered(&mut self, latency: Duration, in_flight: usize, now: Instant) {
        if now.saturating_duration_since(self.base_since) >= BASE_WINDOW {
            self.base_prev = self.base_cur.take();
            self.base_since = now;
        }
        self.base_cur = Some(self.base_cur.map_or(latency, |b| b.min(latency)));
        let base = self.base().expect("just set");
        let queueing = latency.as_secs_f64() > base.as_secs_f64() * TOLERANCE + SLACK.as_secs_f64();
        if queueing {
            if now >= self.next_cut {
                self.limit = (self.limit * BACKOFF).floor().max(self.min);
                self.next_cut = now + latency;
            }
        } else if in_flight >= self.limit() {
            // Only a cap that is reached is raised: idle time proves nothing.
            self.limit = (self.limit + 1.0 / self.limit).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_fast_server_at_the_cap_opens_it_to_the_max() {
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        assert_eq!(w.limit(), 17);
        for i in 0..2_000 {
            let full = w.limit();
            w.answered(3 * MS, full, t + MS * i);
        }
        assert_eq!(w.limit(), 32);
    }

    #[test]
    fn an_idle_client_does_not_grow() {
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        for i in 0..2_000 {
            w.answered(3 * MS, 1, t + MS * i);
        }
        assert_eq!(w.limit(), 17);
    }

    #[test]
    fn queueing_cuts_once_per_round_trip_down_to_the_min() {
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        w.answered(3 * MS, 17, t);
        // Three slow answers within one 40 ms round trip: one cut.
        for i in 1..=3 {
            w.answered(40 * MS, 17, t + MS * i);
        }
        assert_eq!(w.limit(), 12);
        // One after the round trip: another.
        w.answered(40 * MS, 12, t + 50 * MS);
        assert_eq!(w.limit(), 9);
        for i in 0..100 {
            w.answered(40 * MS, 9, t + Duration::from_secs(1) + 50 * MS * i);
        }
        assert_eq!(w.limit(), 2);
    }

    #[test]
    fn small_latencies_within_the_slack_are_not_queueing() {
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        w.answered(MS, 17, t);
        // 6 ms is six times 1 ms, but within 2 x 1 ms + 5 ms.
        w.answered(6 * MS, 17, t + MS);
        assert!(w.limit() >= 17);
        w.answered(8 * MS, 17, t + 2 * MS);
        assert_eq!(w.limit(), 12);
    }

    #[test]
    fn the_idle_latency_is_forgotten_after_two_windows() {
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        w.answered(MS, 1, t);
        // The server is slower for good: 30 ms is its new normal.
        w.answered(30 * MS, 1, t + BASE_WINDOW);
        assert_eq!(w.base(), Some(MS));
        w.answered(30 * MS, 1, t + BASE_WINDOW * 2);
        assert_eq!(w.base(), Some(30 * MS));
    }

    #[test]
    fn min_equal_to_max_is_a_fixed_cap() {
        let t = Instant::now();
        let mut w = Window::new(16, 16, t);
        w.answered(MS, 16, t);
        w.answered(500 * MS, 16, t + MS);
        assert_eq!(w.limit(), 16);
        w.answered(MS, 16, t + Duration::from_secs(1));
        assert_eq!(w.limit(), 16);
    }
}
