//! What the hub sends an agent ahead of object messages, kept so that it
//! cannot grow with what the agent sends: acknowledgements in a queue the
//! session bounds, the digest a flag and resync requests bucket numbers
//! (both turned into messages when sent, see `next_messages`), and one
//! retry timer per message in flight.

use std::collections::{BTreeSet, VecDeque};

use argocd_pull_proto::v1::{HubMessage, ObjectKey};
use prometheus_client::metrics::gauge::Gauge;

use super::ClusterState;

impl super::Inner {
    /// Queues `m` ahead of object messages (the caller wakes the sender).
    pub(super) fn push_control(&mut self, m: HubMessage) {
        self.control.messages.push_back(m);
        self.count_control();
    }
}

impl ClusterState {
    /// Asks the agent for its observed entries of one bucket again.
    pub fn request_resync(&self, bucket: u32) {
        self.request_resyncs(&[bucket]);
    }

    /// Asks the agent for its observed entries of `buckets` again; the
    /// requests carry the replica as it is when they are sent.
    pub fn request_resyncs(&self, buckets: &[u32]) {
        self.lock().control.resync_buckets.extend(buckets);
        self.wake.notify_one();
    }

    /// Sends the digest of the desired set (as it is when sent).
    pub fn send_digest(&self) {
        self.lock().control.digest_due = true;
        self.wake.notify_one();
    }

    /// Queues an acknowledgement. The session reads the agent's next
    /// message only when [`Self::control_len`] is below its bound.
    pub fn control(&self, m: HubMessage) {
        self.lock().push_control(m);
        self.wake.notify_one();
    }

    /// Acknowledgements waiting to be sent.
    pub fn control_len(&self) -> usize {
        self.lock().control.messages.len()
    }

    /// Where the length of the queue is shown.
    pub fn set_control_gauge(&self, gauge: Gauge) {
        let mut inner = self.lock();
        inner.control.gauge = Some(gauge);
        inner.count_control();
    }

    /// Whether (key, seq) is in flight and not yet waiting to be sent
    /// again; if so it now is (the caller sends it again after a pause).
    /// However often the agent answers `RETRY`, one timer per key.
    pub fn schedule_retry(&self, key: &ObjectKey, seq: u64) -> bool {
        let mut inner = self.lock();
        if inner
            .sending
            .in_flight
            .get(key)
            .is_some_and(|(s, _, _)| *s == seq)
        {
            inner.sending.retrying.insert(key.clone())
        } else {
            false
        }
    }
}

/// What the hub sends ahead of object messages.
#[derive(Default)]
pub(super) struct Control {
    /// Acknowledgements; the session bounds them (`--grpc-control-queue`).
    pub(super) messages: VecDeque<HubMessage>,
    /// Shows how many `messages` wait.
    pub(super) gauge: Option<Gauge>,
    /// The digest of the desired set is to be sent (computed when sent).
    pub(super) digest_due: bool,
    /// Buckets of the observed set to ask the agent for again (the
    /// requests are built from the replica when sent).
    pub(super) resync_buckets: BTreeSet<u32>,
}
