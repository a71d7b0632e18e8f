//! Argo CD's Application and AppProject, hand-written as views rather than
//! generated.
//!
//! Both travel hub -> spoke untouched, including fields that a newer Argo CD
//! adds and we do not know; a generated struct would drop them. So each
//! stays a [`DynamicObject`]: metadata typed, everything else JSON, and the
//! few fields the hub reads are parsed into small typed views
//! ([`ProjectSpec`], [`project_of`], [`source_repos`]).

use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;

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

pub const PROJECT_KIND: &str = "AppProject";
pub const PROJECT_PLURAL: &str = "appprojects";
/// The project an Application without `spec.project` uses.
pub const DEFAULT_PROJECT: &str = "default";

/// The API resource of `appprojects.argoproj.io`.
pub fn appproject_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, PROJECT_KIND),
        PROJECT_PLURAL,
    )
}

/// An AppProject: typed metadata, every other field kept as JSON (it is
/// delivered to clusters as it is, but for what [`ProjectSpec`] names).
pub type AppProject = DynamicObject;

/// What the hub reads of an AppProject's spec (Argo CD v3's field names).
/// Unknown fields are ignored here and kept in the [`AppProject`] itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectSpec {
    /// Namespaces (globs, or `/regexp/`) outside the control-plane
    /// namespace whose Applications may use the project.
    #[serde(default, deserialize_with = "null_as_default")]
    pub source_namespaces: Vec<String>,
    /// Where its Applications may deploy; `!` entries deny.
    #[serde(default, deserialize_with = "null_as_default")]
    pub destinations: Vec<ProjectDestination>,
    /// Repository URL globs its Applications may use; `!` entries deny.
    #[serde(default, deserialize_with = "null_as_default")]
    pub source_repos: Vec<String>,
}

/// One `spec.destinations` entry: a cluster by `server` or `name`, and a
/// namespace (each a glob; `!` denies).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ProjectDestination {
    #[serde(default, deserialize_with = "null_as_default")]
    pub server: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub namespace: String,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl ProjectSpec {
    /// The spec of `project`; a spec of the wrong shape reads as empty,
    /// which allows nothing (the API server's schema refuses such specs).
    pub fn of(project: &AppProject) -> Self {
        project
            .data
            .get("spec")
            .and_then(|s| Self::deserialize(s).ok())
            .unwrap_or_default()
    }
}

/// The project an Application uses: `spec.project`, or [`DEFAULT_PROJECT`]
/// when it is empty or missing (as Argo CD reads it).
pub fn project_of(app: &Application) -> &str {
    app.data
        .get("spec")
        .and_then(|s| s.get("project"))
        .and_then(|p| p.as_str())
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_PROJECT)
}

/// Every repository URL an Application reads: `spec.source.repoURL`, each
/// of `spec.sources`, and the source hydrator's dry source.
pub fn source_repos(app: &Application) -> Vec<&str> {
    let spec = app.data.get("spec");
    fn field(v: Option<&serde_json::Value>) -> Option<&str> {
        v.and_then(|s| s.get("repoURL")).and_then(|u| u.as_str())
    }
    let mut repos = Vec::new();
    // In Argo CD's order: the hydrator, then several sources, then one.
    if let Some(dry) = spec
        .and_then(|s| s.get("sourceHydrator"))
        .filter(|h| !h.is_null())
        .and_then(|h| h.get("drySource"))
    {
        repos.push(field(Some(dry)).unwrap_or_default());
    } else if let Some(sources) = spec
        .and_then(|s| s.get("sources"))
        .and_then(|s| s.as_array())
        .filter(|s| !s.is_empty())
    {
        repos.extend(sources.iter().map(|s| field(Some(s)).unwrap_or_default()));
    } else {
        repos.push(field(spec.and_then(|s| s.get("source"))).unwrap_or_default());
    }
    repos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_version_is_the_group_and_version() {
        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
        assert_eq!(application_resource().api_version, API_VERSION);
        assert_eq!(appproject_resource().plural, PROJECT_PLURAL);
    }

    fn object(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_project_view_reads_what_argo_cd_reads() {
        let p = object(serde_json::json!({
            "apiVersion": API_VERSION, "kind": PROJECT_KIND,
            "metadata": { "name": "p", "namespace": "argocd" },
            "spec": { "sourceNamespaces": ["aaa-*"], "sourceRepos": null,
                      "destinations": [{ "name": "c1", "namespace": "aaa-*" }],
                      "roles": [{ "name": "unknown to the view" }] }
        }));
        let spec = ProjectSpec::of(&p);
        assert_eq!(spec.source_namespaces, ["aaa-*"]);
        assert!(spec.source_repos.is_empty());
        assert_eq!(spec.destinations[0].name, "c1");
        assert_eq!(spec.destinations[0].server, "");
        let app = |spec: serde_json::Value| {
            object(serde_json::json!({
                "apiVersion": API_VERSION, "kind": KIND,
                "metadata": { "name": "a", "namespace": "n" }, "spec": spec }))
        };
        assert_eq!(project_of(&app(serde_json::json!({}))), DEFAULT_PROJECT);
        assert_eq!(
            project_of(&app(serde_json::json!({ "project": "" }))),
            DEFAULT_PROJECT
        );
        assert_eq!(project_of(&app(serde_json::json!({ "project": "x" }))), "x");
        let multi = app(serde_json::json!({
            "source": { "repoURL": "ignored" },
            "sources": [{ "repoURL": "a" }, { "repoURL": "b" }] }));
        assert_eq!(source_repos(&multi), ["a", "b"]);
        assert_eq!(
            source_repos(&app(serde_json::json!({ "source": { "repoURL": "s" } }))),
            ["s"]
        );
        assert_eq!(source_repos(&app(serde_json::json!({}))), [""]);
        let hydrated =
            app(serde_json::json!({ "sourceHydrator": { "drySource": { "repoURL": "d" } } }));
        assert_eq!(source_repos(&hydrated), ["d"]);
    }
}
