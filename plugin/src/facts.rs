//! What the plugin read from the hub, as plain data (no I/O): the same
//! facts the hub-controller routes with, so that `explain` decides with the
//! hub's own rule ([`argocd_pull_core::route::decide`]).

use std::collections::{BTreeMap, BTreeSet};

use argocd_pull_apis::argocd::ProjectSpec;
use argocd_pull_core::report::Report;
use argocd_pull_core::route::authz::Authorization;
use argocd_pull_core::route::decide::World;

/// One cluster's argocd-pull addon, as OCM reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addon {
    /// OCM's `Available` condition (its health check: the agent's
    /// Deployment is available), if set.
    pub available: Option<bool>,
}

/// A ManifestWork's state, as the work agent reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Its `Applied` condition, if set.
    pub applied: Option<bool>,
    /// The condition's message.
    pub message: String,
}

/// The hub's world as read once.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// ManagedClusters, with their `ManagedClusterConditionAvailable`.
    pub clusters: BTreeMap<String, Option<bool>>,
    /// Clusters with the argocd-pull addon enabled.
    pub addons: BTreeMap<String, Addon>,
    /// Clusters selected by the PlacementDecisions of each namespace.
    pub decided: BTreeMap<String, BTreeSet<String>>,
    /// What each replica reports, by replica name (those that answered).
    pub reports: Vec<Report>,
    /// Replicas whose report could not be read, with the error.
    pub unreachable: Vec<(String, String)>,
    /// The AppProjects in the hub's Argo CD namespace, by name (read when
    /// the hub enforces them).
    pub projects: BTreeMap<String, ProjectSpec>,
}

impl World for Snapshot {
    fn addon_enabled(&self, cluster: &str) -> bool {
        self.addons.contains_key(cluster)
    }
    fn cluster_exists(&self, cluster: &str) -> bool {
        self.clusters.contains_key(cluster)
    }
    fn decided_in(&self, ns: &str) -> Vec<String> {
        self.decided
            .get(ns)
            .map(|c| c.iter().cloned().collect())
            .unwrap_or_default()
    }
    fn project(&self, name: &str) -> Option<ProjectSpec> {
        self.projects.get(name).cloned()
    }
}

impl Snapshot {
    /// The serving replica's report (the Lease holder), if one was read.
    pub fn serving(&self) -> Option<&Report> {
        self.reports.iter().find(|r| r.serving)
    }

    /// The hub's authorization, from the serving replica's report; `None`
    /// when no serving replica answered.
    pub fn authorization(&self) -> Option<Authorization> {
        Some(self.serving()?.authorization.as_ref()?.authorization())
    }

    /// Whether the hub serves the gRPC transport (`false` when unknown).
    pub fn grpc_served(&self) -> bool {
        self.serving().is_some_and(|r| r.grpc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_pull_core::report::AuthorizationReport;

    #[test]
    fn the_world_answers_from_what_was_read() {
        let mut s = Snapshot::default();
        s.clusters.insert("c1".into(), Some(true));
        s.addons.insert("c1".into(), Addon::default());
        s.decided
            .insert("team-a".into(), ["c1".to_string()].into_iter().collect());
        assert!(s.cluster_exists("c1") && !s.cluster_exists("c2"));
        assert!(s.addon_enabled("c1") && !s.addon_enabled("c2"));
        assert_eq!(s.decided_in("team-a"), ["c1"]);
        assert!(s.decided_in("team-b").is_empty());
    }

    #[test]
    fn authorization_and_grpc_come_from_the_serving_replica() {
        let mut s = Snapshot::default();
        assert_eq!(s.authorization(), None);
        assert!(!s.grpc_served());
        s.reports.push(Report {
            replica: "standby".into(),
            ..Report::default()
        });
        s.reports.push(Report {
            replica: "leader".into(),
            serving: true,
            grpc: true,
            authorization: Some(AuthorizationReport {
                require_placement: false,
                allowed_targets: vec!["a=b".into()],
                app_projects: Some("argocd".into()),
            }),
            ..Report::default()
        });
        assert_eq!(s.serving().unwrap().replica, "leader");
        let auth = s.authorization().unwrap();
        assert!(!auth.require_placement);
        assert_eq!(auth.allow.len(), 1);
        assert_eq!(auth.projects.as_deref(), Some("argocd"));
        assert!(s.grpc_served());
    }
}
