//! `explain`'s sentences: why an Application is or is not delivered, step
//! by step, from what was read.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_core::render::work::work_name;
use argocd_pull_core::route::decide::Route;
use argocd_pull_core::route::transport::Transport;
use argocd_pull_core::status::condition::condition_of;
use serde::Serialize;
use serde_json::Value;

use super::{or_dash, status_str};
use crate::facts::{Snapshot, Work};

/// `explain`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub application: String,
    /// Whether the hub's rule delivers it and nothing reported stops it.
    pub delivered: bool,
    /// Why, step by step, in words.
    pub reasons: Vec<String>,
}

/// Why `app` is or is not delivered, given its `route` (decided with the
/// hub's rule on `snapshot`), its ManifestWork if that transport carries
/// it, and whether the authorization is the hub's own (`false`: no serving
/// replica answered, the default was assumed).
pub fn explain(
    app: &Application,
    route: &Route,
    snapshot: &Snapshot,
    work: Option<&Work>,
    authorization_known: bool,
) -> Explanation {
    let ns = app.metadata.namespace.clone().unwrap_or_default();
    let name = app.metadata.name.clone().unwrap_or_default();
    let mut reasons = Vec::new();
    let mut delivered = false;
    if !authorization_known {
        reasons.push(
            "no serving hub-controller replica could be read: the default authorization \
             (a Placement in the Application's namespace must select the cluster) and the \
             gRPC transport's absence are assumed"
                .to_string(),
        );
    }
    if app.metadata.deletion_timestamp.is_some() {
        reasons.push(
            "it is being deleted: argocd-pull removes it from the cluster, then lets the hub copy go"
                .into(),
        );
    }
    match route {
        Route::NotPulled => reasons.push(not_pulled(app)),
        Route::Refused {
            reason, message, ..
        } => reasons.push(format!("it cannot be delivered: {reason}: {message}")),
        Route::Deliver { transport, target } => {
            reasons.push(format!(
                "it goes to cluster {:?} as Application {}/{name} there, by the {} transport; \
                 namespace {ns:?} may deploy there",
                target.cluster,
                target.app_namespace,
                transport.name()
            ));
            let (reached, reason) = match transport {
                Transport::ManifestWork => {
                    let work_ref = format!("{}/{}", target.cluster, work_name(&ns, &name));
                    work_applied(&work_ref, work, snapshot, &target.cluster)
                }
                Transport::Grpc => agent_connected(snapshot, &target.cluster),
            };
            delivered = reached;
            reasons.push(reason);
        }
    }
    if let Some(reason) = reported_condition(app, route) {
        delivered = false;
        reasons.push(reason);
    }
    if !matches!(route, Route::NotPulled) {
        reasons.push(cluster_status(app));
    }
    Explanation {
        application: format!("{ns}/{name}"),
        delivered,
        reasons,
    }
}

/// Why an Application the hub's rule does not pull is not delivered: a
/// mirror of an autonomous cluster's Application, or one not labelled.
fn not_pulled(app: &Application) -> String {
    let mirror_of = app
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(keys::MIRROR_OF));
    match mirror_of {
        Some(cluster) => format!(
            "it is a read-only mirror of an Application an autonomous agent manages on cluster {cluster:?}: \
             change it on that cluster, not here"
        ),
        None => format!(
            "it is not labelled for the pull model: add label {}=true (and annotation {}=<cluster>)",
            keys::PULL_LABEL,
            keys::MANAGED_CLUSTER
        ),
    }
}

/// Whether the ManifestWork `work_ref` carrying the Application to
/// `cluster` is applied there, and why in words: delivered only once the
/// cluster's work agent has applied it.
fn work_applied(
    work_ref: &str,
    work: Option<&Work>,
    snapshot: &Snapshot,
    cluster: &str,
) -> (bool, String) {
    match work {
        None => (
            false,
            format!(
                "ManifestWork {work_ref} does not exist yet: the hub-controller has not \
                 written it (is it running and the Lease holder?)"
            ),
        ),
        Some(Work {
            applied: Some(true),
            ..
        }) => (
            true,
            format!("ManifestWork {work_ref} is applied by the cluster's work agent"),
        ),
        Some(w) => {
            let available = snapshot.clusters.get(cluster).copied().flatten();
            (
                false,
                format!(
                    "ManifestWork {work_ref} is not applied yet{}; the cluster's work agent \
                     applies it (ManagedCluster Available: {})",
                    if w.message.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", w.message)
                    },
                    available.map_or("Unknown".into(), |a| a.to_string())
                ),
            )
        }
    }
}

/// Whether an agent in managed mode on `cluster` is connected to a replica
/// that answered, and why in words: the gRPC transport delivers only to
/// such an agent.
fn agent_connected(snapshot: &Snapshot, cluster: &str) -> (bool, String) {
    let agent = snapshot.reports.iter().find_map(|r| {
        r.agents
            .iter()
            .find(|a| a.cluster == cluster)
            .map(|a| (r.replica.as_str(), a))
    });
    match agent {
        Some((replica, a)) if a.mode == "autonomous" => (
            false,
            format!(
                "the cluster's agent (on replica {replica}) runs in autonomous mode: the \
                 hub delivers nothing there; set the addon's AGENT_MODE to managed, or \
                 manage the Application on the cluster"
            ),
        ),
        Some((replica, a)) => (
            true,
            format!(
                "the cluster's agent is connected to replica {replica} (managed mode, version {})",
                if a.version.is_empty() {
                    "unknown"
                } else {
                    &a.version
                }
            ),
        ),
        None => {
            let addon = snapshot.addons.get(cluster);
            (
                false,
                format!(
                    "waiting for the cluster's agent: no replica that answered has it connected \
                     (OCM addon Available: {}); it is delivered when the agent connects",
                    addon
                        .and_then(|a| a.available)
                        .map_or("Unknown".into(), |a| a.to_string())
                ),
            )
        }
    }
}

/// The condition argocd-pull set on the Application, which stops its
/// delivery, unless it is the refusal the route explains already.
fn reported_condition(app: &Application, route: &Route) -> Option<String> {
    let status = app.data.get("status").cloned().unwrap_or(Value::Null);
    let condition = condition_of(&status)?;
    let same = matches!(route, Route::Refused { message, reason, .. }
        if condition == format!("{reason}: {message}"));
    (!same).then(|| format!("the hub reports on the Application: {condition}"))
}

/// The sync and health the cluster last reported, in words.
fn cluster_status(app: &Application) -> String {
    match (
        status_str(app, "/sync/status"),
        status_str(app, "/health/status"),
    ) {
        (None, None) => "no status from the cluster yet".into(),
        (sync, health) => format!(
            "on the cluster: sync {}, health {}{}",
            or_dash(sync),
            or_dash(health),
            status_str(app, "/sync/revision")
                .map(|r| format!(", revision {r}"))
                .unwrap_or_default()
        ),
    }
}
