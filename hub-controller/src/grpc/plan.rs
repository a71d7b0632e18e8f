//! Pure decisions of the gRPC transport on the hub: what a hub Application
//! means for its cluster's agent, which commands (sync, refresh) it carries,
//! what status to write back, and what a read-only mirror looks like. No
//! client, no I/O: the callers in this module feed them cached objects.

use std::sync::Arc;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::limits;
use argocd_pull_proto::v1::{ObjectKey, ObjectMeta, RefreshKind};
use kube::ResourceExt;
use serde_json::{Map, Value, json};

use crate::delivery::authz::Authorization;
use crate::delivery::delivered_copy;
use crate::delivery::target::{is_pulled, target};
use crate::delivery::transport::{Transport, choose};
use crate::status::Reason;
use crate::status::condition::{owned_status, set_condition};

/// A hub Application, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HubRef {
    pub namespace: String,
    pub name: String,
}

impl HubRef {
    pub fn of<K: kube::Resource>(app: &K) -> Self {
        Self {
            namespace: app.namespace().unwrap_or_default(),
            name: app.name_any(),
        }
    }
}

impl std::fmt::Display for HubRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the hub wants on a cluster for one key (managed mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub hub: HubRef,
    pub hub_uid: String,
    /// `<hub uid>.<content hash>`: changes with the content, and names the
    /// hub Application, so a delete can be addressed even after a restart.
    pub version: String,
    pub json: Arc<Vec<u8>>,
    pub meta: ObjectMeta,
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
    /// an agent still holding it can be told to let go.
    NotOurs { target: Option<(String, ObjectKey)> },
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
            Assignment::NotOurs { target } => target.as_ref().map(|(c, k)| (c.as_str(), k)),
            Assignment::Refused { cluster, key, .. } | Assignment::Deliver { cluster, key, .. } => {
                Some((cluster.as_str(), key))
            }
        }
    }
}

/// What the hub knows about the world, from its caches.
pub struct Facts<'a> {
    pub grpc_served: bool,
    pub addon_enabled: &'a dyn Fn(&str) -> bool,
    pub authorization: &'a Authorization,
    /// Clusters the PlacementDecisions of a namespace select.
    pub decided_in: &'a dyn Fn(&str) -> Vec<String>,
}

/// Decides what the gRPC transport does with `app`.
pub fn assign(app: &Application, facts: &Facts) -> Assignment {
    if !is_pulled(app) {
        return Assignment::NotOurs { target: None };
    }
    let Ok(target) = target(app) else {
        // The ManifestWork side reports bad annotations for every transport.
        return Assignment::NotOurs { target: None };
    };
    let key = ObjectKey {
        namespace: target.app_namespace.clone(),
        name: app.name_any(),
    };
    let slot = Some((target.cluster.clone(), key.clone()));
    match choose(
        app.metadata.annotations.as_ref(),
        (facts.addon_enabled)(&target.cluster),
        facts.grpc_served,
    ) {
        Ok(Transport::Grpc) => {}
        _ => return Assignment::NotOurs { target: slot },
    }
    let deleting = app.metadata.deletion_timestamp.is_some();
    let ns = app.namespace().unwrap_or_default();
    if !deleting
        && !facts
            .authorization
            .allowed_without_placement(&ns, &target.cluster)
        && !crate::delivery::authz::selected_by_placement(&target.cluster, &(facts.decided_in)(&ns))
    {
        return Assignment::Refused {
            cluster: target.cluster.clone(),
            key,
            reason: Reason::NotAuthorized,
            message: Authorization::refusal(&ns, &target.cluster),
        };
    }
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
    let uid = app.metadata.uid.clone().unwrap_or_default();
    let version = format!("{uid}.{}", content::hash_bytes(&json));
    let desired = Desired {
        hub: HubRef::of(app),
        hub_uid: uid.clone(),
        meta: ObjectMeta {
            uid,
            resource_version: app.resource_version().unwrap_or_default(),
            generation: app.metadata.generation.unwrap_or_default(),
            version: version.clone(),
        },
        version,
        json: Arc::new(json),
    };
    Assignment::Deliver {
        cluster: target.cluster,
        key,
        desired: Arc::new(desired),
        deleting,
    }
}

/// The delivered copy as the gRPC transport sends it: the shared delivered
/// copy without `.operation` and the refresh annotation (both travel as
/// commands, run exactly once) and without argocd-pull's bookkeeping.
pub fn grpc_copy(app: &Application, target: &crate::delivery::target::Target) -> Value {
    let mut copy = delivered_copy(app, target);
    if let Value::Object(map) = &mut copy {
        map.remove("operation");
    }
    if let Some(Value::Object(a)) = copy.pointer_mut("/metadata/annotations") {
        a.retain(|k, _| k != keys::REFRESH && !k.starts_with(keys::OWN_PREFIX));
        if a.is_empty()
            && let Some(Value::Object(m)) = copy.pointer_mut("/metadata")
        {
            m.remove("annotations");
        }
    }
    copy
}

// ---------------------------------------------------------------------------
// Commands

/// A command the hub Application carries, ready to send once stamped.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Sync(Value),
    Refresh(RefreshKind),
}

/// Name of the `operation.info` entry that carries a sync's operation id,
/// as `<id> <hash of the operation without this entry>`. It lives in the
/// operation itself, not in an annotation: an ApplicationSet rewrites the
/// annotations of every Application it generates (a stamp there was wiped,
/// stamped anew and the sync sent again, found with a real Argo CD), but it
/// leaves `.operation` alone, and the entry goes with the operation.
pub const OPERATION_ID_INFO: &str = "argocd-pull.io/operation-id";

/// What the hub Application needs for its commands.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommandPlan {
    /// A merge patch to write before anything is sent: the sync's id into
    /// its operation (so that a restarted hub sends the same id and the
    /// agent runs it only once), or a leftover stamp of an older release
    /// out of the annotations.
    pub stamp: Option<Value>,
    /// Commands ready to send, by operation id.
    pub ready: Vec<(String, Command)>,
}

fn annotation<'a>(app: &'a Application, key: &str) -> Option<&'a str> {
    app.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The operation without our id entry, and that entry's value.
fn split_operation(op: &Value) -> (Value, Option<String>) {
    let mut bare = op.clone();
    let mut stamp = None;
    if let Some(info) = bare.get_mut("info").and_then(Value::as_array_mut) {
        info.retain(|i| {
            let ours = i.get("name").and_then(Value::as_str) == Some(OPERATION_ID_INFO);
            if ours {
                stamp = i.get("value").and_then(Value::as_str).map(str::to_string);
            }
            !ours
        });
        if info.is_empty() {
            bare.as_object_mut().map(|m| m.remove("info"));
        }
    }
    (bare, stamp)
}

/// Reads the commands of `app`. A sync's id is `<uid>.sync.<resourceVersion>`
/// of the version it was first seen in: unique, never reused, kept in the
/// operation. A refresh is idempotent and carries no stamp: its id is
/// `refresh_id` (the one already in flight for this Application) or a new
/// `<uid>.refresh.<resourceVersion>`; a restarted hub may refresh once more.
pub fn commands(app: &Application, refresh_id: Option<&str>) -> CommandPlan {
    let mut plan = CommandPlan::default();
    let uid = app.metadata.uid.clone().unwrap_or_default();
    let rv = app.resource_version().unwrap_or_default();

    if let Some(op) = app.data.get("operation").filter(|o| !o.is_null()) {
        let (bare, stamp) = split_operation(op);
        let hash = content::hash(&bare);
        match stamp.as_deref().and_then(|s| s.split_once(' ')) {
            Some((id, h)) if h == hash => {
                plan.ready.push((id.to_string(), Command::Sync(op.clone())));
            }
            _ => {
                let mut info: Vec<Value> = bare
                    .get("info")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                info.push(json!({
                    "name": OPERATION_ID_INFO,
                    "value": format!("{uid}.sync.{rv} {hash}"),
                }));
                plan.stamp = Some(json!({
                    "metadata": { "resourceVersion": rv },
                    "operation": { "info": info },
                }));
                return plan;
            }
        }
    }
    let legacy: Vec<&str> = [keys::SYNC_REQUEST, keys::REFRESH_REQUEST]
        .into_iter()
        .filter(|k| annotation(app, k).is_some())
        .collect();
    if !legacy.is_empty() {
        let annotations: Map<String, Value> = legacy
            .iter()
            .map(|k| (k.to_string(), Value::Null))
            .collect();
        plan.stamp = Some(json!({ "metadata": {
            "resourceVersion": rv, "annotations": annotations } }));
        plan.ready.clear();
        return plan;
    }

    if let Some(value) = annotation(app, keys::REFRESH) {
        let kind = match value {
            "hard" => RefreshKind::Hard,
            _ => RefreshKind::Normal,
        };
        let id = refresh_id
            .map(str::to_string)
            .unwrap_or_else(|| format!("{uid}.refresh.{rv}"));
        plan.ready.push((id, Command::Refresh(kind)));
    }
    plan
}

pub fn refresh_name(kind: RefreshKind) -> &'static str {
    match kind {
        RefreshKind::Hard => "hard",
        _ => "normal",
    }
}

/// The merge patch that removes a delivered command from the hub
/// Application. It carries the resourceVersion the command was read from,
/// so it fails (and is decided again) rather than remove a newer command
/// someone set meanwhile. `None` when the Application no longer carries
/// this command.
pub fn completion_patch(app: &Application, id: &str, command: &Command) -> Option<Value> {
    let rv = app.resource_version()?;
    match command {
        Command::Sync(_) => {
            let op = app.data.get("operation").filter(|o| !o.is_null())?;
            let (_, stamp) = split_operation(op);
            if stamp
                .as_deref()
                .and_then(|s| s.split_once(' '))
                .map(|(i, _)| i)
                != Some(id)
            {
                return None;
            }
            Some(json!({ "metadata": { "resourceVersion": rv }, "operation": null }))
        }
        Command::Refresh(_) => {
            annotation(app, keys::REFRESH)?;
            Some(json!({ "metadata": { "resourceVersion": rv,
                                       "annotations": { keys::REFRESH: null } } }))
        }
    }
}

// ---------------------------------------------------------------------------
// Status

/// The status to write onto a hub Application from the spoke's observed
/// status (when there is one) and argocd-pull's condition (when something
/// is wrong). `None` when nothing is to be written.
///
/// Like the ManifestWork transport, a new sync that the spoke already
/// finished is shown as `Progressing` once before its real health, so that
/// ApplicationSet RollingSync sees the transition even when coalescing
/// skipped the spoke's own `Progressing`; the write of the real health
/// follows when the hub copy shows the `Progressing`.
pub fn hub_status(current: &Value, observed: Option<&Value>, condition: Option<String>) -> Value {
    let mut status = match observed {
        Some(Value::Object(o)) => Value::Object(o.clone()),
        Some(_) => json!({}),
        None => owned_status(current),
    };
    if observed.is_some() {
        crate::status::progress::show_progressing_first(current, &mut status);
    }
    set_condition(&mut status, condition);
    if status.as_object().is_some_and(Map::is_empty) {
        // An empty status would be applied as `status: null`, which the
        // schema refuses; an empty condition list says the same.
        status["conditions"] = json!([]);
    }
    status
}

/// argocd-pull's condition message in a status, if any.
pub use crate::status::condition::condition_of;

// ---------------------------------------------------------------------------
// Autonomous mirrors

/// Annotation on a mirror: the version of the agent's report it shows.
pub const MIRROR_VERSION: &str = "argocd-pull.io/observed-version";

/// The read-only hub mirror of an autonomous agent's Application: in the
/// namespace named after the cluster, kept off the hub's Argo CD, pointing
/// at the cluster by name, without finalizers (deleting a mirror must never
/// wait for anything) and without `.operation` (the hub asks for syncs
/// through commands).
pub fn mirror(cluster: &str, key: &ObjectKey, app: &Value, status: &Value, version: &str) -> Value {
    let meta = app.get("metadata").cloned().unwrap_or_default();
    let mut labels: Map<String, Value> = meta
        .get("labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    labels.insert(keys::MIRROR_OF.into(), cluster.into());
    let mut annotations: Map<String, Value> = meta
        .get("annotations")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    annotations.retain(|k, _| k != keys::REFRESH && !k.starts_with(keys::OWN_PREFIX));
    annotations.insert(keys::SKIP_RECONCILE.into(), "true".into());
    annotations.insert(
        keys::MIRROR_SOURCE.into(),
        format!("{}/{}", key.namespace, key.name).into(),
    );
    annotations.insert(MIRROR_VERSION.into(), version.into());

    let mut spec = app.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(Value::Object(dest)) = spec.get_mut("destination") {
        // Seen from the hub, the spoke's in-cluster destination is the cluster.
        dest.remove("server");
        dest.insert("name".into(), cluster.into());
    }
    // Lets a restarted hub tell an edited mirror from an intact one.
    annotations.insert(keys::SPEC_HASH.into(), content::hash(&spec).into());
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": key.name,
            "namespace": cluster,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": status,
    })
}

/// Whether the mirror on the hub shows what `wanted` says: the fields the
/// mirror owns (spec, status, its labels and annotations). Annotations the
/// hub adds on its own (a refresh request, command stamps) are not edits.
pub fn mirror_matches(current: &Application, wanted: &Value) -> bool {
    let current_json = serde_json::to_value(current).unwrap_or_default();
    if current_json.get("spec") != wanted.get("spec")
        || current_json.get("status").unwrap_or(&Value::Null)
            != wanted.get("status").unwrap_or(&Value::Null)
    {
        return false;
    }
    for field in ["labels", "annotations"] {
        let have = current_json.pointer(&format!("/metadata/{field}"));
        if let Some(Value::Object(want)) = wanted.pointer(&format!("/metadata/{field}")) {
            for (k, v) in want {
                if have.and_then(|h| h.get(k)) != Some(v) {
                    return false;
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(extra: Value) -> Application {
        let mut v = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {
                "name": "guestbook", "namespace": "team", "uid": "u-1", "resourceVersion": "7",
                "labels": { keys::PULL_LABEL: "true" },
                "annotations": { keys::MANAGED_CLUSTER: "c1" },
            },
            "spec": { "project": "default", "destination": { "namespace": "gb" } }
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(base: &mut Value, extra: Value) {
        match (base, extra) {
            (Value::Object(b), Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    fn facts<'a>(addon: bool, authz: &'a Authorization, decided: &'a [&'a str]) -> Facts<'a> {
        let addon_enabled: &'a dyn Fn(&str) -> bool = if addon { &|_| true } else { &|_| false };
        Facts {
            grpc_served: true,
            addon_enabled,
            authorization: authz,
            decided_in: Box::leak(Box::new(move |_: &str| {
                decided.iter().map(|s| s.to_string()).collect::<Vec<_>>()
            })),
        }
    }

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: ns.into(),
            name: name.into(),
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
                assert!(desired.version.starts_with("u-1."));
                assert_eq!(uid_of_version(&desired.version), Some("u-1"));
            }
            other => panic!("{other:?}"),
        }
        // No addon: the ManifestWork transport's, but its slot is known.
        assert_eq!(
            assign(&deliverable, &facts(false, &authz, &["c1"])),
            Assignment::NotOurs {
                target: Some(("c1".into(), key("team", "guestbook")))
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
            Assignment::NotOurs { target: None }
        );
        let forced =
            app(json!({ "metadata": { "annotations": { keys::TRANSPORT: "manifestwork" } } }));
        assert!(matches!(
            assign(&forced, &facts(true, &authz, &["c1"])),
            Assignment::NotOurs { target: Some(_) }
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
    fn the_grpc_copy_carries_no_commands_or_bookkeeping() {
        let a = app(json!({
            "metadata": { "annotations": {
                keys::REFRESH: "hard", keys::SYNC_REQUEST: "x y", "keep": "me" } },
            "operation": { "sync": {} }
        }));
        let t = target(&a).unwrap();
        let copy = grpc_copy(&a, &t);
        assert!(copy.get("operation").is_none());
        assert_eq!(copy["metadata"]["annotations"], json!({ "keep": "me" }));
        // The version moves with the content only.
        let authz = Authorization::default();
        let v = |a: &Application| match assign(a, &facts(true, &authz, &["c1"])) {
            Assignment::Deliver { desired, .. } => desired.version.clone(),
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

    #[test]
    fn a_sync_is_stamped_in_its_operation_then_sent_then_removed() {
        let op =
            json!({ "sync": { "revision": "abc" }, "info": [{ "name": "why", "value": "test" }] });
        let fresh = app(json!({ "operation": op }));
        let plan = commands(&fresh, None);
        assert!(plan.ready.is_empty());
        let stamp = plan.stamp.unwrap();
        assert_eq!(stamp["metadata"]["resourceVersion"], "7");
        let info = stamp["operation"]["info"].as_array().unwrap();
        assert_eq!(
            info[0],
            json!({ "name": "why", "value": "test" }),
            "others' info stays"
        );
        assert_eq!(info[1]["name"], OPERATION_ID_INFO);
        let value = info[1]["value"].as_str().unwrap();
        assert!(value.starts_with("u-1.sync.7 "), "{value}");

        // What the API server shows after the stamp: ready, same id later
        // (a restarted hub, or an ApplicationSet rewriting annotations).
        let mut stamped_op = op.clone();
        stamped_op["info"] = json!(info);
        let stamped = app(json!({ "operation": stamped_op,
            "metadata": { "resourceVersion": "8", "annotations": { "rewritten": "by-appset" } } }));
        let plan = commands(&stamped, None);
        assert_eq!(plan.stamp, None);
        assert_eq!(
            plan.ready,
            vec![("u-1.sync.7".to_string(), Command::Sync(stamped_op.clone()))]
        );
        let patch =
            completion_patch(&stamped, "u-1.sync.7", &Command::Sync(stamped_op.clone())).unwrap();
        assert_eq!(
            patch,
            json!({ "metadata": { "resourceVersion": "8" }, "operation": null })
        );
        assert!(
            completion_patch(&stamped, "other-id", &Command::Sync(stamped_op.clone())).is_none()
        );

        // The operation changed under the stamp: stamped anew.
        let mut changed = stamped_op.clone();
        changed["sync"]["revision"] = json!("def");
        let plan = commands(&app(json!({ "operation": changed })), None);
        assert!(plan.ready.is_empty());
        let info = plan.stamp.unwrap()["operation"]["info"].clone();
        assert_eq!(
            info.as_array().unwrap().len(),
            2,
            "the old stamp replaced, not added: {info}"
        );

        // A stamp of an older release (an annotation) is cleaned up first.
        let leftover = app(json!({ "metadata": { "annotations": { keys::SYNC_REQUEST: "x y" } } }));
        assert_eq!(
            commands(&leftover, None).stamp,
            Some(json!({ "metadata": { "resourceVersion": "7",
                "annotations": { keys::SYNC_REQUEST: null } } }))
        );
    }

    #[test]
    fn a_refresh_keeps_the_id_in_flight_and_is_removed_when_done() {
        let a = app(json!({ "metadata": { "annotations": { keys::REFRESH: "hard" } } }));
        let plan = commands(&a, None);
        assert_eq!(plan.stamp, None);
        assert_eq!(
            plan.ready,
            vec![(
                "u-1.refresh.7".to_string(),
                Command::Refresh(RefreshKind::Hard)
            )]
        );
        let later = commands(&a, Some("u-1.refresh.3"));
        assert_eq!(later.ready[0].0, "u-1.refresh.3");
        assert_eq!(
            completion_patch(&a, "u-1.refresh.3", &Command::Refresh(RefreshKind::Hard)),
            Some(json!({ "metadata": { "resourceVersion": "7",
                "annotations": { keys::REFRESH: null } } }))
        );
        assert!(commands(&app(json!({})), None).ready.is_empty());
    }

    #[test]
    fn status_is_the_spoke_status_with_our_condition() {
        let observed = json!({
            "health": { "status": "Degraded" }, "sync": { "status": "Synced" },
            "resources": [{ "kind": "Deployment" }],
            "conditions": [{ "type": "SyncError", "message": "x" }]
        });
        let s = hub_status(&json!({}), Some(&observed), None);
        assert_eq!(s, observed);
        let s = hub_status(
            &json!({}),
            Some(&observed),
            Some("RejectedByAgent: no".into()),
        );
        assert_eq!(condition_of(&s), Some("RejectedByAgent: no"));
        assert_eq!(s["conditions"].as_array().unwrap().len(), 2);
        // Nothing observed yet: keep what is there, change only the condition.
        let current = json!({ "health": { "status": "Healthy" }, "summary": {} });
        let s = hub_status(&current, None, Some("NotAuthorized: x".into()));
        assert_eq!(s["health"], json!({ "status": "Healthy" }));
        assert!(s.get("summary").is_none());
        assert_eq!(
            hub_status(&json!({}), None, None),
            json!({ "conditions": [] })
        );
    }

    #[test]
    fn a_finished_new_sync_shows_progressing_first() {
        let current = json!({ "health": { "status": "Healthy" },
                              "operationState": { "startedAt": "T1" } });
        let observed = json!({ "health": { "status": "Healthy" },
                               "operationState": { "startedAt": "T2", "phase": "Succeeded" } });
        let first = hub_status(&current, Some(&observed), None);
        assert_eq!(first["health"]["status"], "Progressing");
        assert_eq!(first["operationState"]["startedAt"], "T2");
        let second = hub_status(&first, Some(&observed), None);
        assert_eq!(second["health"]["status"], "Healthy");
        assert_eq!(hub_status(&second, Some(&observed), None), second);
    }

    #[test]
    fn mirrors_are_read_only_copies_in_the_cluster_namespace() {
        let spoke = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "local", "namespace": "argocd",
                "labels": { "team": "a" },
                "annotations": { keys::REFRESH: "normal", keys::OPERATION_IDS: "x", "note": "n" },
                "finalizers": [keys::RESOURCES_FINALIZER] },
            "spec": { "project": "default",
                      "destination": { "server": "https://kubernetes.default.svc", "namespace": "x" } }
        });
        let status = json!({ "health": { "status": "Healthy" } });
        let m = mirror("c1", &key("argocd", "local"), &spoke, &status, "v1");
        assert_eq!(m["metadata"]["namespace"], "c1");
        assert_eq!(m["metadata"]["labels"][keys::MIRROR_OF], "c1");
        assert_eq!(m["metadata"]["annotations"][keys::SKIP_RECONCILE], "true");
        assert_eq!(
            m["metadata"]["annotations"][keys::MIRROR_SOURCE],
            "argocd/local"
        );
        assert!(m["metadata"]["annotations"].get(keys::REFRESH).is_none());
        assert!(
            m["metadata"]["annotations"]
                .get(keys::OPERATION_IDS)
                .is_none()
        );
        assert!(m["metadata"].get("finalizers").is_none());
        assert_eq!(
            m["spec"]["destination"],
            json!({ "name": "c1", "namespace": "x" })
        );
        assert_eq!(m["status"], status);

        let mut on_hub = m.clone();
        on_hub["metadata"]["annotations"][keys::REFRESH] = json!("hard");
        let on_hub: Application = serde_json::from_value(on_hub).unwrap();
        assert!(
            mirror_matches(&on_hub, &m),
            "a refresh request is not an edit"
        );
        let mut edited = m.clone();
        edited["spec"]["project"] = json!("other");
        let edited: Application = serde_json::from_value(edited).unwrap();
        assert!(!mirror_matches(&edited, &m));
    }
}
