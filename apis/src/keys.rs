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

/// Go's `strconv.ParseBool` truth values, which the pull label accepts.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

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
