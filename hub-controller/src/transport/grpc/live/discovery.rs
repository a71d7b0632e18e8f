//! The clusters' discovery answers, kept for a while on the hub.
//!
//! argocd-server builds new Kubernetes clients for every live read and asks
//! the cluster's discovery (`/api/v1`, `/apis/<group>/<version>`) before the
//! object itself, so without a cache every LIVE MANIFEST is two round
//! trips over the agent's stream. A discovery answer changes when a CRD is
//! installed or removed; [`TTL`] is how late the hub may learn of it.
//! Only whole answers (one chunk, 200) are kept, each at most
//! [`MAX_ENTRY_BYTES`], all of them at most [`MAX_BYTES`]: past that the
//! oldest go first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an answer is served from memory.
pub const TTL: Duration = Duration::from_secs(30);

/// The largest answer kept (an `/api/v1` is tens of KiB).
pub const MAX_ENTRY_BYTES: usize = 256 * 1024;

/// What all kept answers may take together: at 100 KiB a cluster, the
/// discovery of 160 clusters read within [`TTL`].
pub const MAX_BYTES: usize = 16 * 1024 * 1024;

/// One kept answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub content_type: String,
    pub body: Vec<u8>,
}

struct Entry {
    at: Instant,
    answer: Answer,
}

/// Discovery answers by cluster and path.
#[derive(Default)]
pub struct Cache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<(String, String), Entry>,
    bytes: usize,
}

impl Cache {
    /// The answer for `path` of `cluster` if one was kept less than [`TTL`]
    /// before `now`.
    pub fn get(&self, cluster: &str, path: &str, now: Instant) -> Option<Answer> {
        let inner = self.inner.lock().expect("never poisoned");
        let entry = inner
            .entries
            .get(&(cluster.to_string(), path.to_string()))?;
        (now.saturating_duration_since(entry.at) < TTL).then(|| entry.answer.clone())
    }

    /// Keeps `answer` for `path` of `cluster` from `now`; an answer over
    /// [`MAX_ENTRY_BYTES`] is not kept. Expired answers go first, then
    /// the oldest, until all fit in [`MAX_BYTES`].
    pub fn put(&self, cluster: &str, path: &str, answer: Answer, now: Instant) {
        if answer.body.len() > MAX_ENTRY_BYTES {
            return;
        }
        let mut inner = self.inner.lock().expect("never poisoned");
        let size = answer.body.len();
        let key = (cluster.to_string(), path.to_string());
        if let Some(old) = inner.entries.insert(key, Entry { at: now, answer }) {
            inner.bytes -= old.answer.body.len();
        }
        inner.bytes += size;
        if inner.bytes <= MAX_BYTES {
            return;
        }
        let Inner { entries, bytes } = &mut *inner;
        entries.retain(|_, e| {
            let keep = now.saturating_duration_since(e.at) < TTL;
            if !keep {
                *bytes -= e.answer.body.len();
            }
            keep
        });
        while *bytes > MAX_BYTES {
            let Some(oldest) = entries
                .iter()
                .min_by_key(|(_, e)| e.at)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = entries.remove(&oldest) {
                *bytes -= e.answer.body.len();
            }
        }
    }

    /// The bytes of the answers kept.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().expect("never poisoned").bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(size: usize) -> Answer {
        Answer {
            content_type: "application/json".into(),
            body: vec![b'x'; size],
        }
    }

    #[test]
    fn an_answer_is_served_for_its_cluster_and_path_until_it_expires() {
        let cache = Cache::default();
        let t0 = Instant::now();
        cache.put("c1", "/api/v1", answer(10), t0);
        assert_eq!(cache.get("c1", "/api/v1", t0 + TTL / 2), Some(answer(10)));
        assert_eq!(cache.get("c2", "/api/v1", t0), None, "another cluster's");
        assert_eq!(cache.get("c1", "/apis/apps/v1", t0), None, "another path's");
        assert_eq!(cache.get("c1", "/api/v1", t0 + TTL), None, "expired");
    }

    #[test]
    fn a_new_answer_replaces_the_old_and_the_bytes_add_up() {
        let cache = Cache::default();
        let t0 = Instant::now();
        cache.put("c1", "/api/v1", answer(10), t0);
        cache.put("c1", "/api/v1", answer(20), t0);
        cache.put("c2", "/api/v1", answer(5), t0);
        assert_eq!(cache.bytes(), 25);
    }

    #[test]
    fn memory_stays_bounded_expired_then_oldest_first() {
        let cache = Cache::default();
        let t0 = Instant::now();
        cache.put("big", "/api/v1", answer(MAX_ENTRY_BYTES + 1), t0);
        assert_eq!(
            cache.bytes(),
            0,
            "an answer over the entry bound is not kept"
        );
        let n = MAX_BYTES / MAX_ENTRY_BYTES;
        for i in 0..n {
            let at = t0 + Duration::from_millis(i as u64);
            cache.put(&format!("c{i}"), "/api/v1", answer(MAX_ENTRY_BYTES), at);
        }
        assert_eq!(cache.bytes(), MAX_BYTES);
        // One more: the oldest goes.
        let later = t0 + Duration::from_secs(1);
        cache.put("new", "/api/v1", answer(MAX_ENTRY_BYTES), later);
        assert_eq!(cache.bytes(), MAX_BYTES);
        assert_eq!(cache.get("c0", "/api/v1", later), None);
        assert!(cache.get("c1", "/api/v1", later).is_some());
        assert!(cache.get("new", "/api/v1", later).is_some());
        // Past the TTL everything old goes at the next put over the bound.
        let much_later = t0 + TTL + Duration::from_secs(2);
        cache.put("x", "/api/v1", answer(MAX_ENTRY_BYTES), much_later);
        cache.put("y", "/api/v1", answer(MAX_ENTRY_BYTES), much_later);
        assert!(cache.bytes() <= MAX_BYTES);
        assert!(cache.get("x", "/api/v1", much_later).is_some());
    }
}
