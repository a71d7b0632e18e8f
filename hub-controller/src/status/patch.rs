//! How a hub copy's status is written: a JSON merge patch from what it
//! shows to what it should show.
//!
//! Not server-side apply: when a field manager that owned fields inside an
//! object applies that object empty (Argo CD's `operation.sync: {}` after a
//! sync with a revision, say), the API server stores `null` there, which
//! the Application schema refuses, and the write fails for ever. A merge
//! patch sets `{}` as it is. Found with a real Argo CD behind the gRPC
//! transport (a user's `sync: {}` operation).

use serde_json::{Map, Value, json};

use argocd_pull_proto::content::merge_diff;

/// The merge patch turning `current` status into `wanted`, over `keys` only
/// (`None`: every key of either), or `None` when nothing changes. Keys of
/// `keys` missing from `wanted` are removed.
pub fn status_patch(current: &Value, wanted: &Value, keys: Option<&[&str]>) -> Option<Value> {
    let empty = Map::new();
    let current = current.as_object().unwrap_or(&empty);
    let wanted = wanted.as_object().unwrap_or(&empty);
    let all: Vec<&str> = match keys {
        Some(keys) => keys.to_vec(),
        None => current
            .keys()
            .chain(wanted.keys())
            .map(String::as_str)
            .collect(),
    };
    let mut patch = Map::new();
    for key in all {
        let diff = match (current.get(key), wanted.get(key)) {
            (Some(c), Some(w)) => merge_diff(c, w),
            (None, Some(w)) => Some(w.clone()),
            (Some(_), None) => Some(Value::Null),
            (None, None) => None,
        };
        if let Some(d) = diff {
            patch.insert(key.to_string(), d);
        }
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7386, as the API server applies a merge patch.
    fn merge(target: &mut Value, patch: &Value) {
        let Value::Object(p) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = json!({});
        }
        let t = target.as_object_mut().expect("made an object");
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }

    #[test]
    fn an_object_emptied_stays_an_empty_object() {
        let current = json!({ "operationState": { "phase": "Succeeded",
            "operation": { "sync": { "revision": "abc" }, "retry": { "limit": 2 } } } });
        let wanted = json!({ "operationState": { "phase": "Succeeded",
            "operation": { "sync": {}, "retry": {} } } });
        let patch = status_patch(&current, &wanted, None).unwrap();
        assert_eq!(
            patch,
            json!({ "status": { "operationState": { "operation": {
                "sync": { "revision": null }, "retry": { "limit": null } } } } })
        );
        // Applied as a merge patch, that is exactly `wanted`.
        let mut applied = current.clone();
        merge(&mut applied, &patch["status"]);
        assert_eq!(applied, wanted);
    }

    #[test]
    fn only_the_given_keys_are_written_and_missing_ones_removed() {
        let current = json!({ "sync": { "status": "Synced" }, "health": { "status": "Healthy" },
                              "reconciledAt": "then" });
        let wanted = json!({ "sync": { "status": "OutOfSync" } });
        let patch = status_patch(&current, &wanted, Some(&["sync", "health"])).unwrap();
        assert_eq!(
            patch,
            json!({ "status": { "sync": { "status": "OutOfSync" }, "health": null } })
        );
        assert_eq!(status_patch(&current, &current, None), None);
        assert_eq!(
            status_patch(&json!(null), &json!({ "conditions": [] }), None),
            Some(json!({ "status": { "conditions": [] } }))
        );
    }
}
