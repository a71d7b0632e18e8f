//! Where the hub keeps its record of what it authorized and delivered to
//! each cluster ([`argocd_pull_core::authorized`], re-exported here): one
//! Lease per cluster, `argocd-pull-authorized-<cluster>`, in the
//! hub-controller's own namespace ([`crate::lease_records`], label
//! [`LABEL`], the record as JSON in annotation [`ANNOTATION`]).
//!
//! Why there: no tenant writes in that namespace (tenants write their hub
//! Applications, spec and status alike, since the Application CRD has no
//! status subresource), and no cluster does (a klusterlet writes its
//! cluster's namespace: its works, its ManagedCluster's status; an agent
//! writes only through the hub-controller, which never copies a report
//! into this record). The leader writes it, from the decisions every
//! replica makes alike; every replica watches it; it outlives restarts,
//! which is what lets a copy kept on a cluster after a refusal keep the
//! project it was delivered with, and nothing else.

pub use argocd_pull_core::authorized::*;

use crate::lease_records::{Kind, LeaseRecords};

/// Label on the record Leases.
pub const LABEL: &str = "argocd-pull.io/authorized-record";
/// The record, as JSON ([`encode`]).
pub const ANNOTATION: &str = "argocd-pull.io/authorized";

/// The records of what the hub authorized, of every cluster.
pub type Records = LeaseRecords<Authorized>;

/// The kind of [`Records`].
pub struct Authorized;

impl Kind for Authorized {
    type Record = ClusterRecord;
    const LABEL: &'static str = LABEL;
    const ANNOTATION: &'static str = ANNOTATION;
    const WHAT: &'static str = "the record of what the hub authorized";
    const UNLISTED: &'static str = "copies kept after a refusal get no project until it is";

    fn lease_name(cluster: &str) -> String {
        format!("argocd-pull-authorized-{cluster}")
    }

    fn encode(record: &ClusterRecord) -> (String, usize) {
        encode(record)
    }

    fn decode(json: &str) -> ClusterRecord {
        decode(json)
    }
}

impl Records {
    /// Keeps `cluster`'s record as `record` over the version `version` of
    /// its Lease: an empty record deletes the Lease.
    pub async fn keep(
        &self,
        cluster: &str,
        record: &ClusterRecord,
        version: &str,
    ) -> Result<(), kube::Error> {
        match record.is_empty() {
            true => self.delete(cluster).await,
            false => self.write(cluster, record, version).await,
        }
    }
}
