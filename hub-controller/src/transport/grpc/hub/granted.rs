//! The gRPC transport's view of the hub's record of what it authorized and
//! delivered ([`crate::authorized`]): what this replica holds of a
//! cluster's grants now, for everything derived from them (the projects
//! and credentials a cluster keeps, the commands sent to it, the resource
//! trees that open live views of it).

use std::sync::Arc;

use argocd_pull_proto::v1::ObjectKey;

use super::clusters::Clusters;
use super::routes::Routes;
use crate::authorized::{self, ClusterRecord, Grant, Records};
use crate::route::transport::Transport;

/// The record as the leader keeps it, the copies this replica delivered,
/// and the decisions every replica makes alike.
pub struct Granted {
    records: Option<Arc<Records>>,
    routes: Arc<Routes>,
    clusters: Arc<Clusters>,
}

impl Granted {
    /// Reads the leader's record from `records`, when given.
    pub fn new(
        routes: Arc<Routes>,
        clusters: Arc<Clusters>,
        records: Option<Arc<Records>>,
    ) -> Self {
        Self {
            records,
            routes,
            clusters,
        }
    }

    /// `cluster`'s record as this replica has it now: the recorded grants
    /// of this transport (the leader's Lease), those of the copies this
    /// replica delivered (newer, when both name a key), taken through the
    /// decisions of now ([`authorized::next`]).
    pub fn record(&self, cluster: &str) -> ClusterRecord {
        self.of(cluster, None)
    }

    /// The grant of `key` on `cluster` as [`Granted::record`] has it.
    pub fn grant(&self, cluster: &str, key: &ObjectKey) -> Option<Grant> {
        let spoke_key = (key.namespace.clone(), key.name.clone());
        self.of(cluster, Some(key)).remove(&spoke_key)
    }

    /// Whether the grant of `key` on `cluster` was made for the hub
    /// Application of uid `hub_uid`.
    pub fn owned_by(&self, cluster: &str, key: &ObjectKey, hub_uid: Option<&str>) -> bool {
        let grant = self.grant(cluster, key);
        hub_uid.is_some_and(|uid| grant.is_some_and(|g| g.owner == uid))
    }

    /// The record of `cluster`, of `only` that key when given.
    fn of(&self, cluster: &str, only: Option<&ObjectKey>) -> ClusterRecord {
        let spoke_key = |k: &ObjectKey| (k.namespace.clone(), k.name.clone());
        let leased = self.records.as_ref().map(|r| r.record(cluster).0);
        let mut recorded: ClusterRecord = match (&leased, only) {
            (None, _) => ClusterRecord::new(),
            (Some(r), None) => (**r).clone(),
            (Some(r), Some(k)) => r
                .get(&spoke_key(k))
                .map(|g| (spoke_key(k), g.clone()))
                .into_iter()
                .collect(),
        };
        recorded.retain(|_, g| g.transport == Transport::Grpc);
        if let Some(cs) = self.clusters.find(cluster) {
            let cs = cs.lock();
            let delivered: Vec<_> = match only {
                None => cs.desired.iter().collect(),
                Some(k) => cs.desired.get_key_value(k).into_iter().collect(),
            };
            recorded.extend(
                delivered
                    .into_iter()
                    .map(|(k, d)| (spoke_key(k), (*d.grant).clone())),
            );
        }
        // One key is decided now even when nothing records it yet.
        let keys: Vec<ObjectKey> = match only {
            Some(k) => vec![k.clone()],
            None => recorded
                .keys()
                .map(|(namespace, name)| ObjectKey {
                    namespace: namespace.clone(),
                    name: name.clone(),
                })
                .collect(),
        };
        authorized::next(&recorded, self.routes.grants_now(cluster, keys))
    }
}
