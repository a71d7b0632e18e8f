//! Pure: what a managed cluster receives of an AppProject its delivered
//! Applications use, and of that project's repository credentials: one
//! ManifestWork per project per cluster (`argocd-pull-project-<project>`),
//! holding the AppProject and its project-scoped `repository` and
//! `repo-creds` Secrets.
//!
//! The AppProject is delivered as the hub has it (fields this code does not
//! know included) but for what only means something on the hub: its
//! `destinations` are those that apply to this cluster, rewritten to the
//! cluster's own Argo CD's view of itself (`in-cluster`,
//! `https://kubernetes.default.svc`; namespaces kept, deny entries kept),
//! and its `roles` (hub API tokens) are dropped. The cluster's Argo CD then
//! enforces the project itself, kind rules included.

use std::collections::BTreeMap;

use argocd_pull_apis::argocd::{AppProject, ProjectDestination, ProjectSpec};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{
    ManifestWork, ManifestWorkDeleteOption, ManifestWorkDeleteOptionPropagationPolicy,
    ManifestWorkDeleteOptionSelectivelyOrphans,
    ManifestWorkDeleteOptionSelectivelyOrphansOrphaningRules, ManifestWorkManifestConfigs,
    ManifestWorkManifestConfigsResourceIdentifier, ManifestWorkManifestConfigsUpdateStrategy,
    ManifestWorkManifestConfigsUpdateStrategyServerSideApply,
    ManifestWorkManifestConfigsUpdateStrategyType, ManifestWorkSpec, ManifestWorkWorkload,
};
use k8s_openapi::api::core::v1::Secret;
use kube::core::ObjectMeta;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::work::{MANAGED_BY, MANAGED_BY_LABEL, MAX_MANIFESTS_BYTES, MAX_NAME, WorkError};
use crate::render::delivered::IN_CLUSTER;

/// Label on a project work naming its AppProject. App works never have a
/// name without a dot; project works never have one with.
pub const PROJECT_LABEL: &str = "argocd-pull.io/project";
const PREFIX: &str = "argocd-pull-project-";
/// The secret types that carry repository credentials.
pub const CREDENTIAL_TYPES: [&str; 2] = ["repository", "repo-creds"];

/// The name of the work carrying `project` to a cluster: no dot, so never
/// an Application's `<namespace>.<name>`.
pub fn project_work_name(project: &str) -> String {
    let flat = project.replace('.', "-");
    let full = format!("{PREFIX}{flat}");
    if full.len() <= MAX_NAME && flat == project {
        return full;
    }
    let hash: String = Sha256::digest(project.as_bytes())[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut prefix: String = full.chars().take(MAX_NAME - hash.len() - 1).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}-{hash}")
}

/// The project a credential Secret is scoped to (its `project` key), when
/// it is a `repository` or `repo-creds` Secret.
pub fn scoped_project(secret: &Secret) -> Option<String> {
    let kind = secret
        .metadata
        .labels
        .as_ref()?
        .get(keys::ARGOCD_SECRET_TYPE)?;
    if !CREDENTIAL_TYPES.contains(&kind.as_str()) {
        return None;
    }
    let from_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get("project"))
        .and_then(|b| String::from_utf8(b.0.clone()).ok());
    let from_string = secret
        .string_data
        .as_ref()
        .and_then(|d| d.get("project"))
        .cloned();
    from_data.or(from_string).filter(|p| !p.is_empty())
}

/// The project-scoped credentials among `secrets`, as a cluster gets them
/// in `namespace` ([`delivered_secret`]), by project; unscoped ones and
/// other Secrets are left out.
pub fn credentials_by_project<'a>(
    secrets: impl IntoIterator<Item = &'a Secret>,
    namespace: &str,
) -> BTreeMap<String, Vec<Value>> {
    let mut by_project: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for s in secrets {
        if let Some(p) = scoped_project(s) {
            by_project
                .entry(p)
                .or_default()
                .push(delivered_secret(s, namespace));
        }
    }
    by_project
}

/// The AppProject as cluster `cluster`'s Argo CD gets it, in `namespace`.
pub fn delivered_project(project: &AppProject, cluster: &str, namespace: &str) -> Value {
    let name = project.metadata.name.clone().unwrap_or_default();
    let mut spec = match project.data.get("spec") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let destinations: Vec<ProjectDestination> = crate::route::project::destinations_on_cluster(
        &ProjectSpec::of(project),
        cluster,
        Some(IN_CLUSTER),
    );
    spec.insert(
        "destinations".into(),
        Value::Array(
            destinations
                .into_iter()
                .map(|d| json!({ "name": d.name, "server": d.server, "namespace": d.namespace }))
                .collect(),
        ),
    );
    spec.remove("roles");
    json!({
        "apiVersion": argocd_pull_apis::argocd::API_VERSION,
        "kind": argocd_pull_apis::argocd::PROJECT_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { MANAGED_BY_LABEL: MANAGED_BY },
        },
        "spec": spec,
    })
}

/// A credential Secret as the cluster gets it, in `namespace`: its data and
/// its secret-type label, nothing else of the hub's metadata.
pub fn delivered_secret(secret: &Secret, namespace: &str) -> Value {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]);
    if let Some(t) = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::ARGOCD_SECRET_TYPE))
    {
        labels.insert(keys::ARGOCD_SECRET_TYPE.into(), t.clone());
    }
    let mut data: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in secret.data.iter().flatten() {
        data.insert(k.clone(), base64_encode(&v.0));
    }
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(k.clone(), base64_encode(v.as_bytes()));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret.metadata.name.clone().unwrap_or_default(),
            "namespace": namespace,
            "labels": labels,
        },
        "type": secret.type_.clone().unwrap_or_else(|| "Opaque".into()),
        "data": data,
    })
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The work carrying `manifests` (a delivered project and its Secrets) of
/// `project` to `cluster`. Server-side applied with force, so an edit on
/// the cluster is reverted by the work agent.
pub fn project_work(
    cluster: &str,
    project: &str,
    manifests: Vec<Value>,
) -> Result<ManifestWork, WorkError> {
    let size = serde_json::to_vec(&manifests).map_or(usize::MAX, |v| v.len());
    if size > MAX_MANIFESTS_BYTES {
        return Err(WorkError::TooLarge { size });
    }
    let configs = manifests.iter().map(manifest_config).collect();
    let orphaning_rules = orphaning_rules(&manifests);
    let manifests: Vec<BTreeMap<String, Value>> = manifests
        .into_iter()
        .map(|m| match m {
            Value::Object(map) => map.into_iter().collect(),
            _ => BTreeMap::new(),
        })
        .collect();
    let spec = ManifestWorkSpec {
        workload: Some(ManifestWorkWorkload {
            manifests: Some(manifests),
        }),
        manifest_configs: Some(configs),
        delete_option: Some(ManifestWorkDeleteOption {
            propagation_policy: Some(ManifestWorkDeleteOptionPropagationPolicy::SelectivelyOrphan),
            selectively_orphans: Some(ManifestWorkDeleteOptionSelectivelyOrphans {
                orphaning_rules: Some(orphaning_rules),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(ManifestWork {
        metadata: project_work_metadata(cluster, project, &spec),
        spec,
        status: None,
    })
}

/// How the work agent applies one of a project work's manifests (the
/// AppProject or a credential Secret): server-side, with force.
fn manifest_config(m: &Value) -> ManifestWorkManifestConfigs {
    let (group, resource) = match m["kind"].as_str() {
        Some("Secret") => ("", "secrets"),
        _ => ("argoproj.io", "appprojects"),
    };
    ManifestWorkManifestConfigs {
        resource_identifier: ManifestWorkManifestConfigsResourceIdentifier {
            group: Some(group.into()),
            resource: resource.into(),
            namespace: m["metadata"]["namespace"].as_str().map(Into::into),
            name: m["metadata"]["name"].as_str().unwrap_or_default().into(),
        },
        update_strategy: Some(ManifestWorkManifestConfigsUpdateStrategy {
            r#type: ManifestWorkManifestConfigsUpdateStrategyType::ServerSideApply,
            server_side_apply: Some(ManifestWorkManifestConfigsUpdateStrategyServerSideApply {
                force: Some(true),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// What of a project work's `manifests` stays on the cluster when the work
/// is deleted.
fn orphaning_rules(
    manifests: &[Value],
) -> Vec<ManifestWorkDeleteOptionSelectivelyOrphansOrphaningRules> {
    // The AppProject stays on the cluster when the work goes: Applications
    // of it may still be finishing their deletion there (the cluster's Argo
    // CD cannot run an Application's cascade finalizer without its
    // project), and a project such as `default` belongs to the cluster's own
    // Argo CD install. Credentials are deleted with the work.
    manifests
        .iter()
        .filter(|m| m["kind"].as_str() != Some("Secret"))
        .map(
            |m| ManifestWorkDeleteOptionSelectivelyOrphansOrphaningRules {
                group: Some("argoproj.io".into()),
                resource: "appprojects".into(),
                namespace: m["metadata"]["namespace"].as_str().map(Into::into),
                name: m["metadata"]["name"].as_str().unwrap_or_default().into(),
            },
        )
        .collect()
}

/// The name of the work carrying `project` to `cluster`, in the cluster's
/// namespace, labelled as argocd-pull's and with its project, and
/// annotated with the hash of `spec`.
fn project_work_metadata(cluster: &str, project: &str, spec: &ManifestWorkSpec) -> ObjectMeta {
    ObjectMeta {
        name: Some(project_work_name(project)),
        namespace: Some(cluster.into()),
        labels: Some(BTreeMap::from([
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            (PROJECT_LABEL.to_string(), label_value(project)),
        ])),
        annotations: Some(BTreeMap::from([(
            PROJECT_SPEC_HASH.to_string(),
            spec_hash(spec),
        )])),
        ..Default::default()
    }
}

/// Annotation on a project work: a hash of the spec it was rendered with.
/// The API server defaults fields of a stored work (the work agent's field
/// manager, for one), so a stored spec never equals a rendered one; the
/// hash says whether the work must be applied again.
pub const PROJECT_SPEC_HASH: &str = "argocd-pull.io/project-spec-hash";

fn spec_hash(spec: &ManifestWorkSpec) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// `project` as a label value (at most 63 characters, else hashed).
fn label_value(project: &str) -> String {
    if project.len() <= 63 && !project.contains('.') {
        return project.to_string();
    }
    let hash: String = Sha256::digest(project.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_project_is_delivered_for_the_clusters_own_argo_cd() {
        let p: AppProject = object(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": { "name": "aaa", "namespace": "argocd", "uid": "hub-only",
                          "labels": { "hub": "only" } },
            "spec": { "sourceRepos": ["https://git/*"], "sourceNamespaces": ["aaa-*"],
                "destinations": [{ "name": "cluster1", "namespace": "aaa-*" },
                                 { "name": "cluster2", "namespace": "other" }],
                "roles": [{ "name": "ci" }], "futureField": { "kept": true },
                "clusterResourceWhitelist": [{ "group": "", "kind": "Namespace" }] },
            "status": { "jwtTokensByRole": {} }
        }));
        let d = delivered_project(&p, "cluster1", "argocd");
        assert_eq!(
            d["metadata"],
            json!({ "name": "aaa", "namespace": "argocd",
            "labels": { MANAGED_BY_LABEL: MANAGED_BY } })
        );
        assert_eq!(
            d["spec"]["destinations"],
            json!([{ "name": "in-cluster", "server": IN_CLUSTER, "namespace": "aaa-*" }])
        );
        assert!(d["spec"].get("roles").is_none());
        assert_eq!(d["spec"]["futureField"], json!({ "kept": true }));
        assert_eq!(d["spec"]["sourceNamespaces"], json!(["aaa-*"]));
        assert!(d.get("status").is_none());
    }

    #[test]
    fn only_scoped_credentials_name_a_project() {
        let s = |labels: Value, data: Value| -> Secret {
            object(json!({ "apiVersion": "v1", "kind": "Secret",
                "metadata": { "name": "s", "namespace": "argocd", "labels": labels },
                "data": data }))
        };
        let aaa = "YWFh"; // "aaa"
        assert_eq!(
            scoped_project(&s(
                json!({ keys::ARGOCD_SECRET_TYPE: "repository" }),
                json!({ "project": aaa })
            )),
            Some("aaa".into())
        );
        assert_eq!(
            scoped_project(&s(
                json!({ keys::ARGOCD_SECRET_TYPE: "repo-creds" }),
                json!({ "project": aaa })
            )),
            Some("aaa".into())
        );
        // Unscoped, another type, no label: never delivered.
        assert_eq!(
            scoped_project(&s(
                json!({ keys::ARGOCD_SECRET_TYPE: "repository" }),
                json!({})
            )),
            None
        );
        assert_eq!(
            scoped_project(&s(
                json!({ keys::ARGOCD_SECRET_TYPE: "cluster" }),
                json!({ "project": aaa })
            )),
            None
        );
        assert_eq!(
            scoped_project(&s(json!({}), json!({ "project": aaa }))),
            None
        );
        let d = delivered_secret(
            &s(
                json!({ keys::ARGOCD_SECRET_TYPE: "repository", "hub": "only" }),
                json!({ "project": aaa, "password": "cw==" }),
            ),
            "argocd",
        );
        assert_eq!(d["data"], json!({ "project": aaa, "password": "cw==" }));
        assert_eq!(
            d["metadata"]["labels"],
            json!({ keys::ARGOCD_SECRET_TYPE: "repository", MANAGED_BY_LABEL: MANAGED_BY })
        );
    }

    #[test]
    fn project_works_never_take_an_applications_name() {
        assert_eq!(project_work_name("aaa"), "argocd-pull-project-aaa");
        let dotted = project_work_name("a.b");
        assert!(
            !dotted.contains('.') && dotted != project_work_name("a-b"),
            "{dotted}"
        );
        let long = project_work_name(&"x".repeat(253));
        assert!(long.len() <= MAX_NAME && !long.contains('.'), "{long}");
        let w = project_work(
            "c1",
            "aaa",
            vec![json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "s", "namespace": "argocd" } })],
        )
        .unwrap();
        assert_eq!(w.metadata.labels.unwrap()[PROJECT_LABEL], "aaa");
        let configs = w.spec.manifest_configs.unwrap();
        assert_eq!(configs[0].resource_identifier.resource, "secrets");
    }
}
