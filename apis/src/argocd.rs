//! Argo CD's Application, hand-written as a view rather than generated.
//!
//! The Application travels hub -> spoke untouched, including fields that a
//! newer Argo CD adds and we do not know; a generated struct would drop them.
//! So it stays a [`DynamicObject`] (metadata typed, everything else JSON),
//! and the few fields argocd-pull reads are reached through small accessors.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

pub const GROUP: &str = "argoproj.io";
pub const VERSION: &str = "v1alpha1";

/// The API resource of `applications.argoproj.io`.
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "Application"),
        "applications",
    )
}

/// The API resource of `applicationsets.argoproj.io`.
pub fn application_set_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "ApplicationSet"),
        "applicationsets",
    )
}

/// An Application: typed metadata, every other field kept as JSON.
pub type Application = DynamicObject;

/// Read-only accessors for the fields argocd-pull looks at.
pub trait ApplicationExt {
    /// `.spec`, or JSON null.
    fn spec(&self) -> &serde_json::Value;
    /// A string at a JSON pointer below the object root, e.g. `/status/health/status`.
    fn str_at(&self, pointer: &str) -> Option<&str>;
}

impl ApplicationExt for Application {
    fn spec(&self) -> &serde_json::Value {
        self.data.get("spec").unwrap_or(&serde_json::Value::Null)
    }

    fn str_at(&self, pointer: &str) -> Option<&str> {
        self.data.pointer(pointer).and_then(|v| v.as_str())
    }
}
