//! Pure: the one routing decision of a hub Application, made the same way
//! for both transports: is it pulled, where does it go ([`super::target`]),
//! by which transport ([`super::transport`]), does the cluster exist, may
//! its namespace deploy there ([`super::authz`]), does its AppProject allow
//! it ([`super::project`]). Each transport acts on the
//! [`Route`] it gets: the one named in it delivers, or reports the refusal.

use argocd_pull_apis::argocd::{Application, ProjectSpec, project_of};
use kube::ResourceExt;

use super::authz::{Authorization, selected_by_placement};
use super::target::{Target, is_pulled, target};
use super::transport::{Transport, TransportError, choose};
use crate::status::Reason;

/// What the hub knows about the world, from its caches.
pub trait World {
    /// Whether the argocd-pull addon of `cluster` is enabled.
    fn addon_enabled(&self, cluster: &str) -> bool;
    /// Whether the ManagedCluster exists.
    fn cluster_exists(&self, cluster: &str) -> bool;
    /// Clusters the PlacementDecisions of namespace `ns` select.
    fn decided_in(&self, ns: &str) -> Vec<String>;
    /// The spec of AppProject `name` in the hub's Argo CD namespace, if it
    /// exists.
    fn project(&self, name: &str) -> Option<ProjectSpec>;
    /// The version of AppProject `name`, recorded with what a check of it
    /// allowed ([`crate::authorized`]).
    fn project_version(&self, _name: &str) -> Option<crate::authorized::ProjectVersion> {
        None
    }
}

/// The facts a decision rests on.
pub struct Facts<'a> {
    /// Whether this hub serves the gRPC transport.
    pub grpc_served: bool,
    pub authorization: &'a Authorization,
    pub world: &'a dyn World,
}

/// Where one hub Application goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Not a pull-model Application: no transport touches it.
    NotPulled,
    /// It cannot be delivered; `by` is the transport that shows why (its
    /// condition and Event), `target` where it would go when known.
    Refused {
        by: Transport,
        target: Option<Target>,
        reason: Reason,
        message: String,
    },
    /// `transport` delivers it to `target` (or, while the hub copy is being
    /// deleted, deletes it there: authorization withdrawn since delivery
    /// does not keep a copy on the cluster).
    Deliver {
        transport: Transport,
        target: Target,
    },
}

impl Route {
    /// The target, when known.
    pub fn target(&self) -> Option<&Target> {
        match self {
            Route::NotPulled => None,
            Route::Refused { target, .. } => target.as_ref(),
            Route::Deliver { target, .. } => Some(target),
        }
    }

    /// The transport that acts on the Application (delivers or reports).
    pub fn transport(&self) -> Option<Transport> {
        match self {
            Route::NotPulled => None,
            Route::Refused { by, .. } => Some(*by),
            Route::Deliver { transport, .. } => Some(*transport),
        }
    }
}

/// Decides the route of `app`.
pub fn decide(app: &Application, facts: &Facts) -> Route {
    if !is_pulled(app) {
        return Route::NotPulled;
    }
    // Bad annotations are the ManifestWork side's to report, whatever the
    // transport would have been.
    let refused = |by, target, reason, message: String| Route::Refused {
        by,
        target,
        reason,
        message,
    };
    let target = match target(app) {
        Ok(t) => t,
        Err(e) => {
            return refused(
                Transport::ManifestWork,
                None,
                Reason::InvalidAnnotation,
                e.to_string(),
            );
        }
    };
    let transport = match choose(
        app.metadata.annotations.as_ref(),
        facts.world.addon_enabled(&target.cluster),
        facts.grpc_served,
    ) {
        Ok(t) => t,
        Err(e) => {
            let reason = match e {
                TransportError::Invalid(_) => Reason::InvalidAnnotation,
                TransportError::GrpcDisabled => Reason::TransportUnavailable,
            };
            return refused(Transport::ManifestWork, Some(target), reason, e.to_string());
        }
    };
    if app.metadata.deletion_timestamp.is_some() {
        return Route::Deliver { transport, target };
    }
    if transport == Transport::ManifestWork && !facts.world.cluster_exists(&target.cluster) {
        // (An enabled addon implies the cluster.)
        let message = format!(
            "ManagedCluster {:?} does not exist: fix annotation {} or register the cluster with OCM",
            target.cluster,
            argocd_pull_apis::keys::MANAGED_CLUSTER
        );
        return refused(transport, Some(target), Reason::UnknownCluster, message);
    }
    let ns = app.namespace().unwrap_or_default();
    if !facts
        .authorization
        .allowed_without_placement(&ns, &target.cluster)
        && !selected_by_placement(&target.cluster, &facts.world.decided_in(&ns))
    {
        let message = Authorization::refusal(&ns, &target.cluster);
        return refused(transport, Some(target), Reason::NotAuthorized, message);
    }
    if let Some(control_plane) = &facts.authorization.projects {
        let name = project_of(app);
        let project = facts.world.project(name);
        if let Err(refusal) =
            super::project::check(app, &target, name, project.as_ref(), control_plane)
        {
            return refused(
                transport,
                Some(target),
                Reason::ProjectNotPermitted,
                refusal.to_string(),
            );
        }
    }
    Route::Deliver { transport, target }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use argocd_pull_apis::keys;
    use serde_json::json;

    fn route(app: &Application, grpc_served: bool, world: Fixed) -> Route {
        decide(
            app,
            &Facts {
                grpc_served,
                authorization: &Authorization::default(),
                world: &world,
            },
        )
    }

    fn reason(r: &Route) -> Option<(Transport, Reason)> {
        match r {
            Route::Refused { by, reason, .. } => Some((*by, *reason)),
            _ => None,
        }
    }

    #[test]
    fn one_decision_for_both_transports() {
        use Transport::*;
        let ok = Fixed {
            addon: false,
            clusters: &["c1"],
            decided: &["c1"],
        };
        let plain = app(json!({}));
        assert_eq!(
            route(&plain, true, ok).transport(),
            Some(ManifestWork),
            "no addon: by work"
        );
        let grpc = Fixed {
            addon: true,
            clusters: &[],
            decided: &["c1"],
        };
        assert_eq!(route(&plain, true, grpc).transport(), Some(Grpc));
        let unpulled = app(json!({ "metadata": { "labels": { keys::PULL_LABEL: "false" } } }));
        assert_eq!(route(&unpulled, true, ok_world()), Route::NotPulled);

        // (app, gRPC served, world) -> who reports what
        let no_cluster = Fixed {
            addon: false,
            clusters: &[],
            decided: &["c1"],
        };
        let unplaced = |addon| Fixed {
            addon,
            clusters: &["c1"],
            decided: &[],
        };
        let bad_target =
            app(json!({ "metadata": { "annotations": { keys::MANAGED_CLUSTER: "" } } }));
        let bad_transport =
            app(json!({ "metadata": { "annotations": { keys::TRANSPORT: "GRPC" } } }));
        let forced_grpc =
            app(json!({ "metadata": { "annotations": { keys::TRANSPORT: "grpc" } } }));
        let cases = [
            (
                &bad_target,
                true,
                ok_world(),
                (ManifestWork, Reason::InvalidAnnotation),
            ),
            (
                &bad_transport,
                true,
                ok_world(),
                (ManifestWork, Reason::InvalidAnnotation),
            ),
            (
                &forced_grpc,
                false,
                ok_world(),
                (ManifestWork, Reason::TransportUnavailable),
            ),
            (
                &plain,
                true,
                no_cluster,
                (ManifestWork, Reason::UnknownCluster),
            ),
            (
                &plain,
                true,
                unplaced(false),
                (ManifestWork, Reason::NotAuthorized),
            ),
            (&plain, true, unplaced(true), (Grpc, Reason::NotAuthorized)),
        ];
        for (i, (a, served, world, want)) in cases.into_iter().enumerate() {
            assert_eq!(reason(&route(a, served, world)), Some(want), "case {i}");
        }
    }

    #[test]
    fn the_project_is_checked_for_both_transports_once_the_target_is_authorized() {
        let other = app(json!({ "spec": { "project": "missing" } }));
        for (addon, by) in [(false, Transport::ManifestWork), (true, Transport::Grpc)] {
            let world = Fixed {
                addon,
                ..ok_world()
            };
            let r = route(&other, true, world);
            assert_eq!(reason(&r), Some((by, Reason::ProjectNotPermitted)));
            let Route::Refused { message, .. } = r else {
                unreachable!()
            };
            assert!(
                message.contains("project missing which does not exist"),
                "{message}"
            );
        }
        // Not enforced: delivered.
        let off = Authorization {
            projects: None,
            ..Default::default()
        };
        let r = decide(
            &other,
            &Facts {
                grpc_served: true,
                authorization: &off,
                world: &ok_world(),
            },
        );
        assert!(matches!(r, Route::Deliver { .. }), "{r:?}");
    }

    #[test]
    fn a_deletion_is_delivered_whatever_authorization_says_now() {
        let deleting = app(json!({ "metadata": { "deletionTimestamp": "2026-01-01T00:00:00Z" } }));
        let gone = Fixed {
            addon: false,
            clusters: &[],
            decided: &[],
        };
        assert!(matches!(
            route(&deleting, true, gone),
            Route::Deliver {
                transport: Transport::ManifestWork,
                ..
            }
        ));
    }

    pub fn ok_world() -> Fixed {
        Fixed {
            addon: false,
            clusters: &["c1"],
            decided: &["c1"],
        }
    }
}
