//! Pure decisions of the agent: what it applies for the hub, how it tells a
//! local edit from its own write, what it reports, and how a command runs
//! exactly once. No client: the worker feeds them objects from its cache.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::owner::Holder;
use argocd_pull_proto::v1::{ObjectKey, ObjectMeta, ObservedApplication, RefreshKind};
use kube::ResourceExt;
use serde_json::{Map, Value, json};

/// Field manager of everything the agent applies.
pub const MANAGER: &str = "argocd-pull-agent";

/// How many operation ids an Application remembers.
pub const OPERATION_MEMORY: usize = 16;

/// The key of an Application.
pub fn key_of(app: &Application) -> ObjectKey {
    ObjectKey {
        namespace: app.namespace().unwrap_or_default(),
        name: app.name_any(),
    }
}

/// Why a delivered Application cannot be applied as sent.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("application_json is not JSON: {0}")]
    Json(String),
    #[error("application_json is not an argoproj.io Application")]
    NotAnApplication,
    #[error("application_json names {got}, but the message is for {want}")]
    WrongKey { got: String, want: String },
}

/// What the agent applies for the hub's desired state: the delivered copy,
/// marked as managed for the hub, with the version and the hash of its spec
/// (to tell a local edit from the agent's own write).
pub fn applied_config(
    key: &ObjectKey,
    json: &[u8],
    hub_uid: &str,
    version: &str,
) -> Result<Value, Invalid> {
    let mut app: Value = serde_json::from_slice(json).map_err(|e| Invalid::Json(e.to_string()))?;
    if app.get("kind").and_then(Value::as_str) != Some("Application")
        || !app
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v.starts_with("argoproj.io/"))
    {
        return Err(Invalid::NotAnApplication);
    }
    let name = app
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let ns = app
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name != key.name || ns != key.namespace {
        return Err(Invalid::WrongKey {
            got: format!("{ns}/{name}"),
            want: format!("{}/{}", key.namespace, key.name),
        });
    }
    let spec_hash = content::hash(app.get("spec").unwrap_or(&Value::Null));
    let meta = app
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .expect("checked above");
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if let Value::Object(l) = labels {
        l.insert(keys::HUB_MANAGED.into(), "true".into());
    }
    let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
    if let Value::Object(a) = annotations {
        a.insert(keys::HUB_UID.into(), hub_uid.into());
        a.insert(keys::DESIRED_VERSION.into(), version.into());
        a.insert(keys::SPEC_HASH.into(), spec_hash.into());
    }
    // Operations travel as commands and status is the spoke's.
    if let Value::Object(m) = &mut app {
        m.remove("operation");
        m.remove("status");
    }
    Ok(app)
}

/// Whether `app` is managed for the hub.
pub fn is_managed(app: &Application) -> bool {
    app.labels().get(keys::HUB_MANAGED).map(String::as_str) == Some("true")
}

/// The hub Application `app` was delivered for, if it was.
pub fn hub_uid(app: &Application) -> Option<&str> {
    app.annotations()
        .get(keys::HUB_UID)
        .map(String::as_str)
        .filter(|u| !u.is_empty())
}

/// Whether `app` is managed by this agent for the hub Application `uid`:
/// the only Applications it may change or delete for that hub Application.
pub fn is_delivered_for(app: &Application, uid: &str) -> bool {
    is_managed(app) && !uid.is_empty() && hub_uid(app) == Some(uid)
}

/// Whose the Application at an upsert's key is, as far as the agent may
/// act on it. Ownership is recorded on the object: the agent labels what it
/// manages ([`keys::HUB_MANAGED`]) and notes the hub Application it was
/// delivered for ([`keys::HUB_UID`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Nothing there: create it (without forcing, so that one created
    /// meanwhile by someone else makes the write conflict instead of being
    /// overwritten).
    Free,
    /// Delivered by this agent for this hub Application: apply.
    Ours,
    /// Left by a ManifestWork for this hub Application (a switch of
    /// transport, which orphans it): take it over. Either the hub marked it
    /// with this hub Application's uid, or it is exactly what the hub
    /// delivers (same spec, labels and annotations), so that taking it over
    /// changes nothing on the cluster.
    Adopt,
    /// Someone else's: refuse, and leave it alone.
    Refuse(Holder),
}

/// Decides [`Ownership`] of `existing` (the Application at the key, as read)
/// for an upsert from the hub Application `uid` whose applied configuration
/// is `config` (from [`applied_config`]).
pub fn ownership(existing: Option<&Application>, uid: &str, config: &Value) -> Ownership {
    let Some(app) = existing else {
        return Ownership::Free;
    };
    if is_managed(app) {
        return match hub_uid(app) {
            Some(h) if h == uid && !uid.is_empty() => Ownership::Ours,
            Some(h) => Ownership::Refuse(Holder::HubApplication(h.to_string())),
            None => Ownership::Refuse(Holder::NotArgocdPull),
        };
    }
    if !uid.is_empty() && hub_uid(app) == Some(uid) {
        return Ownership::Adopt;
    }
    if hub_uid(app).is_none() && is_what_the_hub_delivers(app, config) {
        return Ownership::Adopt;
    }
    Ownership::Refuse(Holder::NotArgocdPull)
}

/// Whether `app` has the spec of `config` and carries every label and
/// annotation the hub delivered, with the same values (the agent's own
/// markers aside).
fn is_what_the_hub_delivers(app: &Application, config: &Value) -> bool {
    let wanted_spec = config.get("spec").unwrap_or(&Value::Null);
    if content::hash(app.data.get("spec").unwrap_or(&Value::Null)) != content::hash(wanted_spec) {
        return false;
    }
    let carries = |field: &str, have: &std::collections::BTreeMap<String, String>| {
        config
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(k, _)| !k.starts_with(keys::OWN_PREFIX))
            .all(|(k, v)| {
                v.as_str()
                    .is_some_and(|v| have.get(k).map(String::as_str) == Some(v))
            })
    };
    carries("labels", app.labels()) && carries("annotations", app.annotations())
}

/// Whether the spec differs from what the agent last wrote.
pub fn is_edited(app: &Application) -> bool {
    let hash = content::hash(app.data.get("spec").unwrap_or(&Value::Null));
    app.annotations().get(keys::SPEC_HASH) != Some(&hash)
}

/// The agent's entry for `app` in its replica of the hub's desired set:
/// the version it applied, or nothing that can match when it was edited
/// locally (so that the hub sends it again) or is being deleted.
pub fn replica_version(app: &Application) -> Option<String> {
    if !is_managed(app) || app.metadata.deletion_timestamp.is_some() {
        return None;
    }
    if is_edited(app) {
        return Some(String::new());
    }
    app.annotations().get(keys::DESIRED_VERSION).cloned()
}

/// The ids of the operations started on `app`, oldest first.
pub fn operation_ids(app: &Application) -> Vec<String> {
    app.annotations()
        .get(keys::OPERATION_IDS)
        .map(|ids| {
            ids.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// What the agent reports about `app`, and its version. In autonomous mode
/// the Application itself travels too, for the hub's read-only mirror.
pub fn observed(app: &Application, autonomous: bool) -> (String, ObservedApplication) {
    let status = content::canonical(app.data.get("status").unwrap_or(&json!({})));
    let application = if autonomous {
        content::canonical(&mirror_source(app))
    } else {
        Vec::new()
    };
    let last_operation_id = operation_ids(app).pop().unwrap_or_default();
    let hub_uid = if autonomous {
        String::new()
    } else {
        hub_uid(app).unwrap_or_default().to_string()
    };
    let version = content::hash_bytes(
        &[
            status.as_slice(),
            b"\0",
            application.as_slice(),
            b"\0",
            last_operation_id.as_bytes(),
            b"\0",
            hub_uid.as_bytes(),
        ]
        .concat(),
    );
    let observed = ObservedApplication {
        meta: Some(ObjectMeta {
            uid: app.metadata.uid.clone().unwrap_or_default(),
            resource_version: app.resource_version().unwrap_or_default(),
            generation: app.metadata.generation.unwrap_or_default(),
            version: version.clone(),
        }),
        status_json: status,
        application_json: application,
        last_operation_id,
        hub_uid,
    };
    (version, observed)
}

/// The Application without status, operation and server-set metadata.
fn mirror_source(app: &Application) -> Value {
    let mut meta = Map::new();
    meta.insert("name".into(), app.name_any().into());
    meta.insert(
        "namespace".into(),
        app.namespace().unwrap_or_default().into(),
    );
    let labels = app.labels();
    if !labels.is_empty() {
        meta.insert("labels".into(), json!(labels));
    }
    let annotations = app.annotations();
    if !annotations.is_empty() {
        meta.insert("annotations".into(), json!(annotations));
    }
    let mut out = Map::new();
    out.insert("apiVersion".into(), "argoproj.io/v1alpha1".into());
    out.insert("kind".into(), "Application".into());
    out.insert("metadata".into(), meta.into());
    if let Value::Object(fields) = &app.data {
        for (k, v) in fields {
            if !matches!(
                k.as_str(),
                "status" | "operation" | "apiVersion" | "kind" | "metadata"
            ) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// A command, as the agent runs it.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Sync(Value),
    Refresh(RefreshKind),
    Terminate,
}

/// The outcome of deciding a command against the Application as it is.
#[derive(Clone, Debug, PartialEq)]
pub enum Run {
    /// Already carried out: never again.
    Duplicate,
    /// Nothing to do (terminate without a running operation).
    Nothing,
    /// Write this merge patch (it records the id in the same write).
    Patch(Value),
}

/// Runs a command at most once: the id is recorded on the Application in
/// the same write that starts it, and the write carries the
/// resourceVersion it was decided on, so two deliveries of the same
/// command can never both succeed.
pub fn run_command(app: &Application, id: &str, command: &Command) -> Run {
    let mut ids = operation_ids(app);
    if ids.iter().any(|i| i == id) {
        return Run::Duplicate;
    }
    ids.push(id.to_string());
    let skip = ids.len().saturating_sub(OPERATION_MEMORY);
    let ids = ids[skip..].join(",");
    let rv = app.resource_version();
    match command {
        Command::Sync(op) => Run::Patch(json!({
            "metadata": { "resourceVersion": rv, "annotations": { keys::OPERATION_IDS: ids } },
            "operation": op,
        })),
        Command::Refresh(kind) => Run::Patch(json!({
            "metadata": { "resourceVersion": rv, "annotations": {
                keys::OPERATION_IDS: ids,
                keys::REFRESH: match kind { RefreshKind::Hard => "hard", _ => "normal" },
            } },
        })),
        Command::Terminate => {
            let running = app
                .data
                .pointer("/status/operationState/phase")
                .and_then(Value::as_str)
                == Some("Running");
            if !running {
                return Run::Nothing;
            }
            // What Argo CD's API server does for `argocd app terminate-op`.
            Run::Patch(json!({
                "metadata": { "resourceVersion": rv, "annotations": { keys::OPERATION_IDS: ids } },
                "status": { "operationState": { "phase": "Terminating" } },
            }))
        }
    }
}

/// Where a sync the agent set on the cluster stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Settlement {
    /// The Application still carries it (or the cache has not caught up
    /// with the write that set it).
    Waiting,
    /// Argo CD has finished with it (ran it, or folded it into an operation
    /// already running): the Application's `operationState.startedAt` now,
    /// empty when it has none or is gone.
    Settled { started_at: String },
}

/// Whether sync `id`, set on the Application with uid `uid`, has settled,
/// judged from the Application as the cache shows it (`None`: gone). The id
/// is recorded in the same write that sets the operation, so a version that
/// lists the id and no longer carries the operation is one where Argo CD
/// cleared it.
pub fn settlement(app: Option<&Application>, id: &str, uid: &str) -> Settlement {
    let gone = || Settlement::Settled {
        started_at: String::new(),
    };
    let Some(app) = app else { return gone() };
    if app.metadata.uid.as_deref() != Some(uid) {
        return gone();
    }
    let ids = operation_ids(app);
    let carried = app
        .data
        .get("operation")
        .and_then(keys::stamped_operation_id)
        == Some(id);
    // Not listed: the cache is behind the write, unless the list has moved
    // past it since (it keeps the newest OPERATION_MEMORY).
    let behind = !ids.iter().any(|i| i == id) && ids.len() < OPERATION_MEMORY;
    if carried || behind {
        return Settlement::Waiting;
    }
    Settlement::Settled {
        started_at: app
            .data
            .pointer("/status/operationState/startedAt")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    }
}

/// The merge patch that stops managing `app` for the hub, leaving it running.
pub fn release_patch() -> Value {
    json!({ "metadata": {
        "labels": { keys::HUB_MANAGED: null },
        "annotations": { keys::HUB_UID: null, keys::DESIRED_VERSION: null, keys::SPEC_HASH: null },
    }})
}

#[cfg(test)]
mod tests;
