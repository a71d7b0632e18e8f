//! Whether an Application's namespace may deploy to its target cluster.
//!
//! Without this check anyone who can create an Application in any namespace
//! could deploy to any managed cluster. Like the hardened downstream of
//! argocd-pull-integration, a namespace may target the clusters that a
//! PlacementDecision of a Placement in that same namespace selects (OCM's
//! own rule: a Placement only selects clusters from sets bound to its
//! namespace), plus whatever the operator allows explicitly.
//!
//! Authorization withdrawn (the Placement no longer selects the cluster)
//! stops delivery but deletes nothing: what was delivered stays as it was,
//! the hub copy says why, and deleting the hub Application still removes it
//! from the cluster. A Placement edited by mistake must not delete running
//! workloads.

/// One `--allowed-target` entry: `namespace=cluster`, either side may be `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowRule {
    pub namespace: String,
    pub cluster: String,
}

impl std::str::FromStr for AllowRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((ns, cluster)) if !ns.is_empty() && !cluster.is_empty() => Ok(AllowRule {
                namespace: ns.into(),
                cluster: cluster.into(),
            }),
            _ => Err(format!("{s:?} is not NAMESPACE=CLUSTER (either may be *)")),
        }
    }
}

impl AllowRule {
    fn matches(&self, namespace: &str, cluster: &str) -> bool {
        (self.namespace == "*" || self.namespace == namespace)
            && (self.cluster == "*" || self.cluster == cluster)
    }
}

/// How targets are checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authorization {
    /// Require a PlacementDecision (unless an allow rule matches).
    pub require_placement: bool,
    pub allow: Vec<AllowRule>,
    /// AppProjects are enforced ([`super::project`]), with this namespace
    /// (the hub's Argo CD's) as the control-plane namespace; `None` with
    /// `--app-projects=ignore`.
    pub projects: Option<String>,
}

/// The hub's Argo CD namespace by default.
pub const DEFAULT_ARGOCD_NAMESPACE: &str = "argocd";

impl Default for Authorization {
    fn default() -> Self {
        Self {
            require_placement: true,
            allow: Vec::new(),
            projects: Some(DEFAULT_ARGOCD_NAMESPACE.into()),
        }
    }
}

impl Authorization {
    /// Whether the allow rules alone settle it (no API call needed).
    pub fn allowed_without_placement(&self, namespace: &str, cluster: &str) -> bool {
        !self.require_placement || self.allow.iter().any(|r| r.matches(namespace, cluster))
    }

    /// The message for a refused target: what to create or configure.
    pub fn refusal(namespace: &str, cluster: &str) -> String {
        format!(
            "namespace {namespace:?} may not deploy to ManagedCluster {cluster:?}: no decision of a Placement in \
             {namespace:?} selects it; create a Placement in {namespace:?} that selects {cluster:?} (its \
             ManagedClusterSet must be bound to the namespace), or allow it with \
             --allowed-target {namespace}={cluster}. Anything delivered before stays on the cluster as it \
             was: changes are not delivered until the cluster is selected again, and deleting this \
             Application still deletes it there"
        )
    }
}

/// Whether any of the decided cluster lists contains `cluster`.
pub fn selected_by_placement<'a>(
    cluster: &str,
    decided: impl IntoIterator<Item = &'a String>,
) -> bool {
    decided.into_iter().any(|c| c == cluster)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_rules_parse_and_match() {
        let r: AllowRule = "argocd=*".parse().unwrap();
        assert!(r.matches("argocd", "anything"));
        assert!(!r.matches("team-a", "anything"));
        let r: AllowRule = "*=dev-1".parse().unwrap();
        assert!(r.matches("team-a", "dev-1"));
        assert!(!r.matches("team-a", "prod-1"));
        for bad in ["", "ns", "=c", "ns="] {
            assert!(bad.parse::<AllowRule>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn placement_is_required_unless_allowed_or_disabled() {
        let auth = Authorization::default();
        assert!(!auth.allowed_without_placement("team-a", "c1"));
        let auth = Authorization {
            allow: vec!["team-a=c1".parse().unwrap()],
            ..Default::default()
        };
        assert!(auth.allowed_without_placement("team-a", "c1"));
        assert!(!auth.allowed_without_placement("team-a", "c2"));
        let off = Authorization {
            require_placement: false,
            allow: vec![],
            projects: None,
        };
        assert!(off.allowed_without_placement("x", "y"));
    }

    #[test]
    fn selected_by_placement_matches_exact_names() {
        let decided = vec!["c1".to_string(), "c10".to_string()];
        assert!(selected_by_placement("c1", &decided));
        assert!(!selected_by_placement("c", &decided));
        assert!(Authorization::refusal("ns", "c").contains("--allowed-target ns=c"));
    }
}
