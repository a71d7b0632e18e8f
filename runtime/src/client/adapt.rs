//! The adaptive cap on writes in flight, a gradient limiter (the idea of
//! Netflix's concurrency-limits Gradient2): the cap grows while the latest
//! answers come about as fast as the server's recent average, and is cut
//! when they come well slower than it, which is a queue forming in front
//! of the server. The average is the server's recent normal, not its idle
//! best: a loaded API server (on a busy machine, or under our own writes)
//! is slower for every client alike, and latency that stays high is no
//! queue to step back from. Measured against the lowest latency lately
//! seen instead, one fast answer holds a busy hub at `--api-min-in-flight`,
//! using a fifth of what its API server can take (docs/benchmarks.md, a
//! rollout across the fleet).
//! Fairness between clients is the API server's own (API Priority and
//! Fairness); this cap keeps one process from piling a queue on it.
//!
//! Pure arithmetic over the instants and latencies it is given, so that it
//! is tested without time or a server.

use std::time::Duration;

use tokio::time::Instant;

/// Answers the recent average spans, about: it follows a server that is
/// slower for good within a few hundred writes, and a queue that builds
/// over fewer answers than that shows as a gradient.
const AVERAGE_OVER: f64 = 200.0;
/// Answers the latest latency is smoothed over, so that one slow answer (a
/// large object, a compaction) is not taken for a queue.
const LATEST_OVER: f64 = 4.0;
/// Latest latency above `TOLERANCE` times the recent average (plus
/// `SLACK`) means the server is queueing.
const TOLERANCE: f64 = 2.0;
/// Absolute slack above the average: below a few milliseconds, a doubling
/// is noise (a GC pause, a scheduler tick), not a queue.
const SLACK: Duration = Duration::from_millis(5);
/// The cap after a congested answer, as a fraction of what it was.
const BACKOFF: f64 = 0.75;

#[derive(Debug)]
pub struct Window {
    limit: f64,
    min: f64,
    max: f64,
    /// Seconds: the recent average latency and the latest (both smoothed
    /// exponentially, over `AVERAGE_OVER` and `LATEST_OVER` answers).
    average: Option<f64>,
    latest: f64,
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
            average: None,
            latest: 0.0,
            next_cut: now,
        }
    }

    /// Requests that may be in flight now.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    /// The server's recent average latency.
    pub fn average(&self) -> Option<Duration> {
        self.average.map(Duration::from_secs_f64)
    }

    /// One answer came, `latency` after its request went, while
    /// `in_flight` requests (this one included) were out.
    pub fn answered(&mut self, latency: Duration, in_flight: usize, now: Instant) {
        let sample = latency.as_secs_f64();
        let average = match self.average {
            None => {
                self.latest = sample;
                sample
            }
            Some(a) => {
                self.latest += (sample - self.latest) / LATEST_OVER;
                a + (sample - a) / AVERAGE_OVER
            }
        };
        self.average = Some(average);
        let queueing = self.latest > average * TOLERANCE + SLACK.as_secs_f64();
        if queueing {
            if now >= self.next_cut {
                self.limit = (self.limit * BACKOFF).floor().max(self.min);
                self.next_cut = now + Duration::from_secs_f64(self.latest);
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

    /// Feeds `n` answers of `latency`, each at the cap, `gap` apart from `t`.
    fn at_the_cap(w: &mut Window, n: u32, latency: Duration, t: Instant, gap: Duration) -> Instant {
        let mut now = t;
        for _ in 0..n {
            now += gap;
            let full = w.limit();
            w.answered(latency, full, now);
        }
        now
    }

    #[test]
    fn a_fast_server_at_the_cap_opens_it_to_the_max() {
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        assert_eq!(w.limit(), 17);
        at_the_cap(&mut w, 2_000, 3 * MS, t, MS);
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
        let t = at_the_cap(&mut w, 20, 3 * MS, t, MS);
        assert_eq!(w.limit(), 18);
        // The server's latency jumps to 40 ms: three answers within one
        // round trip, one cut.
        for i in 1..=3 {
            w.answered(40 * MS, 18, t + MS * i);
        }
        assert_eq!(w.limit(), 13);
        // Answers after the round trip: more cuts, down to the min.
        let mut now = t + 50 * MS;
        for _ in 0..6 {
            now += 50 * MS;
            w.answered(40 * MS, w.limit(), now);
        }
        assert_eq!(w.limit(), 2);
    }

    #[test]
    fn a_server_slower_for_everyone_is_not_a_queue() {
        // A busy machine: the API server answered in 2 ms while quiet, then
        // in 27 ms for as long as the load lasts, whatever this client
        // sends. The cap is cut while the jump is fresh, then grows back
        // to the max once 27 ms is the server's normal.
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        let t = at_the_cap(&mut w, 50, 2 * MS, t, MS);
        let t = at_the_cap(&mut w, 20, 27 * MS, t, 10 * MS);
        assert!(
            w.limit() < 17,
            "the jump is taken for a queue first: {}",
            w.limit()
        );
        at_the_cap(&mut w, 3_000, 27 * MS, t, MS);
        assert_eq!(w.limit(), 32);
        assert!(w.average().unwrap() > 26 * MS);
    }

    #[test]
    fn a_saturated_server_is_kept_busy() {
        // A server that takes 1,000 writes a second: with `n` in flight
        // each answer takes n ms (Little's law), 3 ms at least. Latency that
        // rises as slowly as the cap does is no jump, so the cap grows to
        // the max: the queue it leaves at the server is bounded by
        // `--api-max-in-flight`, and the server is never left idle.
        let t = Instant::now();
        let mut w = Window::new(2, 64, t);
        let mut now = t;
        let mut seen = Vec::new();
        for _ in 0..20_000 {
            let n = w.limit();
            let latency = MS * (n as u32).max(3);
            now += latency / n as u32;
            w.answered(latency, n, now);
            seen.push(n);
        }
        assert!(
            seen.iter().all(|&n| (3..=64).contains(&n)),
            "{:?}",
            seen.iter().min()
        );
        assert_eq!(w.limit(), 64);
    }

    #[test]
    fn small_latencies_within_the_slack_are_not_queueing() {
        let t = Instant::now();
        let mut w = Window::new(2, 32, t);
        w.answered(MS, 17, t);
        // 7 ms is seven times 1 ms, but smoothed it stays within 2 x 1 ms + 5 ms.
        w.answered(7 * MS, 17, t + MS);
        assert!(w.limit() >= 17);
        // A run of 12 ms answers is a queue.
        for i in 2..6 {
            w.answered(12 * MS, 17, t + MS * i);
        }
        assert_eq!(w.limit(), 12);
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
