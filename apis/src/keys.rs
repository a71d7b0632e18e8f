//! Label, annotation and finalizer keys that existing users of OCM's
//! argocd-pull-integration already put on their objects. They are kept byte
//! for byte so that switching to argocd-pull needs no change to any
//! Application or ApplicationSet.

/// Label on a hub Application: opt in to the pull model (Go `ParseBool` values).
pub const PULL_LABEL: &str = "apps.open-cluster-management.io/pull-to-ocm-managed-cluster";
/// Annotation on a hub Application: the target ManagedCluster.
pub const MANAGED_CLUSTER: &str = "apps.open-cluster-management.io/ocm-managed-cluster";
/// Annotation on a hub Application: the Application's namespace on the spoke.
pub const MANAGED_CLUSTER_APP_NAMESPACE: &str =
    "apps.open-cluster-management.io/ocm-managed-cluster-app-namespace";
/// Annotation on a hub Application: overrides `spec.destination.name` in the delivered copy.
pub const DESTINATION_NAME: &str = "apps.open-cluster-management.io/destination-name";
/// Annotation on a hub Application: overrides `spec.destination.server` in the delivered copy.
pub const DESTINATION_SERVER: &str = "apps.open-cluster-management.io/destination-server";
/// Annotation keeping the hub's Argo CD off the dormant copy. Never delivered.
pub const SKIP_RECONCILE: &str = "argocd.argoproj.io/skip-reconcile";
/// Annotation asking Argo CD to refresh; must reach the spoke.
pub const REFRESH: &str = "argocd.argoproj.io/refresh";
/// Annotations on a ManifestWork pointing back at its hub Application.
pub const HUB_APP_NAMESPACE: &str = "apps.open-cluster-management.io/hub-application-namespace";
pub const HUB_APP_NAME: &str = "apps.open-cluster-management.io/hub-application-name";
/// Label (`"true"`) on a ManifestWork and delivered copy owned by an ApplicationSet.
pub const APPLICATION_SET_LABEL: &str = "apps.open-cluster-management.io/application-set";
/// Annotation (`namespace/name`) naming the owning ApplicationSet.
pub const HOSTING_APPLICATION_SET: &str = "apps.open-cluster-management.io/hosting-applicationset";
/// Argo CD's cascade-delete finalizer.
pub const RESOURCES_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";
/// Label marking an Argo CD cluster Secret.
pub const ARGOCD_SECRET_TYPE: &str = "argocd.argoproj.io/secret-type";
/// Label selecting the PlacementDecisions of a Placement.
pub const PLACEMENT_LABEL: &str = "cluster.open-cluster-management.io/placement";

/// Name of the OCM addon of the gRPC transport: its ManagedClusterAddOn in a
/// cluster's namespace on the hub says the cluster runs a spoke-agent, and
/// its client certificates name it (`...:addon:argocd-pull:agent:...`).
pub const ADDON_NAME: &str = "argocd-pull";
/// Annotation on a hub Application forcing its transport: `grpc` or
/// `manifestwork` (otherwise: gRPC where the addon is enabled).
pub const TRANSPORT: &str = "argocd-pull.io/transport";
/// Annotation on a hub Application where releases up to 0.1 kept a sync's
/// operation id; now removed when found (the id lives in the operation's
/// `info`, where an ApplicationSet does not rewrite it).
pub const SYNC_REQUEST: &str = "argocd-pull.io/sync-request";
/// Annotation on a hub Application where releases up to 0.1 kept a
/// refresh's operation id; now removed when found.
pub const REFRESH_REQUEST: &str = "argocd-pull.io/refresh-request";
/// Label on a read-only hub mirror of an autonomous agent's Application:
/// the cluster it mirrors.
pub const MIRROR_OF: &str = "argocd-pull.io/mirror-of";
/// Annotation on a mirror: `namespace/name` of the Application on the spoke.
pub const MIRROR_SOURCE: &str = "argocd-pull.io/mirror-source";
/// Label (`"true"`) on a spoke Application the spoke-agent manages for the hub.
pub const HUB_MANAGED: &str = "argocd-pull.io/hub-managed";
/// Annotation on a managed spoke Application: the uid of its hub Application.
pub const HUB_UID: &str = "argocd-pull.io/hub-uid";
/// Annotation on a managed spoke Application: the version of the hub's
/// desired state last applied.
pub const DESIRED_VERSION: &str = "argocd-pull.io/desired-version";
/// Annotation on a managed spoke Application: hash of its `.spec` as last
/// applied; a different hash means someone edited it locally.
pub const SPEC_HASH: &str = "argocd-pull.io/spec-hash";
/// Annotation on a spoke Application: ids of the last operations the
/// spoke-agent started on it (newest last), so none runs twice.
pub const OPERATION_IDS: &str = "argocd-pull.io/operation-ids";
/// Name of the `operation.info` entry that carries a sync's operation id,
/// as `<id> <hash of the operation without this entry>`. It lives in the
/// operation itself, not in an annotation: an ApplicationSet rewrites the
/// annotations of every Application it generates (a stamp there was wiped,
/// stamped anew and the sync sent again, found with a real Argo CD), but it
/// leaves `.operation` alone, and the entry goes with the operation onto the
/// managed cluster, where Argo CD copies it into `status.operationState`.
pub const OPERATION_ID_INFO: &str = "argocd-pull.io/operation-id";

/// The operation id stamped into an Application's `.operation`, if any.
pub fn stamped_operation_id(operation: &serde_json::Value) -> Option<&str> {
    operation
        .get("info")?
        .as_array()?
        .iter()
        .find(|i| i.get("name").and_then(serde_json::Value::as_str) == Some(OPERATION_ID_INFO))?
        .get("value")?
        .as_str()?
        .split(' ')
        .next()
}

/// Prefix of argocd-pull's own bookkeeping annotations, never delivered.
pub const OWN_PREFIX: &str = "argocd-pull.io/";

/// Go's `strconv.ParseBool` truth values, which the pull label accepts.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The Secret in the hub-controller's namespace holding the gRPC serving CA
/// (what agents trust the hub with).
pub const SERVING_CA_SECRET: &str = "argocd-pull-serving-ca";

/// The default ConfigMap of client certificates the hub refuses (the deny
/// list, `--grpc-denied-certificates`).
pub const DENY_LIST: &str = "argocd-pull-denied-certificates";

#[cfg(test)]
mod tests {
    use super::parse_bool;

    #[test]
    fn parse_bool_matches_go() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", " true", "2", "on"] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
    }
}
