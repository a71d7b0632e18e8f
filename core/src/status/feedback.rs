//! ManifestWork feedback -> the status written onto the dormant hub copy.

use argocd_pull_apis::ocm::{
    ManifestWork, ManifestWorkStatusResourceStatusManifests,
    ManifestWorkStatusResourceStatusManifestsStatusFeedbackValuesFieldValue as FieldValue,
};
use serde_json::{Map, Value, json};

/// What the work agent reported about one delivered Application.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Feedback {
    pub health: Option<String>,
    pub sync: Option<String>,
    pub revision: Option<String>,
    pub phase: Option<String>,
    pub started_at: Option<String>,
    /// Only with the work agent's `RawFeedbackJsonString` feature gate.
    pub conditions: Option<Value>,
    /// The managed resources (`status.resources`), as for `conditions`.
    pub resources: Option<Value>,
    pub operation_message: Option<String>,
    pub health_message: Option<String>,
}

/// The manifest status of the Application `namespace/name`, found by its
/// resource identity (never by position in the list).
pub fn manifest_status<'a>(
    work: &'a ManifestWork,
    namespace: &str,
    name: &str,
) -> Option<&'a ManifestWorkStatusResourceStatusManifests> {
    work.status
        .as_ref()?
        .resource_status
        .as_ref()?
        .manifests
        .as_ref()?
        .iter()
        .find(|m| {
            let r = &m.resource_meta;
            r.group.as_deref() == Some("argoproj.io")
                && r.resource.as_deref() == Some("applications")
                && r.namespace.as_deref() == Some(namespace)
                && r.name.as_deref() == Some(name)
        })
}

/// The feedback for the Application `namespace/name`, if any was reported.
pub fn feedback(work: &ManifestWork, namespace: &str, name: &str) -> Option<Feedback> {
    let values = manifest_status(work, namespace, name)?
        .status_feedback
        .as_ref()?
        .values
        .as_ref()?;
    let mut fb = Feedback::default();
    for v in values {
        let text = || scalar(&v.field_value);
        match v.name.as_str() {
            "healthStatus" => fb.health = text(),
            "syncStatus" => fb.sync = text(),
            "syncRevision" => fb.revision = text(),
            "operationStatePhase" => fb.phase = text(),
            "operationStateStartedAt" => fb.started_at = text(),
            "operationStateMessage" => fb.operation_message = text(),
            "healthMessage" => fb.health_message = text(),
            "conditions" => fb.conditions = json_list(&v.field_value),
            "resources" => fb.resources = json_list(&v.field_value),
            _ => {}
        }
    }
    Some(fb)
}

/// A JsonRaw list, when it is one.
fn json_list(v: &FieldValue) -> Option<Value> {
    v.json_raw
        .as_deref()
        .and_then(|raw| serde_json::from_str(raw).ok())
        .filter(Value::is_array)
}

fn scalar(v: &FieldValue) -> Option<String> {
    v.string
        .clone()
        .or_else(|| v.integer.map(|i| i.to_string()))
        .or_else(|| v.boolean.map(|b| b.to_string()))
        .or_else(|| {
            // A JsonRaw scalar is a JSON string literal.
            v.json_raw
                .as_deref()
                .and_then(|raw| serde_json::from_str::<String>(raw).ok())
        })
        .filter(|s| !s.is_empty())
}

/// A failure on the spoke that the hub Application should show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpokeProblem {
    pub reason: String,
    pub message: String,
}

/// Why the work agent could not apply the Application, if it says so:
/// the work's or the manifest's `Applied=False`, or the work's
/// `Degraded=True`; failing that, why part of the status does not come
/// back (the manifest's `StatusFeedbackSynced=False`), with what to do.
pub fn spoke_problem(work: &ManifestWork, namespace: &str, name: &str) -> Option<SpokeProblem> {
    apply_problem(work, namespace, name).or_else(|| feedback_problem(work, namespace, name))
}

/// The problem shown when the work agent has said nothing about the
/// work's current version for `waited`: usually a cluster that is down or
/// cut off, or a work agent that is not running.
pub fn not_applied(cluster: &str, work: &str, waited: std::time::Duration) -> SpokeProblem {
    SpokeProblem {
        reason: crate::status::Reason::WorkNotApplied.as_str().into(),
        message: format!(
            "the work agent of cluster {cluster} has not applied ManifestWork {cluster}/{work} for {}s: \
             check that the cluster is available (kubectl get managedcluster {cluster}) and that its \
             work agent runs",
            waited.as_secs()
        ),
    }
}

fn feedback_problem(work: &ManifestWork, namespace: &str, name: &str) -> Option<SpokeProblem> {
    let c = manifest_status(work, namespace, name)?
        .conditions
        .iter()
        .find(|c| c.type_ == "StatusFeedbackSynced" && c.status == "False")?;
    // The work agent's own words, then what to do about them.
    let hint = if c.message.contains("is not found") {
        "; lists and maps (conditions, resources) come back only from work agents \
         started with --feature-gates=RawFeedbackJsonString=true: enable it there, or \
         start the hub-controller without --raw-feedback"
    } else if c.message.contains("larger than the maximum length") {
        "; the work agent returns at most 1,024 characters per field (its \
         --max-json-raw-length), so that field is missing on the hub copy (for \
         resources: the hub's Argo CD UI shows no tree rather than part of one); \
         the rest of the status still comes back"
    } else {
        ""
    };
    Some(SpokeProblem {
        reason: c.reason.clone(),
        message: format!("{}{hint}", c.message),
    })
}

fn apply_problem(work: &ManifestWork, namespace: &str, name: &str) -> Option<SpokeProblem> {
    let manifest = manifest_status(work, namespace, name)
        .map(|m| m.conditions.as_slice())
        .unwrap_or_default();
    let work_conditions = work
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    manifest
        .iter()
        .chain(work_conditions)
        .find(|c| {
            (c.type_ == "Applied" && c.status == "False")
                || (c.type_ == "Degraded" && c.status == "True")
        })
        .map(|c| SpokeProblem {
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
}

/// The status fields argocd-pull owns, to write onto the hub Application
/// from fresh feedback: exactly what the work agent fed back, so one
/// change on the spoke is one write on the hub.
pub fn status_update(fb: &Feedback) -> Value {
    let mut status = Map::new();
    if let Some(h) = &fb.health {
        let mut health = json!({ "status": h });
        if let Some(m) = &fb.health_message {
            health["message"] = m.clone().into();
        }
        status.insert("health".into(), health);
    }
    if let Some(s) = &fb.sync {
        let mut sync = json!({ "status": s });
        if let Some(r) = &fb.revision {
            sync["revision"] = r.clone().into();
        }
        status.insert("sync".into(), sync);
    }
    // phase and startedAt are required by the schema, and so is `operation`.
    if let (Some(phase), Some(started)) = (&fb.phase, &fb.started_at) {
        let mut op = json!({ "phase": phase, "startedAt": started, "operation": {} });
        if let Some(m) = &fb.operation_message {
            op["message"] = m.clone().into();
        }
        status.insert("operationState".into(), op);
    }
    if let Some(c) = &fb.conditions {
        status.insert("conditions".into(), c.clone());
    }
    if let Some(r) = &fb.resources {
        status.insert("resources".into(), r.clone());
    }
    Value::Object(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(manifests: Value) -> ManifestWork {
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": { "name": "w", "namespace": "cluster1" },
            "spec": {},
            "status": { "resourceStatus": { "manifests": manifests } }
        }))
        .unwrap()
    }

    fn meta(ns: &str, name: &str, ordinal: i32) -> Value {
        json!({ "group": "argoproj.io", "version": "v1alpha1", "kind": "Application",
                "resource": "applications", "namespace": ns, "name": name, "ordinal": ordinal })
    }

    fn string(name: &str, v: &str) -> Value {
        json!({ "name": name, "fieldValue": { "type": "String", "string": v } })
    }

    #[test]
    fn finds_feedback_by_resource_identity_not_position() {
        let w = work(json!([
            { "conditions": [], "resourceMeta": { "group": "", "version": "v1", "kind": "ConfigMap",
              "resource": "configmaps", "namespace": "argocd", "name": "guestbook", "ordinal": 0 },
              "statusFeedback": { "values": [string("healthStatus", "Wrong")] } },
            { "conditions": [], "resourceMeta": meta("argocd", "guestbook", 1),
              "statusFeedback": { "values": [
                  string("healthStatus", "Healthy"), string("syncStatus", "Synced"),
                  string("syncRevision", "abc123"), string("operationStatePhase", "Succeeded"),
                  string("operationStateStartedAt", "2026-11-21T10:00:00Z")
              ] } }
        ]));
        let fb = feedback(&w, "argocd", "guestbook").unwrap();
        assert_eq!(fb.health.as_deref(), Some("Healthy"));
        assert_eq!(fb.sync.as_deref(), Some("Synced"));
        assert_eq!(fb.revision.as_deref(), Some("abc123"));
        assert_eq!(fb.phase.as_deref(), Some("Succeeded"));
        assert_eq!(fb.started_at.as_deref(), Some("2026-11-21T10:00:00Z"));
        assert!(feedback(&w, "argocd", "other").is_none());
        assert!(feedback(&w, "other-ns", "guestbook").is_none());
    }

    #[test]
    fn reads_raw_json_feedback_when_the_agent_sends_it() {
        let w = work(
            json!([{ "conditions": [], "resourceMeta": meta("argocd", "a", 0),
            "statusFeedback": { "values": [
                { "name": "healthStatus", "fieldValue": { "type": "JsonRaw", "jsonRaw": "\"Degraded\"" } },
                { "name": "conditions", "fieldValue": { "type": "JsonRaw",
                  "jsonRaw": "[{\"type\":\"SyncError\",\"message\":\"boom\"}]" } },
                { "name": "operationStateMessage", "fieldValue": { "type": "String", "string": "failed" } },
                { "name": "resources", "fieldValue": { "type": "JsonRaw",
                  "jsonRaw": "[{\"kind\":\"Service\",\"name\":\"ui\",\"status\":\"Synced\"}]" } }
            ] } }]),
        );
        let fb = feedback(&w, "argocd", "a").unwrap();
        assert_eq!(fb.health.as_deref(), Some("Degraded"));
        assert_eq!(
            fb.conditions,
            Some(json!([{ "type": "SyncError", "message": "boom" }]))
        );
        assert_eq!(fb.operation_message.as_deref(), Some("failed"));
        let resources = json!([{ "kind": "Service", "name": "ui", "status": "Synced" }]);
        assert_eq!(fb.resources, Some(resources.clone()));
        // The hub's Argo CD UI draws its tree from them.
        assert_eq!(status_update(&fb)["resources"], resources);
    }

    #[test]
    fn a_raw_value_that_is_not_a_list_is_ignored() {
        let w = work(
            json!([{ "conditions": [], "resourceMeta": meta("argocd", "a", 0),
            "statusFeedback": { "values": [
                { "name": "resources", "fieldValue": { "type": "JsonRaw", "jsonRaw": "{\"kind\":\"x\"}" } },
                { "name": "conditions", "fieldValue": { "type": "JsonRaw", "jsonRaw": "[not json" } }
            ] } }]),
        );
        let fb = feedback(&w, "argocd", "a").unwrap();
        assert_eq!((fb.resources, fb.conditions), (None, None));
        assert!(
            status_update(&Feedback::default())
                .get("resources")
                .is_none()
        );
    }

    #[test]
    fn reports_apply_failures_from_the_spoke() {
        let mut w = work(
            json!([{ "resourceMeta": meta("argocd", "a", 0), "conditions": [{
            "type": "Applied", "status": "False", "reason": "AppliedManifestFailed",
            "message": "namespaces \"argocd\" not found",
            "lastTransitionTime": "2026-11-21T10:00:00Z" }] }]),
        );
        let p = spoke_problem(&w, "argocd", "a").unwrap();
        assert_eq!(p.reason, "AppliedManifestFailed");
        assert!(p.message.contains("not found"));
        w.status.as_mut().unwrap().resource_status = None;
        assert!(spoke_problem(&w, "argocd", "a").is_none());
    }

    #[test]
    fn reports_feedback_the_work_agent_cannot_return_with_what_to_do() {
        let failed = |message: &str| {
            work(
                json!([{ "resourceMeta": meta("argocd", "a", 0), "conditions": [
                { "type": "Applied", "status": "True", "reason": "AppliedManifestComplete",
                  "message": "ok", "lastTransitionTime": "2026-11-21T10:00:00Z" },
                { "type": "StatusFeedbackSynced", "status": "False",
                  "reason": "StatusFeedbackSyncFailed", "message": message,
                  "lastTransitionTime": "2026-11-21T10:00:00Z" }] }]),
            )
        };
        // What OCM v1.2.1's work agent says without RawFeedbackJsonString.
        let p = spoke_problem(
            &failed("Sync status feedback failed with error the type []interface {} of the value for conditions is not found"),
            "argocd",
            "a",
        )
        .unwrap();
        assert_eq!(p.reason, "StatusFeedbackSyncFailed");
        assert!(
            p.message.starts_with("Sync status feedback failed"),
            "{}",
            p.message
        );
        assert!(
            p.message.contains("RawFeedbackJsonString=true"),
            "{}",
            p.message
        );
        assert!(
            p.message.contains("without --raw-feedback"),
            "{}",
            p.message
        );
        let p = spoke_problem(
            &failed("Sync status feedback failed with error the length of returned json raw string for name conditions is larger than the maximum length 1024"),
            "argocd",
            "a",
        )
        .unwrap();
        assert!(
            p.message
                .contains("the rest of the status still comes back"),
            "{}",
            p.message
        );
        // Applied and fed back: nothing to report.
        let mut ok = failed("x");
        ok.status
            .as_mut()
            .unwrap()
            .resource_status
            .as_mut()
            .unwrap()
            .manifests
            .as_mut()
            .unwrap()[0]
            .conditions[1]
            .status = "True".into();
        assert!(spoke_problem(&ok, "argocd", "a").is_none());
    }

    fn fb(health: &str, started: &str) -> Feedback {
        Feedback {
            health: Some(health.into()),
            sync: Some("Synced".into()),
            revision: Some("r1".into()),
            phase: Some("Succeeded".into()),
            started_at: Some(started.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_new_sync_that_ended_healthy_is_written_as_it_was_fed_back() {
        // ApplicationSet RollingSync moves on from the sync's startedAt,
        // not from a health transition: nothing synthetic is shown.
        let u = status_update(&fb("Healthy", "T2"));
        assert_eq!(u["health"]["status"], "Healthy");
        assert_eq!(u["operationState"]["startedAt"], "T2");
    }

    #[test]
    fn writes_the_schema_required_operation_fields_together() {
        let u = status_update(&fb("Progressing", "T1"));
        assert_eq!(
            u,
            json!({
                "health": { "status": "Progressing" },
                "sync": { "status": "Synced", "revision": "r1" },
                "operationState": { "phase": "Succeeded", "startedAt": "T1", "operation": {} }
            })
        );
        let partial = Feedback {
            health: Some("Missing".into()),
            phase: Some("Running".into()),
            ..Default::default()
        };
        let u = status_update(&partial);
        assert_eq!(u, json!({ "health": { "status": "Missing" } }));
    }
}
