//! The hub's record of what each cluster's agent holds over gRPC: for each
//! spoke Application, the hub Application the agent applied it for, as the
//! agent last reported. It is what lets every replica, and the ManifestWork
//! transport on the leader, tell a key already held over gRPC from one
//! merely claimed ([`crate::route::owner::owner_holding`]): without it, an
//! older hub Application moved onto a key held over gRPC became its owner,
//! and its work was applied over the agent's copy.
//!
//! One Lease per cluster (`argocd-pull-holders-<cluster>`, label
//! [`record::LABEL`]) in the hub-controller's namespace, where no tenant
//! writes. The replica that acts for the cluster writes it from its agent's
//! reports ([`Hub::keep_holders`](super::Hub::keep_holders)), only when
//! what the agent holds changed (a delivery or a delete, never a status);
//! every replica watches them all. It is kept across restarts and
//! disconnects: what a cluster holds does not change because the hub
//! stopped hearing from it.
//!
//! - [`record`]: the record, its JSON and how reports change it (pure);
//! - [`crate::lease_records`]: the view, the watch and the write.

pub mod record;

use argocd_pull_proto::v1::ObjectKey;

use crate::lease_records::{Kind, LeaseRecords};
use record::Record;

/// The records of what each cluster's agent holds, of every cluster.
pub type Holders = LeaseRecords<Held>;

/// The kind of [`Holders`].
pub struct Held;

impl Kind for Held {
    type Record = Record;
    const LABEL: &'static str = record::LABEL;
    const ANNOTATION: &'static str = record::ANNOTATION;
    const WHAT: &'static str = "the record of what agents hold";
    const UNLISTED: &'static str = "keys are decided by age until it is";

    fn lease_name(cluster: &str) -> String {
        record::lease_name(cluster)
    }

    fn encode(r: &Record) -> (String, usize) {
        (record::encode(r), 0)
    }

    fn decode(json: &str) -> Record {
        record::decode(json)
    }
}

impl Holders {
    /// The uid of the hub Application `cluster`'s agent holds `key` for,
    /// as recorded.
    pub fn held_by(&self, cluster: &str, key: &ObjectKey) -> Option<String> {
        self.record(cluster).0.get(key).cloned()
    }

    /// Calls `f` with a cluster and the keys whose recorded holder changed
    /// (set once).
    pub fn on_holders_change(&self, f: impl Fn(&str, &[ObjectKey]) + Send + Sync + 'static) {
        self.on_change(move |cluster, old, new| f(cluster, &record::changed(old, new)));
    }
}
