//! Argo CD's Application, hand-written as a view rather than generated.
//!
//! The Application travels hub -> spoke untouched, including fields that a
//! newer Argo CD adds and we do not know; a generated struct would drop them.
//! So it stays a [`DynamicObject`]: metadata typed, everything else JSON.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

pub const GROUP: &str = "argoproj.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "argoproj.io/v1alpha1";
pub const KIND: &str = "Application";
pub const PLURAL: &str = "applications";

/// The API resource of `applications.argoproj.io`.
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// An Application: typed metadata, every other field kept as JSON.
pub type Application = DynamicObject;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_version_is_the_group_and_version() {
        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
        assert_eq!(application_resource().api_version, API_VERSION);
    }
}
