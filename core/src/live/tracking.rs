//! Which Application an object on a managed cluster belongs to, as the
//! cluster's Argo CD records it when it applies the object, by the
//! tracking method it is configured with ([`Method`]): the tracking
//! annotation `argocd.argoproj.io/tracking-id`
//! (`<instance>:<group>/<kind>:<namespace>/<name>`, Argo CD v3's default),
//! or the label `app.kubernetes.io/instance` (label tracking). Only what
//! that method keeps up to date counts: under annotation tracking nothing
//! maintains the label, so any workload that may create an object could
//! name another Application with it. A name in an Application's
//! `status.resources` is no proof of anything either: the Application CRD
//! has no status subresource, so whoever may update an Application writes
//! it, and Argo CD lists there targets it never applied (those its project
//! refused).

use serde_json::Value;

use super::group_of;

/// Argo CD's tracking annotation.
pub const TRACKING_ID: &str = "argocd.argoproj.io/tracking-id";

/// Argo CD's tracking label.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// The ConfigMap, in the cluster's Argo CD namespace, and its key that
/// name the tracking method.
pub const SETTINGS_CONFIGMAP: &str = "argocd-cm";
pub const METHOD_KEY: &str = "application.resourceTrackingMethod";

/// How the cluster's Argo CD records the Application of what it applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `annotation` (v3's default) and `annotation+label`: the annotation,
    /// which Argo CD writes on every apply; the label of `annotation+label`
    /// is only informational (cut to 63 characters).
    Annotation,
    /// `label`: the label, which Argo CD writes on every apply; an
    /// annotation there is not Argo CD's.
    Label,
}

impl Method {
    /// The method argocd-cm's [`METHOD_KEY`] names: `label` is label
    /// tracking; unset and every other value are annotation tracking (an
    /// object then needs the annotation Argo CD writes).
    pub fn from_setting(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            Some("label") => Method::Label,
            _ => Method::Annotation,
        }
    }
}

/// The Argo CD instance name (`<namespace>_<name>`, or `<name>` in the
/// control-plane namespace) of the Application that tracks `obj` by
/// `method`. A tracking annotation counts only when it names `obj` itself
/// (a copy of another object's annotation does not make an object that
/// Application's).
pub fn tracked_by(obj: &Value, method: Method) -> Option<String> {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("");
    if method == Method::Label {
        return obj
            .pointer("/metadata/labels")
            .and_then(|l| l.get(INSTANCE_LABEL))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string);
    }
    let id = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(TRACKING_ID))
        .and_then(Value::as_str)?;
    let (instance, group, kind, namespace, name) = parse_tracking_id(id)?;
    let names_itself = group == group_of(s("/apiVersion"))
        && kind == s("/kind")
        && namespace == s("/metadata/namespace")
        && name == s("/metadata/name");
    names_itself.then(|| instance.to_string())
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
        let tracked = |id: &str| {
            tracked_by(
                &object(json!({ TRACKING_ID: id }), json!({})),
                Method::Annotation,
            )
        };
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
        assert_eq!(
            tracked_by(&ns, Method::Annotation).as_deref(),
            Some("guestbook")
        );
    }

    #[test]
    fn only_what_the_configured_method_keeps_counts() {
        use Method::{Annotation, Label};
        let labelled = object(json!({}), json!({ INSTANCE_LABEL: "guestbook" }));
        let both = object(
            json!({ TRACKING_ID: "other:apps/Deployment:gb/ui" }),
            json!({ INSTANCE_LABEL: "guestbook" }),
        );
        // Under annotation tracking nothing keeps the label: it names no one.
        assert_eq!(tracked_by(&labelled, Annotation), None);
        assert_eq!(tracked_by(&both, Annotation).as_deref(), Some("other"));
        // Under label tracking the label decides, an annotation is no one's.
        assert_eq!(tracked_by(&labelled, Label).as_deref(), Some("guestbook"));
        assert_eq!(tracked_by(&both, Label).as_deref(), Some("guestbook"));
        for method in [Annotation, Label] {
            assert_eq!(tracked_by(&object(json!({}), json!({})), method), None);
            assert_eq!(tracked_by(&json!({ "kind": "Pod" }), method), None);
        }
    }

    #[test]
    fn the_method_is_argocd_cms() {
        assert_eq!(Method::from_setting(None), Method::Annotation);
        assert_eq!(Method::from_setting(Some("annotation")), Method::Annotation);
        assert_eq!(
            Method::from_setting(Some("annotation+label")),
            Method::Annotation
        );
        assert_eq!(Method::from_setting(Some(" label ")), Method::Label);
        assert_eq!(
            Method::from_setting(Some("something-new")),
            Method::Annotation
        );
    }
}
