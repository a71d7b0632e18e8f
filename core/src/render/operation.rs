//! Handing a sync operation over to the spoke exactly once.
//!
//! The hub copy's `.operation` is removed once it is in the ManifestWork,
//! but the work must keep carrying it until the spoke's Argo CD has started
//! it: dropping it earlier would let the work agent strip it from the spoke
//! before it ran. "Started" is read from the feedback without comparing
//! clocks: the work remembers the spoke's `operationState.startedAt` from
//! before the handover, and any other value means a new operation ran.

use argocd_pull_apis::ocm::ManifestWork;
use kube::ResourceExt;
use serde_json::Value;

/// Annotation on the work: the spoke's `operationState.startedAt` when the
/// operation was handed over (empty when it had none).
pub const PREVIOUS_STARTED_AT: &str = "argocd-pull.io/operation-previous-started-at";

/// The operation the work should carry, with the annotation value to keep.
#[derive(Clone, Debug, PartialEq)]
pub struct Carried {
    pub operation: Value,
    pub previous_started_at: String,
}

/// Decides the operation the work carries, from the hub copy's operation
/// (a new request), the existing work, and the spoke's current startedAt.
pub fn carried_operation(
    hub_operation: Option<&Value>,
    existing: Option<&ManifestWork>,
    spoke_started_at: Option<&str>,
) -> Option<Carried> {
    let spoke = spoke_started_at.unwrap_or_default();
    if let Some(op) = hub_operation.filter(|op| !op.is_null()) {
        return Some(Carried {
            operation: op.clone(),
            previous_started_at: spoke.to_string(),
        });
    }
    let work = existing?;
    let previous = work.annotations().get(PREVIOUS_STARTED_AT)?;
    let operation = work
        .spec
        .workload
        .as_ref()?
        .manifests
        .as_ref()?
        .first()?
        .get("operation")?;
    // The spoke has started something since: the operation was taken.
    (spoke == previous).then(|| Carried {
        operation: operation.clone(),
        previous_started_at: previous.clone(),
    })
}

/// Puts `carried` (or no operation) into the work's manifest and annotations.
pub fn apply_to(work: &mut ManifestWork, carried: Option<Carried>) {
    let manifest = work
        .spec
        .workload
        .as_mut()
        .and_then(|w| w.manifests.as_mut())
        .and_then(|m| m.first_mut());
    let Some(manifest) = manifest else { return };
    match carried {
        Some(c) => {
            manifest.insert("operation".into(), c.operation);
            work.annotations_mut()
                .insert(PREVIOUS_STARTED_AT.into(), c.previous_started_at);
        }
        None => {
            manifest.remove("operation");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn work_with(op: Option<Value>, previous: Option<&str>) -> ManifestWork {
        let mut manifest = json!({ "apiVersion": "argoproj.io/v1alpha1", "kind": "Application" });
        if let Some(op) = op {
            manifest["operation"] = op;
        }
        let mut w: ManifestWork = serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": { "name": "w", "namespace": "c" },
            "spec": { "workload": { "manifests": [manifest] } }
        }))
        .unwrap();
        if let Some(p) = previous {
            w.annotations_mut()
                .insert(PREVIOUS_STARTED_AT.into(), p.into());
        }
        w
    }

    #[test]
    fn a_new_hub_operation_is_carried_with_the_current_spoke_start() {
        let op = json!({ "sync": { "revision": "HEAD" } });
        let c = carried_operation(Some(&op), None, Some("T1")).unwrap();
        assert_eq!(
            c,
            Carried {
                operation: op,
                previous_started_at: "T1".into()
            }
        );
    }

    #[test]
    fn the_operation_stays_until_the_spoke_starts_one() {
        let op = json!({ "sync": {} });
        let w = work_with(Some(op.clone()), Some("T1"));
        // Spoke still shows the old start: keep carrying it.
        assert_eq!(
            carried_operation(None, Some(&w), Some("T1"))
                .unwrap()
                .operation,
            op
        );
        // A new start was fed back: the spoke took it.
        assert!(carried_operation(None, Some(&w), Some("T2")).is_none());
        // First ever operation: no previous start, then one appears.
        let w = work_with(Some(op.clone()), Some(""));
        assert!(carried_operation(None, Some(&w), None).is_some());
        assert!(carried_operation(None, Some(&w), Some("T1")).is_none());
    }

    #[test]
    fn works_without_the_annotation_carry_nothing() {
        let w = work_with(Some(json!({})), None);
        assert!(carried_operation(None, Some(&w), None).is_none());
        assert!(carried_operation(None, None, None).is_none());
    }

    #[test]
    fn apply_to_sets_and_removes() {
        let mut w = work_with(Some(json!({ "old": true })), None);
        apply_to(&mut w, None);
        assert!(
            !w.spec
                .workload
                .as_ref()
                .unwrap()
                .manifests
                .as_ref()
                .unwrap()[0]
                .contains_key("operation")
        );
        apply_to(
            &mut w,
            Some(Carried {
                operation: json!({ "sync": {} }),
                previous_started_at: "T".into(),
            }),
        );
        assert_eq!(
            w.spec
                .workload
                .as_ref()
                .unwrap()
                .manifests
                .as_ref()
                .unwrap()[0]["operation"],
            json!({ "sync": {} })
        );
        assert_eq!(w.annotations()[PREVIOUS_STARTED_AT], "T");
    }
}
