//! Client-side limits on the API traffic of one process, so that it stays
//! a good neighbour on a shared API server (Argo CD, OCM and everyone's
//! kubectl use the hub's too): a token bucket for the request rate, a cap
//! on requests in flight that adapts to the server's latency (see
//! [`super::adapt`]), and a pause for everyone when the server answers 429
//! with `Retry-After`. Watches are long-running and exempt.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::adapt::Window;

/// The limits, as the flags give them; `0` turns a limit off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Requests per second, on average.
    pub qps: f64,
    /// Requests that may go at once after a quiet spell.
    pub burst: u32,
    /// Requests (other than watches) waiting for their response at once,
    /// at most; `0` for no cap.
    pub max_in_flight: usize,
    /// What the cap may shrink to while the API server is queueing; equal
    /// to `max_in_flight` for a fixed cap.
    pub min_in_flight: usize,
}

impl Limits {
    pub const UNLIMITED: Limits = Limits {
        qps: 0.0,
        burst: 0,
        max_in_flight: 0,
        min_in_flight: 0,
    };
}

/// A token bucket: `burst` tokens, refilled at `qps` per second. Pure
/// arithmetic over the instants it is given, so it is tested without time.
#[derive(Debug)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
    }

    /// Takes a token; returns how long the caller must wait before using
    /// it (zero when one was there). Tokens taken ahead make later callers
    /// wait longer, so waiters are served in order.
    pub fn take(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// The limits in force for one client.
pub struct Limiter {
    bucket: Option<Mutex<Bucket>>,
    gate: Option<Gate>,
    /// No request starts before this instant (set by a 429's Retry-After).
    paused_until: Mutex<Option<Instant>>,
}

/// The adaptive cap: requests out now, and the window that sets the cap.
struct Gate {
    state: Mutex<(usize, Window)>,
    freed: Notify,
    /// The cap, for the `api_in_flight_limit` gauge.
    gauge: Gauge,
}

/// A request admitted under the cap; dropping it frees its place. Pass
/// the answer's latency to [`Permit::answered`] first when it counts as a
/// sample of the server's latency.
pub struct Permit<'a> {
    gate: Option<&'a Gate>,
    sent: Instant,
}

impl Permit<'_> {
    /// The answer came; its latency feeds the cap.
    pub fn answered(&self) {
        if let Some(gate) = self.gate {
            let now = Instant::now();
            let mut s = gate.state.lock().expect("never poisoned");
            let in_flight = s.0;
            s.1.answered(now.saturating_duration_since(self.sent), in_flight, now);
            gate.gauge.set(s.1.limit() as i64);
        }
        // More room may have opened.
        if let Some(gate) = self.gate {
            gate.freed.notify_waiters();
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if let Some(gate) = self.gate {
            gate.state.lock().expect("never poisoned").0 -= 1;
            gate.freed.notify_one();
        }
    }
}

impl Limiter {
    pub fn new(limits: Limits, gauge: Gauge) -> Self {
        let gate = (limits.max_in_flight > 0).then(|| {
            let w = Window::new(limits.min_in_flight, limits.max_in_flight, Instant::now());
            gauge.set(w.limit() as i64);
            Gate {
                state: Mutex::new((0, w)),
                freed: Notify::new(),
                gauge,
            }
        });
        Self {
            bucket: (limits.qps > 0.0)
                .then(|| Mutex::new(Bucket::new(limits.qps, limits.burst, Instant::now()))),
            gate,
            paused_until: Mutex::new(None),
        }
    }

    /// Waits until a request may start; the permit is held until its
    /// response arrives. Only `capped` requests (writes: short, and what
    /// crowds a server) count against the cap on requests in flight; a
    /// read may take long (a large LIST), and a few of them holding a cap
    /// shrunk to its floor stopped every write, shutdown's included.
    pub async fn admit(&self, capped: bool) -> Permit<'_> {
        let pause = *self.paused_until.lock().expect("never poisoned");
        if let Some(until) = pause {
            tokio::time::sleep_until(until).await;
        }
        if let Some(bucket) = &self.bucket {
            let wait = bucket.lock().expect("never poisoned").take(Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        let gate = self.gate.as_ref().filter(|_| capped);
        if let Some(gate) = gate {
            loop {
                let freed = gate.freed.notified();
                tokio::pin!(freed);
                // Registered before the check, so a place freed in between
                // is not missed.
                freed.as_mut().enable();
                {
                    let mut s = gate.state.lock().expect("never poisoned");
                    if s.0 < s.1.limit() {
                        s.0 += 1;
                        break;
                    }
                }
                freed.await;
            }
        }
        Permit {
            gate,
            sent: Instant::now(),
        }
    }

    /// The server asked everyone to wait `after` (a 429's Retry-After).
    pub fn pause(&self, after: Duration) {
        let until = Instant::now() + after;
        let mut p = self.paused_until.lock().expect("never poisoned");
        if p.is_none_or(|p| p < until) {
            *p = Some(until);
        }
    }
}

/// The seconds of a `Retry-After` header (the API server sends seconds;
/// HTTP dates are not used by it), capped so that a wrong value cannot
/// stall the process.
pub fn retry_after(value: Option<&http::HeaderValue>) -> Option<Duration> {
    let secs: u64 = value?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(60)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10.0, 3, t0);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        // The 4th waits one refill (100 ms), the 5th two.
        assert_eq!(b.take(t0), Duration::from_millis(100));
        assert_eq!(b.take(t0), Duration::from_millis(200));
        // A quiet second refills to the burst, not beyond.
        let later = t0 + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(b.take(later), Duration::ZERO);
        }
        assert!(b.take(later) > Duration::ZERO);
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let h = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert_eq!(retry_after(Some(&h("1"))), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(Some(&h("3600"))), Some(Duration::from_secs(60)));
        assert_eq!(retry_after(Some(&h("soon"))), None);
        assert_eq!(retry_after(None), None);
    }

    #[tokio::test]
    async fn requests_in_flight_are_capped() {
        let l = Limiter::new(
            Limits {
                qps: 0.0,
                burst: 0,
                max_in_flight: 2,
                min_in_flight: 2,
            },
            Gauge::default(),
        );
        let a = l.admit(true).await;
        let _b = l.admit(true).await;
        let third = tokio::time::timeout(Duration::from_millis(50), l.admit(true)).await;
        assert!(
            third.is_err(),
            "a third request waits while two are in flight"
        );
        drop(a);
        let third = tokio::time::timeout(Duration::from_secs(5), l.admit(true)).await;
        assert!(third.is_ok(), "and goes once one is answered");
    }
}
