//! Which Application an object on a managed cluster belongs to, as the
//! cluster's Argo CD records it when it applies the object: the tracking
//! annotation `argocd.argoproj.io/tracking-id`
//! (`<instance>:<group>/<kind>:<namespace>/<name>`, Argo CD v3's default),
//! or, on an object without it, the label `app.kubernetes.io/instance`
//! (label tracking). A name in an Application's `status.resources` is no
//! proof of anything: the Application CRD has no status subresource, so
//! whoever may update an Application writes it, and Argo CD lists there
//! targets it never applied (those its project refused).

use serde_json::Value;

use super::group_of;

/// Argo CD's tracking annotation.
pub const TRACKING_ID: &str = "argocd.argoproj.io/tracking-id";

/// Argo CD's tracking label.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// The Argo CD instance name (`<namespace>_<name>`, or `<name>` in the
/// control-plane namespace) of the Application that tracks `obj`. A
/// tracking annotation counts only when it names `obj` itself (a copy of
/// another object's annotation does not make an object that
/// Application's); it decides over the label.
pub fn tracked_by(obj: &Value) -> Option<String> {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("");
    let annotation = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(TRACKING_ID))
        .and_then(Value::as_str);
    if let Some(id) = annotation {
        let (instance, group, kind, namespace, name) = parse_tracking_id(id)?;
        let names_itself = group == group_of(s("/apiVersion"))
            && kind == s("/kind")
            && namespace == s("/metadata/namespace")
            && name == s("/metadata/name");
        return names_itself.then(|| instance.to_string());
    }
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(INSTANCE_LABEL))
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// The parts of a tracking id: instance, group, kind, namespace, name.
fn parse_tracking_id(id: &str) -> Option<(&str, &str, &str, &str, &str)> {
    let mut parts = id.split(':');
    let (instance, group_kind, ns_name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || instance.is_empty() {
        return None;
    }
    let (group, kind) = group_kind.split_once('/')?;
    let (namespace, name) = ns_name.split_once('/')?;
    Some((instance, group, kind, namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(annotations: Value, labels: Value) -> Value {
        json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "namespace": "gb", "name": "ui", "annotations": annotations, "labels": labels } })
    }

    #[test]
    fn the_tracking_annotation_names_the_application_only_for_the_object_it_names() {
        let tracked = |id: &str| tracked_by(&object(json!({ TRACKING_ID: id }), json!({})));
        assert_eq!(
            tracked("guestbook:apps/Deployment:gb/ui").as_deref(),
            Some("guestbook")
        );
        assert_eq!(
            tracked("team-a_web:apps/Deployment:gb/ui").as_deref(),
            Some("team-a_web")
        );
        // Copied from another object: not this one's.
        assert_eq!(tracked("guestbook:apps/Deployment:gb/other"), None);
        assert_eq!(tracked("guestbook:/ConfigMap:gb/ui"), None);
        assert_eq!(tracked("guestbook:apps/Deployment:other/ui"), None);
        assert_eq!(tracked("guestbook"), None);
        assert_eq!(tracked(":apps/Deployment:gb/ui"), None);
        // A core, cluster-scoped object.
        let ns = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "gb", "annotations": { TRACKING_ID: "guestbook:/Namespace:/gb" } } });
        assert_eq!(tracked_by(&ns).as_deref(), Some("guestbook"));
    }

    #[test]
    fn the_label_counts_on_an_object_without_the_annotation() {
        let labelled = object(json!({}), json!({ INSTANCE_LABEL: "guestbook" }));
        assert_eq!(tracked_by(&labelled).as_deref(), Some("guestbook"));
        let both = object(
            json!({ TRACKING_ID: "other:apps/Deployment:gb/ui" }),
            json!({ INSTANCE_LABEL: "guestbook" }),
        );
        assert_eq!(tracked_by(&both).as_deref(), Some("other"));
        assert_eq!(tracked_by(&object(json!({}), json!({}))), None);
        assert_eq!(tracked_by(&json!({ "kind": "Pod" })), None);
    }
}
