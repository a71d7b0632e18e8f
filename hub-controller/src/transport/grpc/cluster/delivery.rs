//! One cluster's deliveries as a state machine without locks or wakeups:
//! what the hub wants under each key, what is queued, in flight and
//! acknowledged, and what the agent reported. [`ClusterState`] holds it
//! under its lock and wakes the session's sender when a method says so.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_pull_proto::coalesce::Outbox;
use argocd_pull_proto::v1::{AckOutcome, ObjectKey};

use super::{ClusterState, Inner, Item, MAX_REPAIR_REMOVALS, Observation, traces};
use crate::transport::grpc::assign::Desired;

impl Inner {
    /// Queues `item` for `key` unless it is what was queued last. Returns
    /// whether it did (the sender is to be woken).
    fn enqueue(&mut self, key: &ObjectKey, item: Item) -> bool {
        // The hub's own decision from now on, not the agent's request.
        self.deletes.removals.remove(key);
        if self.sending.enqueued.get(key) == Some(&item) {
            return false;
        }
        self.resend(key, item);
        true
    }

    /// Queues `item` for `key` whatever was queued before.
    pub(super) fn resend(&mut self, key: &ObjectKey, item: Item) {
        self.sending.enqueued.insert(key.clone(), item.clone());
        self.outbox().upsert(key.clone(), item);
    }

    /// See [`ClusterState::set_desired`]; `cluster` names the traces.
    pub(super) fn set_desired(
        &mut self,
        cluster: &str,
        key: &ObjectKey,
        desired: Arc<Desired>,
    ) -> bool {
        self.deletes.gone.remove(key);
        self.deletes.delete_acked.remove(key);
        self.deletes.gone_before_ack.remove(key);
        let changed = self
            .desired
            .get(key)
            .is_none_or(|d| d.version() != desired.version());
        if changed {
            self.rejected.remove(key);
            if let Some(t) = traces::Trace::queued(cluster, key) {
                self.sending.traces.insert(key.clone(), t);
            }
        }
        self.desired.insert(key.clone(), desired.clone());
        self.enqueue(key, Item::Upsert(desired))
    }

    /// See [`ClusterState::set_deleting`].
    pub(super) fn set_deleting(&mut self, key: &ObjectKey, hub_uid: &str) -> bool {
        self.desired.remove(key);
        self.sending.traces.remove(key);
        let item = Item::Delete {
            hub_uid: hub_uid.into(),
        };
        self.enqueue(key, item)
    }

    /// Takes `key` out of the desired set and queues what `item` makes of
    /// the hub uid it was delivered for (a delete or a release).
    pub(super) fn undesire(&mut self, key: &ObjectKey, item: fn(String) -> Item) -> bool {
        match self.desired.remove(key) {
            Some(d) => self.enqueue(key, item(d.hub_uid().to_string())),
            None => false,
        }
    }

    /// See [`ClusterState::forget_if_idle`].
    pub(super) fn forget_if_idle(&mut self, key: &ObjectKey) {
        if self.desired.contains_key(key)
            || self.sending.enqueued.contains_key(key)
            || self.sending.in_flight.contains_key(key)
        {
            return;
        }
        self.deletes.gone.remove(key);
        self.deletes.delete_acked.remove(key);
        self.deletes.gone_before_ack.remove(key);
        self.rejected.remove(key);
        self.deletes.removals.remove(key);
        self.sending.traces.remove(key);
        self.report_traces.remove(key);
        if matches!(self.observed.get(key), Some(Observation::Gone)) {
            self.observed.remove(key);
        }
    }

    /// See [`ClusterState::observe`]; also returns whether the holder of
    /// `key` changed.
    pub(super) fn observe(&mut self, key: &ObjectKey, observation: Observation) -> (bool, bool) {
        let completes = matches!(observation, Observation::Gone)
            && match self.deletes.delete_acked.get(key).cloned() {
                Some(uid) => {
                    self.deletes.gone.insert(key.clone(), uid);
                    self.sending.enqueued.remove(key);
                    true
                }
                None => false,
            };
        match &observation {
            Observation::Gone if !completes => {
                if let Some((_, Item::Delete { hub_uid }, _)) = self.sending.in_flight.get(key) {
                    let hub_uid = hub_uid.clone();
                    self.deletes.gone_before_ack.insert(key.clone(), hub_uid);
                }
            }
            Observation::Observed { .. } => {
                self.deletes.gone_before_ack.remove(key);
            }
            _ => {}
        }
        let old = self.observed.insert(key.clone(), observation);
        let holder = self.observed.get(key).and_then(Observation::holder);
        let holder_changed =
            holder.is_some() && old.as_ref().and_then(Observation::holder) != holder;
        (completes, holder_changed)
    }

    /// See [`ClusterState::object_acked`]; also returns how long the item
    /// was in flight.
    pub(super) fn object_acked(
        &mut self,
        key: &ObjectKey,
        seq: u64,
        outcome: AckOutcome,
        message: &str,
    ) -> Option<(Item, Duration)> {
        let (s, item, sent) = self.sending.in_flight.get(key).cloned()?;
        if s != seq {
            return None;
        }
        match outcome {
            // Sent again by `retry` after a pause, not at once.
            AckOutcome::Retry => return None,
            AckOutcome::Rejected => {
                self.rejected.insert(key.clone(), message.to_string());
            }
            _ if matches!(item, Item::Upsert(_)) => {
                self.rejected.remove(key);
            }
            _ => {}
        }
        self.sending.in_flight.remove(key);
        self.outbox().ack(key, seq);
        if matches!(item, Item::Upsert(_)) {
            // Ends the delivery's `send` and `deliver` spans.
            self.sending.traces.remove(key);
        }
        self.completed(key, &item, outcome);
        Some((item, sent.elapsed()))
    }

    /// What an acknowledged delete or release completes.
    fn completed(&mut self, key: &ObjectKey, item: &Item, outcome: AckOutcome) {
        match item {
            Item::Delete { hub_uid } if outcome == AckOutcome::Applied => {
                self.deletes
                    .delete_acked
                    .insert(key.clone(), hub_uid.clone());
                if self.deletes.gone_before_ack.remove(key).as_ref() == Some(hub_uid) {
                    self.deletes.gone.insert(key.clone(), hub_uid.clone());
                    if self.sending.enqueued.get(key) == Some(item) {
                        self.sending.enqueued.remove(key);
                    }
                }
            }
            Item::Release { .. } if self.sending.enqueued.get(key) == Some(item) => {
                self.sending.enqueued.remove(key);
            }
            _ => {}
        }
    }

    /// See [`ClusterState::retry`]; returns whether it is sent again.
    pub(super) fn retry(&mut self, key: &ObjectKey, seq: u64) -> bool {
        self.sending.retrying.remove(key);
        if self
            .sending
            .in_flight
            .get(key)
            .is_some_and(|(s, _, _)| *s == seq)
        {
            self.sending.in_flight.remove(key);
            self.outbox().nack(key, seq);
            return true;
        }
        false
    }

    /// Whether a removal of `key` the agent asked for must wait for a
    /// later round ([`MAX_REPAIR_REMOVALS`] are queued).
    pub(super) fn removals_full(&self, key: &ObjectKey) -> bool {
        self.deletes.removals.len() >= MAX_REPAIR_REMOVALS && !self.deletes.removals.contains(key)
    }

    /// Queues the removal `item` of `key` the agent's resync asked for.
    pub(super) fn queue_removal(&mut self, key: ObjectKey, item: Item) {
        let unknown = !self.desired.contains_key(&key);
        self.resend(&key, item);
        if unknown {
            self.deletes.removals.insert(key);
        }
    }
}

impl ClusterState {
    /// The hub wants `desired` on the cluster under `key`.
    pub fn set_desired(&self, key: &ObjectKey, desired: Arc<Desired>) {
        let woken = self.lock().set_desired(&self.name, key, desired);
        self.wake_if(woken);
    }

    /// The hub Application of `key` is being deleted: delete it on the spoke.
    pub fn set_deleting(&self, key: &ObjectKey, hub_uid: &str) {
        let woken = self.lock().set_deleting(key, hub_uid);
        self.wake_if(woken);
    }

    /// No hub Application wants `key` any more: delete what was delivered.
    pub fn remove(&self, key: &ObjectKey) {
        let woken = self
            .lock()
            .undesire(key, |hub_uid| Item::Delete { hub_uid });
        self.wake_if(woken);
    }

    /// `key` moved to the ManifestWork transport: the agent lets go of it.
    pub fn release(&self, key: &ObjectKey) {
        let woken = self
            .lock()
            .undesire(key, |hub_uid| Item::Release { hub_uid });
        self.wake_if(woken);
    }

    /// Sends `item` for `key` again whatever was sent before (a repair).
    pub fn resend(&self, key: &ObjectKey, item: Item) {
        self.lock().resend(key, item);
        self.wake.notify_one();
    }

    /// Forgets everything about `key` once nothing is desired or pending
    /// for it (the Application is gone on both sides), so that memory
    /// follows the Applications there are.
    pub fn forget_if_idle(&self, key: &ObjectKey) {
        self.lock().forget_if_idle(key);
    }

    /// Records a report. Returns true when it is a `gone` that completes a
    /// delete the agent had acknowledged.
    pub fn observe(&self, key: &ObjectKey, observation: Observation) -> bool {
        let (completes, holder_changed) = self.lock().observe(key, observation);
        if holder_changed {
            self.mark_holders_dirty();
        }
        completes
    }

    /// The agent acknowledged (key, seq). Returns the acknowledged item when
    /// it matched what was in flight. A delete acknowledged after the agent
    /// reported the Application gone (while the delete was on its way) is
    /// complete.
    pub fn object_acked(
        &self,
        key: &ObjectKey,
        seq: u64,
        outcome: AckOutcome,
        message: &str,
    ) -> Option<Item> {
        let (item, waited) = self.lock().object_acked(key, seq, outcome, message)?;
        self.delivery.observe(waited.as_secs_f64());
        self.wake.notify_one();
        Some(item)
    }

    /// Sends (key, seq) again: the agent could not apply it now.
    pub fn retry(&self, key: &ObjectKey, seq: u64) {
        let woken = self.lock().retry(key, seq);
        self.wake_if(woken);
    }

    fn wake_if(&self, woken: bool) {
        if woken {
            self.wake.notify_one();
        }
    }
}

/// Object messages from the decision to their acknowledgement.
#[derive(Default)]
pub(super) struct Sending {
    pub(super) outbox: Option<Outbox<ObjectKey, Item>>,
    /// The last item put in the outbox per key, so that an unchanged
    /// decision is not sent again.
    pub(super) enqueued: HashMap<ObjectKey, Item>,
    /// Handed out and not yet acknowledged, by key.
    pub(super) in_flight: HashMap<ObjectKey, (u64, Item, Instant)>,
    /// Keys whose object message waits to be sent again (one timer each).
    pub(super) retrying: HashSet<ObjectKey>,
    /// With `--otlp-endpoint`: the trace of each delivery on its way.
    pub(super) traces: HashMap<ObjectKey, traces::Trace>,
}

/// Deletes and releases: what the agent answered and reported.
#[derive(Default)]
pub struct Deletes {
    /// Keys whose delete the agent has requested, with the hub uid.
    pub(super) delete_acked: HashMap<ObjectKey, String>,
    /// Keys the agent reported gone after their delete, with the hub uid.
    pub gone: HashMap<ObjectKey, String>,
    /// Keys reported gone while their delete was on its way, with the hub
    /// uid of the delete: its acknowledgement completes it. (An agent that
    /// finds nothing to delete may say `gone` before it answers the delete;
    /// waiting for another `gone` would wait for ever.)
    pub(super) gone_before_ack: HashMap<ObjectKey, String>,
    /// Keys the hub knows nothing of that the agent's resync requests
    /// made it delete or release (what the agent says it has, not what the
    /// hub wants): at most [`MAX_REPAIR_REMOVALS`] at a time, dropped when
    /// the session ends (the next session's digest finds them again).
    pub(super) removals: HashSet<ObjectKey>,
}
