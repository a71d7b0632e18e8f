//! What an autonomous agent's reports make the hub hold for its cluster
//! (a mirror each, and the last report of each in memory), and the
//! per-cluster limits on it: one agent must not exhaust the hub's memory
//! or fill its etcd with mirrors.

use argocd_pull_proto::v1::ObjectKey;

use super::{ClusterState, Observation};

/// Per-cluster limits on autonomous mirrors (flags, docs/security.md).
#[derive(Clone, Copy, Debug)]
pub struct MirrorLimits {
    /// Mirrors (Applications reported) held for one cluster.
    pub max_objects: usize,
    /// Bytes of reports (Application and status JSON) held for one cluster.
    pub max_bytes: usize,
}

impl ClusterState {
    /// The mirrors held for this cluster other than `key`, and the bytes
    /// of their reports held in memory.
    pub fn held_besides(&self, key: &ObjectKey) -> (usize, usize) {
        let inner = self.lock();
        inner.observed.iter().filter(|(k, _)| *k != key).fold(
            (0, 0),
            |(n, bytes), (_, o)| match o {
                Observation::Observed { report, .. } => (n + 1, bytes + report.bytes),
                Observation::Mirrored { .. } => (n + 1, bytes),
                Observation::Gone => (n, bytes),
            },
        )
    }
}

/// Whether one more report of `bytes` fits next to `held` (see
/// [`ClusterState::held_besides`]); the refusal says which limit and how
/// to raise it.
pub fn check(
    cluster: &str,
    held: (usize, usize),
    bytes: usize,
    limits: MirrorLimits,
) -> Result<(), String> {
    let (objects, held_bytes) = held;
    if objects + 1 > limits.max_objects {
        return Err(format!(
            "cluster {cluster} already has {objects} Applications mirrored on the hub, the limit (--grpc-max-mirrors-per-cluster={}); this one is not mirrored until others are deleted on the cluster or the limit is raised",
            limits.max_objects
        ));
    }
    if held_bytes + bytes > limits.max_bytes {
        return Err(format!(
            "cluster {cluster}'s mirrored Applications would hold {} bytes on the hub, over the limit (--grpc-max-mirror-bytes-per-cluster={}); this one is not mirrored until others shrink or are deleted, or the limit is raised",
            held_bytes + bytes,
            limits.max_bytes
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_fits_until_either_limit_is_reached() {
        let limits = MirrorLimits {
            max_objects: 3,
            max_bytes: 100,
        };
        assert!(check("c", (2, 50), 50, limits).is_ok());
        let count = check("c", (3, 0), 1, limits).unwrap_err();
        assert!(
            count.contains("--grpc-max-mirrors-per-cluster=3"),
            "{count}"
        );
        let bytes = check("c", (1, 60), 41, limits).unwrap_err();
        assert!(bytes.contains("101 bytes"), "{bytes}");
        assert!(bytes.contains("--grpc-max-mirror-bytes-per-cluster=100"));
    }
}
