//! Pure: the status written onto a hub copy delivered over gRPC, from
//! what its agent observed on the spoke (the whole status, as the spoke's
//! Argo CD wrote it) and argocd-pull's condition.

use serde_json::{Map, Value, json};

use super::condition::{owned_status, set_condition};

/// The status to write onto a hub Application from the spoke's observed
/// status (when there is one) and argocd-pull's condition (when something
/// is wrong). `None` when nothing is to be written.
///
/// The spoke's status is written as it is, apart from a `Terminating` the
/// hub copy asked for ([`crate::status::terminating`]): one report, one
/// write. ApplicationSet RollingSync needs no synthetic `Progressing`: it
/// moves a step from `Pending` on the sync's `operationState.startedAt`.
pub fn hub_status(current: &Value, observed: Option<&Value>, condition: Option<String>) -> Value {
    let mut status = match observed {
        Some(Value::Object(o)) => Value::Object(o.clone()),
        Some(_) => json!({}),
        None => owned_status(current),
    };
    if observed.is_some() {
        crate::status::terminating::keep_requested(current, &mut status);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
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
    fn a_finished_new_sync_is_written_once_as_reported() {
        let current = json!({ "health": { "status": "Healthy" },
                              "operationState": { "startedAt": "T1" } });
        let observed = json!({ "health": { "status": "Healthy" },
                               "operationState": { "startedAt": "T2", "phase": "Succeeded" } });
        let first = hub_status(&current, Some(&observed), None);
        assert_eq!(first, observed);
        // Its echo asks for nothing more.
        assert_eq!(hub_status(&first, Some(&observed), None), first);
    }
}
