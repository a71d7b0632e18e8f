//! Read your own writes: the resourceVersion of each object this process
//! wrote, kept until the watch cache shows that version or a newer one.
//!
//! A watch cache can lag behind our own writes by seconds on a loaded API
//! server. Deciding from it then repeats a write already made (the same
//! PATCH again, found sending ten times the writes under load), or undoes
//! one (an operation handed over a moment ago). So a decision about an
//! object waits until the cache shows our last write of it: the watch
//! event that brings the write (its echo) triggers the next decision.
//! Bounded by the writes whose echo has not arrived yet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::api::ObjectMeta;

type Key = (String, String);

#[derive(Clone, Default)]
pub struct Written(Arc<Mutex<HashMap<Key, String>>>);

fn key(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl Written {
    /// Remembers the version our write returned.
    pub fn record(&self, written: &ObjectMeta) {
        if let Some(rv) = &written.resource_version {
            self.lock().insert(key(written), rv.clone());
        }
    }

    /// Whether `cached` is older than our last write of that object; once
    /// the cache has caught up the write is forgotten.
    pub fn behind(&self, cached: &ObjectMeta) -> bool {
        self.behind_key(&key(cached), cached.resource_version.as_deref())
    }

    /// Like [`Written::behind`], for an object the cache may not have at
    /// all (`cached_rv` is `None` then).
    pub fn behind_key(&self, key: &Key, cached_rv: Option<&str>) -> bool {
        let mut map = self.lock();
        let Some(written) = map.get(key) else {
            return false;
        };
        if cached_rv.is_some_and(|c| at_least(c, written)) {
            map.remove(key);
            return false;
        }
        true
    }

    /// Whether `meta` is exactly the version our last write of it returned:
    /// the echo of our own write, which tells the writer nothing it did not
    /// already learn from the write's response.
    pub fn is_echo(&self, meta: &ObjectMeta) -> bool {
        let map = self.lock();
        matches!((map.get(&key(meta)), &meta.resource_version), (Some(w), Some(c)) if w == c)
    }

    /// Forgets the object (deleted, or no longer ours to write).
    pub fn forget(&self, namespace: &str, name: &str) {
        self.lock()
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Keeps only the objects `keep` says still exist.
    pub fn retain(&self, keep: impl Fn(&str, &str) -> bool) {
        self.lock().retain(|(ns, name), _| keep(ns, name));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, String>> {
        self.0
            .lock()
            .expect("never poisoned: no code panics holding it")
    }
}

/// Whether a cached resourceVersion is the written one or newer. Versions
/// are compared as numbers when both are (etcd revisions are); otherwise
/// only equality counts.
fn at_least(cached: &str, written: &str) -> bool {
    match (cached.parse::<u64>(), written.parse::<u64>()) {
        (Ok(c), Ok(w)) => c >= w,
        _ => cached == written,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(rv: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("team".into()),
            name: Some("app".into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_cache_older_than_our_write_is_behind_until_it_catches_up() {
        let w = Written::default();
        assert!(!w.behind(&meta("5")), "nothing written: trust the cache");
        w.record(&meta("7"));
        assert!(w.behind(&meta("5")));
        assert!(w.behind(&meta("6")));
        assert!(!w.behind(&meta("7")), "the echo of our write");
        assert!(w.is_empty(), "forgotten once caught up");
        // A cache that jumps past our write (someone wrote after us) has
        // caught up too.
        w.record(&meta("9"));
        assert!(!w.behind(&meta("12")));
        // Not in the cache at all: behind while the write is remembered.
        w.record(&meta("13"));
        assert!(w.behind_key(&("team".into(), "app".into()), None));
        w.forget("team", "app");
        assert!(!w.behind(&meta("1")));
    }

    #[test]
    fn only_the_exact_version_written_is_its_echo() {
        let w = Written::default();
        assert!(!w.is_echo(&meta("7")), "nothing written");
        w.record(&meta("7"));
        assert!(!w.is_echo(&meta("6")));
        assert!(w.is_echo(&meta("7")));
        assert!(!w.is_echo(&meta("8")), "someone wrote after us");
        assert!(w.is_echo(&meta("7")), "asking forgets nothing");
    }

    #[test]
    fn non_numeric_versions_compare_by_equality() {
        let w = Written::default();
        w.record(&meta("b"));
        assert!(w.behind(&meta("a")));
        assert!(!w.behind(&meta("b")));
    }

    #[test]
    fn retain_drops_objects_that_are_gone_and_keeps_the_others() {
        let w = Written::default();
        w.record(&meta("3"));
        let other = ObjectMeta {
            name: Some("other".into()),
            ..meta("5")
        };
        w.record(&other);
        w.retain(|ns, name| (ns, name) != ("team", "app"));
        assert_eq!(w.len(), 1);
        assert!(!w.behind(&meta("2")), "app is forgotten");
        assert!(
            w.behind(&ObjectMeta {
                resource_version: Some("4".into()),
                ..other.clone()
            }),
            "other is kept, with its version"
        );
    }
}
