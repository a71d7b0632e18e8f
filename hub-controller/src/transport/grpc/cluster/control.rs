//! What the hub sends an agent ahead of object messages, kept so that it
//! cannot grow with what the agent sends: acknowledgements in a queue the
//! session bounds, the digest a flag and resync requests bucket numbers
//! (both turned into messages when sent, see `next_messages`), and one
//! retry timer per message in flight.

use argocd_pull_proto::v1::{HubMessage, ObjectKey};
use prometheus_client::metrics::gauge::Gauge;

use super::ClusterState;

impl super::Inner {
    /// Queues `m` ahead of object messages (the caller wakes the sender).
    pub(super) fn push_control(&mut self, m: HubMessage) {
        self.control.push_back(m);
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
        self.lock().resync_buckets.extend(buckets);
        self.wake.notify_one();
    }

    /// Sends the digest of the desired set (as it is when sent).
    pub fn send_digest(&self) {
        self.lock().digest_due = true;
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
        self.lock().control.len()
    }

    /// Where the length of the queue is shown.
    pub fn set_control_gauge(&self, gauge: Gauge) {
        let mut inner = self.lock();
        inner.control_gauge = Some(gauge);
        inner.count_control();
    }

    /// Whether (key, seq) is in flight and not yet waiting to be sent
    /// again; if so it now is (the caller sends it again after a pause).
    /// However often the agent answers `RETRY`, one timer per key.
    pub fn schedule_retry(&self, key: &ObjectKey, seq: u64) -> bool {
        let mut inner = self.lock();
        if inner.in_flight.get(key).is_some_and(|(s, _, _)| *s == seq) {
            inner.retrying.insert(key.clone())
        } else {
            false
        }
    }
}
