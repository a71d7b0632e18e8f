//! The per-object coalescing outbox both sides send object messages from.
//!
//! argocd-agent keeps bounded queues that drop the oldest event when full,
//! and loses state. Here a sender keeps, per object, only the latest value
//! not yet delivered: memory is bounded by the number of distinct objects,
//! and the last value of every object is delivered eventually. At most one
//! message per object is in flight, so one object's messages arrive in order,
//! while different objects travel in parallel (up to a window).
//!
//! How the wire maps onto it: `next_ready` gives the message to send with a
//! fresh `seq`; an `ObjectAck` with outcome APPLIED or REJECTED is `ack`
//! (REJECTED: the value will never apply, do not resend it), RETRY is `nack`;
//! a lost stream is `requeue_in_flight`. The outbox outlives streams, so
//! `seq` keeps growing and an acknowledgement from an old stream never
//! matches.

use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
};

/// A message to send: the latest value of `key`, numbered `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing<K, V> {
    pub key: K,
    pub seq: u64,
    pub value: V,
}

#[derive(Debug)]
struct Slot<V> {
    /// The latest value not yet handed out.
    pending: Option<V>,
    /// The value handed out and not yet settled, with its seq.
    in_flight: Option<(u64, V)>,
}

/// See the module documentation. Values are cloned when handed out (they
/// are kept until acknowledged), so large payloads belong in an `Arc` or
/// `bytes::Bytes`.
#[derive(Debug)]
pub struct Outbox<K, V> {
    slots: HashMap<K, Slot<V>>,
    /// Keys with a pending value and nothing in flight, each at most once.
    ready: VecDeque<K>,
    in_flight: usize,
    window: usize,
    last_seq: u64,
}

impl<K: Clone + Eq + Hash, V: Clone> Outbox<K, V> {
    /// An outbox with at most `window` messages in flight (at least 1).
    pub fn new(window: usize) -> Self {
        Self {
            slots: HashMap::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            window: window.max(1),
            last_seq: 0,
        }
    }

    /// Makes `value` the latest value of `key`, replacing any value not yet
    /// handed out. A value in flight is not recalled: the new one goes out
    /// after it settles.
    pub fn upsert(&mut self, key: K, value: V) {
        match self.slots.get_mut(&key) {
            Some(slot) => {
                let was_ready = slot.pending.is_some() && slot.in_flight.is_none();
                slot.pending = Some(value);
                if !was_ready && slot.in_flight.is_none() {
                    self.ready.push_back(key);
                }
            }
            None => {
                self.slots.insert(
                    key.clone(),
                    Slot {
                        pending: Some(value),
                        in_flight: None,
                    },
                );
                self.ready.push_back(key);
            }
        }
    }

    /// The next message to send: the oldest-waiting key that has nothing in
    /// flight, with a fresh seq. `None` when nothing is ready or the window
    /// is full.
    pub fn next_ready(&mut self) -> Option<Outgoing<K, V>> {
        if self.in_flight >= self.window {
            return None;
        }
        let key = self.ready.pop_front()?;
        let slot = self.slots.get_mut(&key).expect("a ready key has a slot");
        let value = slot
            .pending
            .take()
            .expect("a ready key has a pending value");
        self.last_seq += 1;
        slot.in_flight = Some((self.last_seq, value.clone()));
        self.in_flight += 1;
        Some(Outgoing {
            key,
            seq: self.last_seq,
            value,
        })
    }

    /// The receiver is done with (`key`, `seq`): the key is free to send its
    /// next value, if any, and is forgotten otherwise. Returns false (and
    /// does nothing) when that is not what is in flight for the key, e.g. an
    /// acknowledgement from an earlier stream.
    pub fn ack(&mut self, key: &K, seq: u64) -> bool {
        let Some(slot) = self.slots.get_mut(key) else {
            return false;
        };
        if !matches!(slot.in_flight, Some((s, _)) if s == seq) {
            return false;
        }
        slot.in_flight = None;
        self.in_flight -= 1;
        if slot.pending.is_some() {
            self.ready.push_back(key.clone());
        } else {
            self.slots.remove(key);
        }
        true
    }

    /// (`key`, `seq`) was not applied and must be sent again: it goes back
    /// to pending, unless a newer value has replaced it meanwhile. Returns
    /// false (and does nothing) when that is not what is in flight.
    pub fn nack(&mut self, key: &K, seq: u64) -> bool {
        let Some(slot) = self.slots.get_mut(key) else {
            return false;
        };
        if !matches!(slot.in_flight, Some((s, _)) if s == seq) {
            return false;
        }
        let (_, value) = slot.in_flight.take().expect("checked above");
        self.in_flight -= 1;
        if slot.pending.is_none() {
            slot.pending = Some(value);
        }
        self.ready.push_back(key.clone());
        true
    }

    /// The stream is gone: every message in flight goes back to pending
    /// (unless replaced meanwhile), oldest first, ahead of the other ready
    /// keys.
    pub fn requeue_in_flight(&mut self) {
        let mut requeued: Vec<(u64, K)> = Vec::with_capacity(self.in_flight);
        for (key, slot) in &mut self.slots {
            if let Some((seq, value)) = slot.in_flight.take() {
                if slot.pending.is_none() {
                    slot.pending = Some(value);
                }
                requeued.push((seq, key.clone()));
            }
        }
        requeued.sort_by_key(|(seq, _)| *seq);
        for (_, key) in requeued.into_iter().rev() {
            self.ready.push_front(key);
        }
        self.in_flight = 0;
    }

    /// Forgets every key `keep` says no to, whatever it has pending (call
    /// it with nothing in flight, after [`Outbox::requeue_in_flight`]; a
    /// key in flight is kept).
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        self.slots
            .retain(|k, slot| slot.in_flight.is_some() || keep(k));
        let slots = &self.slots;
        self.ready.retain(|k| slots.contains_key(k));
    }

    /// Keys with a value pending or in flight (what memory is bounded by).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Messages handed out and not yet settled.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether `next_ready` would hand out a message now.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty() && self.in_flight < self.window
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let mut seen = std::collections::HashSet::new();
        for key in &self.ready {
            assert!(seen.insert(key), "a key is ready twice");
            let slot = &self.slots[key];
            assert!(slot.pending.is_some() && slot.in_flight.is_none());
        }
        let mut in_flight = 0;
        for (key, slot) in &self.slots {
            assert!(slot.pending.is_some() || slot.in_flight.is_some());
            if slot.in_flight.is_some() {
                in_flight += 1;
            } else {
                assert!(seen.contains(key), "a pending key is not ready");
            }
        }
        assert_eq!(in_flight, self.in_flight);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// An outbox of `window` holding a, b and c, at 0.
    fn abc(window: usize) -> Outbox<&'static str, i32> {
        let mut o = Outbox::new(window);
        for k in ["a", "b", "c"] {
            o.upsert(k, 0);
        }
        o
    }

    #[test]
    fn latest_value_wins_before_sending() {
        let mut o = Outbox::new(10);
        o.upsert("a", 1);
        o.upsert("b", 1);
        o.upsert("a", 2);
        assert_eq!(o.len(), 2);
        let first = o.next_ready().unwrap();
        assert_eq!((first.key, first.seq, first.value), ("a", 1, 2));
        let second = o.next_ready().unwrap();
        assert_eq!((second.key, second.seq, second.value), ("b", 2, 1));
        assert_eq!(o.next_ready(), None);
    }

    #[test]
    fn one_in_flight_per_key_and_the_newest_follows() {
        let mut o = Outbox::new(10);
        o.upsert("a", 1);
        let m = o.next_ready().unwrap();
        o.upsert("a", 2);
        o.upsert("a", 3);
        assert_eq!(o.next_ready(), None, "a is in flight");
        assert!(o.ack(&"a", m.seq));
        let m = o.next_ready().unwrap();
        assert_eq!((m.value, m.seq), (3, 2));
        assert!(o.ack(&"a", m.seq));
        assert!(o.is_empty());
    }

    #[test]
    fn stale_and_unknown_acks_are_ignored() {
        let mut o = Outbox::new(10);
        o.upsert("a", 1);
        let m = o.next_ready().unwrap();
        assert!(!o.ack(&"a", m.seq + 1));
        assert!(!o.nack(&"a", m.seq + 1));
        assert!(!o.ack(&"b", m.seq));
        assert_eq!(o.in_flight(), 1);
        assert!(o.ack(&"a", m.seq));
        assert!(!o.ack(&"a", m.seq), "twice");
    }

    #[test]
    fn nack_resends_unless_replaced() {
        let mut o = Outbox::new(10);
        o.upsert("a", 1);
        let m = o.next_ready().unwrap();
        assert!(o.nack(&"a", m.seq));
        let again = o.next_ready().unwrap();
        assert_eq!((again.value, again.seq), (1, m.seq + 1), "new seq");

        o.upsert("a", 2);
        assert!(o.nack(&"a", again.seq));
        assert_eq!(o.next_ready().unwrap().value, 2, "the newer value wins");
    }

    #[test]
    fn window_bounds_messages_in_flight() {
        let mut o = abc(2);
        let a = o.next_ready().unwrap();
        o.next_ready().unwrap();
        assert!(!o.has_ready());
        assert_eq!(o.next_ready(), None);
        o.ack(&a.key, a.seq);
        assert_eq!(o.next_ready().unwrap().key, "c");
    }

    #[test]
    fn requeue_after_a_lost_stream() {
        let mut o = abc(10);
        let a = o.next_ready().unwrap();
        let b = o.next_ready().unwrap();
        o.upsert("b", 1);
        o.requeue_in_flight();
        assert_eq!(o.in_flight(), 0);
        let order: Vec<_> = std::iter::from_fn(|| o.next_ready())
            .map(|m| (m.key, m.value))
            .collect();
        assert_eq!(order, vec![("a", 0), ("b", 1), ("c", 0)]);
        assert!(
            !o.ack(&a.key, a.seq),
            "acks from the old stream do not match"
        );
        assert!(!o.ack(&b.key, b.seq));
    }

    /// splitmix64: a tiny deterministic generator, so failures reproduce.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Any interleaving of upserts, sends, acks, retries and lost streams:
    /// one message in flight per key, each key's delivered values only move
    /// forward, memory never exceeds the number of keys, and once things
    /// calm down the last value of every key has been delivered.
    #[test]
    fn last_value_of_every_key_is_delivered() {
        const KEYS: usize = 8;
        for seed in 0..300 {
            let mut rng = Rng(seed);
            let mut o: Outbox<usize, u64> = Outbox::new(1 + rng.below(4));
            let mut latest: HashMap<usize, u64> = HashMap::new();
            let mut delivered: HashMap<usize, u64> = HashMap::new();
            let mut wire: Vec<Outgoing<usize, u64>> = Vec::new();
            let mut counter = 0u64;

            let deliver = |m: &Outgoing<usize, u64>, delivered: &mut HashMap<usize, u64>| {
                let before = delivered.insert(m.key, m.value);
                assert!(
                    before.is_none_or(|b| b <= m.value),
                    "seed {seed}: key {} went back from {before:?} to {}",
                    m.key,
                    m.value
                );
            };

            for _ in 0..400 {
                match rng.below(10) {
                    0..=3 => {
                        counter += 1;
                        let key = rng.below(KEYS);
                        latest.insert(key, counter);
                        o.upsert(key, counter);
                    }
                    4..=5 => {
                        if let Some(m) = o.next_ready() {
                            assert!(
                                !wire.iter().any(|w| w.key == m.key),
                                "seed {seed}: two messages of one key in flight"
                            );
                            wire.push(m);
                        }
                    }
                    6..=7 if !wire.is_empty() => {
                        // Acknowledged in any order across keys.
                        let m = wire.swap_remove(rng.below(wire.len()));
                        deliver(&m, &mut delivered);
                        assert!(o.ack(&m.key, m.seq));
                    }
                    8 if !wire.is_empty() => {
                        let m = wire.swap_remove(rng.below(wire.len()));
                        assert!(o.nack(&m.key, m.seq));
                    }
                    9 if rng.below(5) == 0 => {
                        // The stream breaks; some messages may have been
                        // applied without their acknowledgement arriving.
                        for m in wire.drain(..) {
                            if rng.below(2) == 0 {
                                deliver(&m, &mut delivered);
                            }
                        }
                        o.requeue_in_flight();
                    }
                    _ => {}
                }
                o.check_invariants();
                assert!(o.len() <= KEYS, "seed {seed}: memory beyond the keys");
            }

            // Calm: deliver everything still on the wire, then drain.
            for m in wire.drain(..) {
                deliver(&m, &mut delivered);
                assert!(o.ack(&m.key, m.seq));
            }
            while let Some(m) = o.next_ready() {
                deliver(&m, &mut delivered);
                assert!(o.ack(&m.key, m.seq));
            }
            assert!(o.is_empty(), "seed {seed}");
            assert_eq!(delivered, latest, "seed {seed}");
        }
    }
}
