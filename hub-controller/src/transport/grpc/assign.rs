//! Pure: what one hub Application means for the gRPC transport, decided
//! from the watch caches' facts: delivered (with the exact bytes the agent
//! gets), refused (with the reason the condition shows), or not this
//! transport's. Its [`Assignment`] is what the gRPC index holds.

use std::sync::Arc;

use argocd_pull_apis::argocd::Application;
use argocd_pull_proto::content;
use argocd_pull_proto::limits;
use argocd_pull_proto::v1::{ObjectKey, ObjectMeta};
use kube::ResourceExt;

use super::render::grpc_copy;
use crate::compact::CompactJson;
pub use crate::route::HubRef;
pub use crate::route::decide::Facts;
use crate::route::decide::{Route, decide};
use crate::route::owner::Seniority;
use crate::route::target::Target;
use crate::route::transport::Transport;
use crate::status::Reason;

/// What the hub wants on a cluster for one key (managed mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub hub: HubRef,
    /// The copy delivered to the agent, compressed.
    pub json: CompactJson,
    /// Its uid is the hub Application's ([`Desired::hub_uid`]), its
    /// version the content version ([`Desired::version`]): each kept once.
    pub meta: ObjectMeta,
    /// The hub Application's creationTimestamp, in seconds: when two hub
    /// Applications name the same spoke Application and neither holds it
    /// yet, the older gets it.
    pub created: i64,
    /// What the hub authorized with this delivery, for its record
    /// ([`crate::authorized`]).
    pub grant: Arc<crate::authorized::Grant>,
}

impl Desired {
    pub fn hub_uid(&self) -> &str {
        &self.meta.uid
    }

    /// `<hub uid>.<content hash>`: changes with the content, and names the
    /// hub Application, so a delete can be addressed even after a restart.
    pub fn version(&self) -> &str {
        &self.meta.version
    }
}

/// The hub uid inside a desired version (see [`Desired::version`]).
pub fn uid_of_version(version: &str) -> Option<&str> {
    version
        .rsplit_once('.')
        .map(|(uid, _)| uid)
        .filter(|u| !u.is_empty())
}

/// What the gRPC transport does with one hub Application.
#[derive(Clone, Debug, PartialEq)]
pub enum Assignment {
    /// Not for the gRPC transport (not pulled, bad annotations, or delivered
    /// by ManifestWork). `target` is where it would go, when known, so that
    /// an agent still holding it can be told to let go. `by_work`: the
    /// ManifestWork transport delivers it there, so it claims that spoke
    /// Application too ([`crate::route::owner`]).
    NotOurs {
        target: Option<(String, ObjectKey)>,
        by_work: Option<Seniority>,
    },
    /// For the gRPC transport, but it cannot be delivered; the condition and
    /// event say why. What the agent already has is left alone.
    Refused {
        cluster: String,
        key: ObjectKey,
        reason: Reason,
        message: String,
    },
    /// Deliver (or, while the hub copy is being deleted, delete) it.
    Deliver {
        cluster: String,
        key: ObjectKey,
        desired: Arc<Desired>,
        deleting: bool,
    },
}

impl Assignment {
    /// The (cluster, key) it concerns, if any.
    pub fn slot(&self) -> Option<(&str, &ObjectKey)> {
        match self {
            Assignment::NotOurs { target, .. } => target.as_ref().map(|(c, k)| (c.as_str(), k)),
            Assignment::Refused { cluster, key, .. } | Assignment::Deliver { cluster, key, .. } => {
                Some((cluster.as_str(), key))
            }
        }
    }
}

/// Decides what the gRPC transport does with `app`, from its one route
/// ([`decide`]).
pub fn assign(app: &Application, facts: &Facts) -> Assignment {
    let route = decide(app, facts);
    let slot = |t: &Target| {
        (
            t.cluster.clone(),
            ObjectKey {
                namespace: t.app_namespace.clone(),
                name: app.name_any(),
            },
        )
    };
    let target = match route {
        Route::Deliver {
            transport: Transport::Grpc,
            target,
        } => target,
        Route::Refused {
            by: Transport::Grpc,
            target: Some(target),
            reason,
            message,
        } => {
            let (cluster, key) = slot(&target);
            return Assignment::Refused {
                cluster,
                key,
                reason,
                message,
            };
        }
        other => {
            let by_work = matches!(
                other,
                Route::Deliver {
                    transport: Transport::ManifestWork,
                    ..
                }
            )
            .then(|| Seniority::of(&app.metadata));
            return Assignment::NotOurs {
                target: other.target().map(slot),
                by_work,
            };
        }
    };
    let key = ObjectKey {
        namespace: target.app_namespace.clone(),
        name: app.name_any(),
    };
    delivery(app, target, key, facts)
}

/// Delivers `app` to `target` as `key`: the copy the agent gets, refused
/// when its bytes are over the limit of one object.
fn delivery(app: &Application, target: Target, key: ObjectKey, facts: &Facts) -> Assignment {
    let deleting = app.metadata.deletion_timestamp.is_some();
    let checked = facts
        .world
        .project_version(argocd_pull_apis::argocd::project_of(app))
        .unwrap_or_default();
    let grant = crate::authorized::grant(app, &target, Transport::Grpc, checked);
    let copy = grpc_copy(app, &target);
    let json = content::canonical(&copy);
    if let Err(e) = limits::check_object_json(
        &format!("Application {}/{}", key.namespace, key.name),
        json.len(),
    ) {
        return Assignment::Refused {
            cluster: target.cluster,
            key,
            reason: Reason::TooLarge,
            message: e.to_string(),
        };
    }
    Assignment::Deliver {
        cluster: target.cluster,
        key,
        desired: Arc::new(desired(app, &json, grant)),
        deleting,
    }
}

/// What the hub wants on the cluster for `app`, whose copy is `json`: the
/// copy compressed, and the hub Application's uid, versions and age.
fn desired(app: &Application, json: &[u8], grant: crate::authorized::Grant) -> Desired {
    let uid = app.metadata.uid.clone().unwrap_or_default();
    let version = format!("{uid}.{}", content::hash_bytes(json));
    Desired {
        hub: HubRef::of(app),
        meta: ObjectMeta {
            uid,
            resource_version: app.resource_version().unwrap_or_default(),
            generation: app.metadata.generation.unwrap_or_default(),
            version,
        },
        json: CompactJson::new(json),
        created: app
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        grant: Arc::new(grant),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::route::authz::Authorization;
    use argocd_pull_apis::keys;
    use serde_json::json;

    fn facts<'a>(
        addon: bool,
        authz: &'a Authorization,
        decided: &'static [&'static str],
    ) -> Facts<'a> {
        Facts {
            grpc_served: true,
            authorization: authz,
            world: Box::leak(Box::new(Fixed {
                addon,
                clusters: &["c1"],
                decided,
            })),
        }
    }

    #[test]
    fn assignment_table() {
        let authz = Authorization::default();
        let deliverable = app(json!({}));
        match assign(&deliverable, &facts(true, &authz, &["c1"])) {
            Assignment::Deliver {
                cluster,
                key: k,
                desired,
                deleting,
            } => {
                assert_eq!(
                    (cluster.as_str(), k, deleting),
                    ("c1", key("team", "guestbook"), false)
                );
                assert!(desired.version().starts_with("u-1."));
                assert_eq!(uid_of_version(desired.version()), Some("u-1"));
            }
            other => panic!("{other:?}"),
        }
        // No addon: the ManifestWork transport's, but its slot is known.
        assert_eq!(
            assign(&deliverable, &facts(false, &authz, &["c1"])),
            Assignment::NotOurs {
                target: Some(("c1".into(), key("team", "guestbook"))),
                by_work: Some(Seniority::of(&deliverable.metadata)),
            }
        );
        // Not selected by a Placement.
        assert!(matches!(
            assign(&deliverable, &facts(true, &authz, &[])),
            Assignment::Refused {
                reason: Reason::NotAuthorized,
                ..
            }
        ));
        // Deleting: deliver the delete whatever the Placement says now.
        let deleting = app(json!({ "metadata": { "deletionTimestamp": "2026-01-01T00:00:00Z" } }));
        assert!(matches!(
            assign(&deleting, &facts(true, &authz, &[])),
            Assignment::Deliver { deleting: true, .. }
        ));
        // Not pulled, or an annotation the ManifestWork side reports.
        let unpulled = app(json!({ "metadata": { "labels": { keys::PULL_LABEL: "false" } } }));
        assert_eq!(
            assign(&unpulled, &facts(true, &authz, &["c1"])),
            Assignment::NotOurs {
                target: None,
                by_work: None
            }
        );
        let forced =
            app(json!({ "metadata": { "annotations": { keys::TRANSPORT: "manifestwork" } } }));
        assert!(matches!(
            assign(&forced, &facts(true, &authz, &["c1"])),
            Assignment::NotOurs {
                target: Some(_),
                ..
            }
        ));
        // Too large for one object.
        let big = app(json!({ "spec": { "big": "x".repeat(limits::MAX_OBJECT_JSON_BYTES) } }));
        assert!(matches!(
            assign(&big, &facts(true, &authz, &["c1"])),
            Assignment::Refused {
                reason: Reason::TooLarge,
                ..
            }
        ));
    }

    #[test]
    fn the_version_moves_with_the_delivered_content_only() {
        let authz = Authorization::default();
        let v = |a: &Application| match assign(a, &facts(true, &authz, &["c1"])) {
            Assignment::Deliver { desired, .. } => desired.version().to_string(),
            other => panic!("{other:?}"),
        };
        let with_status = app(json!({ "status": { "health": { "status": "Healthy" } },
                                      "metadata": { "resourceVersion": "99" } }));
        assert_eq!(v(&app(json!({}))), v(&with_status));
        assert_ne!(
            v(&app(json!({}))),
            v(&app(json!({ "spec": { "project": "other" } })))
        );
    }
}
