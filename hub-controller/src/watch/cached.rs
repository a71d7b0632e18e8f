//! An Application as the watch caches keep it: typed metadata (without
//! `managedFields`) and everything else (spec, status, operation, fields
//! this code does not know) as compact JSON text, compressed
//! ([`crate::compact`]), turned back into an [`Application`] when one is
//! read.
//!
//! A parsed `serde_json::Value` takes many times the memory of its JSON
//! (every small object is a B-tree node of its own), and a hub copy carries
//! its spoke's whole status: a heap profile of `make bench-grpc-fleet`
//! (10,000 Applications) showed about 23 KiB per Application in the
//! ManifestWork controller's cache, and 37 KiB in the gRPC index's, which
//! also kept the managedFields (docs/grpc.md). Kept as text an Application
//! takes about what its JSON does, and it is parsed only when it changes or
//! is reconciled.

use std::borrow::Cow;

use argocd_pull_apis::argocd::{API_VERSION, Application, GROUP, KIND, PLURAL, VERSION};
use argocd_pull_apis::ocm::ManifestWork;
use kube::api::{DynamicObject, ObjectMeta, TypeMeta};
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Deserializer};

use crate::compact::CompactJson;
use crate::watch::pairs::Pairs;

/// Its kind is static (`DynamicType = ()`): every key of the caches and
/// queues (`ObjectRef<CachedApp>`) would otherwise carry its own copy of
/// the five strings of an `ApiResource`, and the `apiVersion` and `kind`
/// are not kept per Application either.
///
/// Its labels and annotations are kept packed ([`Pairs`]), outside the
/// metadata that [`kube::Resource::meta`] shows: read them with
/// [`CachedApp::labels`] and [`CachedApp::annotations`] (these shadow the
/// `ResourceExt` methods, whose maps here are always empty), or the whole
/// metadata with [`CachedApp::metadata`].
#[derive(Clone, Debug)]
pub struct CachedApp {
    /// Without `labels`, `annotations` and `managedFields`.
    identity: ObjectMeta,
    labels: Pairs,
    annotations: Pairs,
    /// Its `spec.project` unless `default` (most are): a project's change
    /// finds its Applications without parsing every one.
    project: Option<Box<str>>,
    /// Every field but `apiVersion`, `kind` and `metadata`, as a JSON object.
    body: CompactJson,
}

impl CachedApp {
    /// The Application, parsed again.
    pub fn application(&self) -> Application {
        DynamicObject {
            types: Some(TypeMeta {
                api_version: API_VERSION.into(),
                kind: KIND.into(),
            }),
            metadata: self.metadata(),
            data: self.body.parse().expect("written by `From<Application>`"),
        }
    }

    /// Its `.status` alone: the rest of the body is skipped, not built
    /// (the tree writer reads it on every change of a copy).
    pub fn status(&self) -> Option<serde_json::Value> {
        #[derive(serde::Deserialize)]
        struct Body {
            status: Option<serde_json::Value>,
        }
        self.body.parse::<Body>().ok()?.status
    }

    /// The whole metadata (but `managedFields`), labels and annotations
    /// unpacked.
    pub fn metadata(&self) -> ObjectMeta {
        ObjectMeta {
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            ..self.identity.clone()
        }
    }

    /// The metadata without labels and annotations (what
    /// [`kube::Resource::meta`] shows): name, uid, resourceVersion and the
    /// rest, without unpacking anything.
    pub fn identity(&self) -> &ObjectMeta {
        &self.identity
    }

    pub fn labels(&self) -> &Pairs {
        &self.labels
    }

    pub fn annotations(&self) -> &Pairs {
        &self.annotations
    }

    /// Its AppProject (`spec.project`, `default` when unset).
    pub fn project(&self) -> &str {
        self.project
            .as_deref()
            .unwrap_or(argocd_pull_apis::argocd::DEFAULT_PROJECT)
    }
}

impl From<Application> for CachedApp {
    fn from(mut app: Application) -> Self {
        app.metadata.managed_fields = None;
        let project = argocd_pull_apis::argocd::project_of(&app);
        let project =
            (project != argocd_pull_apis::argocd::DEFAULT_PROJECT).then(|| project.into());
        Self {
            project,
            labels: app.metadata.labels.take().unwrap_or_default().into(),
            annotations: app.metadata.annotations.take().unwrap_or_default().into(),
            identity: app.metadata,
            body: CompactJson::new(
                serde_json::to_vec(&app.data).expect("a Value always serializes"),
            ),
        }
    }
}

impl<'de> Deserialize<'de> for CachedApp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Application::deserialize(d).map(Self::from)
    }
}

impl kube::Resource for CachedApp {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        API_VERSION.into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.identity
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.identity
    }
}

/// A ManifestWork as the cache keeps it, the same way: typed metadata and
/// the rest (the spec with the delivered Application, the status with the
/// work agent's feedback) as JSON text. Parsed, a work took several times
/// its JSON (the delivered Application is a tree of small maps); with one
/// work per Application it was the largest part of the hub's memory.
#[derive(Clone, Debug)]
pub struct CachedWork {
    pub metadata: ObjectMeta,
    /// Every field but `metadata`, as a JSON object.
    body: CompactJson,
}

impl CachedWork {
    /// The ManifestWork, parsed again.
    pub fn work(&self) -> ManifestWork {
        let mut v: serde_json::Value = self.body.parse().expect("written by `From<ManifestWork>`");
        v["metadata"] = serde_json::to_value(&self.metadata).expect("metadata serializes");
        serde_json::from_value(v).expect("was a ManifestWork")
    }
}

impl From<ManifestWork> for CachedWork {
    fn from(mut work: ManifestWork) -> Self {
        let metadata = std::mem::take(&mut work.metadata);
        let mut v = serde_json::to_value(&work).expect("a ManifestWork serializes");
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
        }
        Self {
            metadata: ObjectMeta {
                managed_fields: None,
                ..metadata
            },
            body: CompactJson::new(v.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for CachedWork {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ManifestWork::deserialize(d).map(Self::from)
    }
}

impl kube::Resource for CachedWork {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn group(dt: &()) -> Cow<'_, str> {
        ManifestWork::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        ManifestWork::version(dt)
    }

    fn kind(dt: &()) -> Cow<'_, str> {
        ManifestWork::kind(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        ManifestWork::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        ManifestWork::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_applications_project_is_at_hand_without_parsing() {
        let project = |spec: serde_json::Value| {
            let app: CachedApp = serde_json::from_value(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": { "name": "a", "namespace": "team" }, "spec": spec,
            }))
            .unwrap();
            (app.project().to_string(), app.project.is_some())
        };
        assert_eq!(project(json!({ "project": "team" })), ("team".into(), true));
        assert_eq!(
            project(json!({ "project": "default" })),
            ("default".into(), false)
        );
        assert_eq!(project(json!({ "project": "" })), ("default".into(), false));
        assert_eq!(project(json!({})), ("default".into(), false));
    }

    #[test]
    fn an_application_comes_back_whole_without_managed_fields() {
        let wire = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "a", "namespace": "team", "uid": "u1",
                "labels": { "l": "1" }, "annotations": { "x": "y" },
                "managedFields": [ { "manager": "m", "operation": "Apply", "fieldsType": "FieldsV1",
                                     "fieldsV1": { "f:status": {} } } ] },
            "spec": { "project": "default", "unknownField": [1, 2] },
            "status": { "health": { "status": "Healthy" } },
            "operation": { "sync": {} }
        });
        let cached: CachedApp = serde_json::from_value(wire.clone()).unwrap();
        assert!(cached.metadata().managed_fields.is_none());
        // Packed apart from the metadata the reflector and ResourceExt see.
        assert_eq!(cached.labels().get("l"), Some("1"));
        assert_eq!(cached.annotations().get("x"), Some("y"));
        assert!(kube::ResourceExt::labels(&cached).is_empty());
        let mut want: Application = serde_json::from_value(wire).unwrap();
        want.metadata.managed_fields = None;
        let got = cached.application();
        assert_eq!(
            serde_json::to_value(&got).unwrap(),
            serde_json::to_value(&want).unwrap()
        );
        assert_eq!(
            cached.status(),
            Some(json!({ "health": { "status": "Healthy" } }))
        );
        let without: CachedApp = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "b" }, "spec": {}
        }))
        .unwrap();
        assert_eq!(without.status(), None);
    }

    #[test]
    fn a_work_comes_back_whole_without_managed_fields() {
        let wire = json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": { "name": "team.a", "namespace": "c1", "resourceVersion": "5",
                "annotations": { "x": "y" },
                "managedFields": [ { "manager": "m", "operation": "Apply" } ] },
            "spec": { "workload": { "manifests": [ { "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Application", "metadata": { "name": "a" }, "spec": { "project": "p" } } ] } },
            "status": { "conditions": [ { "type": "Applied", "status": "True", "reason": "r",
                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z" } ] }
        });
        let cached: CachedWork = serde_json::from_value(wire.clone()).unwrap();
        assert!(cached.metadata.managed_fields.is_none());
        let mut want: ManifestWork = serde_json::from_value(wire).unwrap();
        want.metadata.managed_fields = None;
        assert_eq!(
            serde_json::to_value(cached.work()).unwrap(),
            serde_json::to_value(&want).unwrap()
        );
    }
}
