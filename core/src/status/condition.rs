//! argocd-pull's condition on a hub Application (`PullDeliveryError`, which
//! Argo CD's UI shows as an error) and every reason it can give. Pure.

use serde_json::{Map, Value, json};

/// Condition type on the hub Application when it cannot be delivered or
/// applied. Argo CD's UI shows `...Error` conditions as errors.
pub const CONDITION: &str = "PullDeliveryError";

/// Why argocd-pull does not deliver an Application (or the spoke does not
/// apply it). The condition message and the Warning event start with it;
/// docs/operations.md says what to do about each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// An argocd-pull annotation has a value it cannot use.
    InvalidAnnotation,
    /// The transport asked for is not served by this hub.
    TransportUnavailable,
    /// The target ManagedCluster does not exist.
    UnknownCluster,
    /// The Application's namespace may not deploy to the cluster.
    NotAuthorized,
    /// Its AppProject does not exist or does not allow it.
    ProjectNotPermitted,
    /// The delivered copy is over the transport's size limit.
    TooLarge,
    /// A ManifestWork of the same name belongs to another Application.
    WorkConflict,
    /// Another hub Application already delivers the same spoke Application.
    SpokeConflict,
    /// The cluster's agent refused to apply it.
    RejectedByAgent,
    /// The cluster's agent runs in autonomous mode.
    AutonomousCluster,
    /// The work agent has not applied the current ManifestWork in time.
    WorkNotApplied,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidAnnotation => "InvalidAnnotation",
            Reason::TransportUnavailable => "TransportUnavailable",
            Reason::UnknownCluster => "UnknownCluster",
            Reason::NotAuthorized => "NotAuthorized",
            Reason::ProjectNotPermitted => "ProjectNotPermitted",
            Reason::TooLarge => "TooLarge",
            Reason::WorkConflict => "WorkConflict",
            Reason::SpokeConflict => "SpokeConflict",
            Reason::RejectedByAgent => "RejectedByAgent",
            Reason::AutonomousCluster => "AutonomousCluster",
            Reason::WorkNotApplied => "WorkNotApplied",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fields argocd-pull writes into a hub copy's status.
pub const OWNED: [&str; 5] = [
    "health",
    "sync",
    "operationState",
    "conditions",
    "resources",
];

/// What argocd-pull last wrote, taken from a current status: kept as it is
/// when there is nothing new to write (a refusal keeps the spoke's last
/// report, conditions included, and adds its own condition).
pub fn owned_status(current: &Value) -> Value {
    let mut out = Map::new();
    for key in OWNED {
        if let Some(v) = current.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    Value::Object(out)
}

/// Sets (or, with `None`, removes) argocd-pull's condition, keeping others.
pub fn set_condition(status: &mut Value, message: Option<String>) {
    let mut conditions: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.get("type").and_then(Value::as_str) != Some(CONDITION))
        .collect();
    if let Some(message) = message {
        conditions.push(json!({ "type": CONDITION, "message": message }));
    }
    if let Value::Object(map) = status {
        if conditions.is_empty() {
            map.remove("conditions");
        } else {
            map.insert("conditions".into(), conditions.into());
        }
    }
}

/// argocd-pull's condition message in a status, if any.
pub fn condition_of(status: &Value) -> Option<&str> {
    status
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(CONDITION))?
        .get("message")?
        .as_str()
}

/// Whether `status` holds a field argocd-pull writes, with anything in it.
/// Argo CD's applicationset-controller creates each Application with a
/// status of empty fields (`health: {}`, `sync: {status: ""}`, ...: Go's
/// zero values); taking those back would cost every generated
/// Application one more write, and say nothing.
pub fn shows_any_of_ours(status: &Value) -> bool {
    ["health", "sync", "operationState"]
        .iter()
        .any(|k| status.get(k).is_some_and(|v| !blank(v)))
        || condition_of(status).is_some()
}

/// Whether `v` holds nothing but nulls, empty strings, arrays and objects.
fn blank(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.iter().all(blank),
        Value::Object(o) => o.values().all(blank),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_is_set_replaced_and_removed() {
        let mut status = json!({ "conditions": [{ "type": "SyncError", "message": "x" }] });
        set_condition(&mut status, Some("UnknownCluster: no".into()));
        set_condition(&mut status, Some("TooLarge: big".into()));
        assert_eq!(
            status["conditions"],
            json!([{ "type": "SyncError", "message": "x" }, { "type": CONDITION, "message": "TooLarge: big" }])
        );
        assert_eq!(condition_of(&status), Some("TooLarge: big"));
        set_condition(&mut status, None);
        assert_eq!(
            status["conditions"],
            json!([{ "type": "SyncError", "message": "x" }])
        );
        assert_eq!(condition_of(&status), None);
        let mut empty = json!({});
        set_condition(&mut empty, None);
        assert_eq!(empty, json!({}));
    }

    #[test]
    fn an_empty_status_is_only_written_to_take_back_our_fields() {
        assert!(!shows_any_of_ours(&Value::Null));
        assert!(!shows_any_of_ours(&json!({})));
        assert!(!shows_any_of_ours(
            &json!({ "conditions": [{ "type": "SyncError" }], "reconciledAt": "x" })
        ));
        assert!(shows_any_of_ours(
            &json!({ "health": { "status": "Healthy" } })
        ));
        assert!(shows_any_of_ours(
            &json!({ "operationState": { "phase": "Running" } })
        ));
        // What the applicationset-controller creates: Go's zero values.
        assert!(!shows_any_of_ours(
            &json!({ "health": {}, "sourceHydrator": {}, "summary": {},
            "sync": { "comparedTo": { "destination": {}, "source": { "repoURL": "" } }, "status": "" },
            "operationState": {} })
        ));
        assert!(shows_any_of_ours(
            &json!({ "sync": { "comparedTo": { "source": { "repoURL": "" } }, "status": "Synced" } })
        ));
        assert!(shows_any_of_ours(
            &json!({ "conditions": [{ "type": CONDITION, "message": "x" }] })
        ));
    }

    #[test]
    fn a_refusal_keeps_the_spokes_last_report_and_its_conditions() {
        // One rule for both transports: a refusal drops none of the
        // spoke's conditions.
        let current = json!({ "health": { "status": "Healthy" }, "reconciledAt": "t",
            "conditions": [{ "type": "SyncError", "message": "x" }] });
        let mut s = owned_status(&current);
        set_condition(&mut s, Some("NotAuthorized: no".into()));
        assert_eq!(
            s,
            json!({ "health": { "status": "Healthy" }, "conditions": [
                { "type": "SyncError", "message": "x" },
                { "type": CONDITION, "message": "NotAuthorized: no" }] })
        );
    }
}
