//! A keyed work queue with client-go's workqueue semantics, for work that
//! is triggered by many events but only needs the latest state.
//!
//! A key added several times before a worker takes it is processed once; a
//! key is never processed by two workers at once (added while processing,
//! it is processed again afterwards); different keys are processed in
//! parallel by as many workers as the caller runs. Memory is bounded by the
//! number of distinct keys: nothing is ever dropped.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

struct State<K> {
    queue: VecDeque<K>,
    /// Keys waiting in `queue`, or added again while being processed.
    dirty: HashSet<K>,
    processing: HashSet<K>,
    closed: bool,
}

/// See the module documentation. Cheap to clone: clones share the queue.
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    notify: Arc<Notify>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            notify: self.notify.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                closed: false,
            })),
            notify: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state
            .lock()
            .expect("never poisoned: no code panics holding it")
    }

    /// Marks `key` as needing work.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        let new = s.dirty.insert(key.clone());
        if s.processing.contains(&key) {
            // Queued again by `done`.
            return;
        }
        if !new {
            return;
        }
        s.queue.push_back(key);
        drop(s);
        self.notify.notify_one();
    }

    /// Adds `key` after `delay` (a retry), without holding up the caller.
    pub fn add_after(&self, key: K, delay: Duration) {
        let q = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    /// The next key to work on; `None` once the queue is closed. The caller
    /// must call [`WorkQueue::done`] with it when finished.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if s.closed {
                    drop(s);
                    // Wake the other workers so that they stop too.
                    self.notify.notify_waiters();
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    let more = !s.queue.is_empty();
                    drop(s);
                    if more {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Finishes `key`; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.contains(key) && !s.closed {
            s.queue.push_back(key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Keys waiting for a worker (not counting those being processed).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops handing out keys: every `next` returns `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_added_many_times_is_processed_once() {
        let q = WorkQueue::new();
        for _ in 0..5 {
            q.add("a");
        }
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_added_while_processing_comes_back_after_done() {
        let q = WorkQueue::new();
        q.add("a");
        let a = q.next().await.unwrap();
        q.add("a");
        q.add("a");
        assert!(q.is_empty(), "never handed out twice at once");
        q.done(&a);
        assert_eq!(q.len(), 1);
        let again = q.next().await.unwrap();
        q.done(&again);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn workers_run_keys_in_parallel_and_stop_when_closed() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (q, seen) = (q.clone(), seen.clone());
                tokio::spawn(async move {
                    while let Some(k) = q.next().await {
                        seen.lock().unwrap().push(k);
                        q.done(&k);
                    }
                })
            })
            .collect();
        for k in 0..100 {
            q.add(k);
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while seen.lock().unwrap().len() < 100 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        q.close();
        for w in workers {
            tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .unwrap()
                .unwrap();
        }
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }
}
