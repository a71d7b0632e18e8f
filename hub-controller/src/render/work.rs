//! The ManifestWork that carries one hub Application to its cluster.

use std::collections::BTreeMap;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{
    ManifestWork, ManifestWorkManifestConfigs, ManifestWorkManifestConfigsFeedbackRules,
    ManifestWorkManifestConfigsFeedbackRulesJsonPaths,
    ManifestWorkManifestConfigsFeedbackRulesType, ManifestWorkManifestConfigsFeedbackScrapeType,
    ManifestWorkManifestConfigsResourceIdentifier, ManifestWorkManifestConfigsUpdateStrategy,
    ManifestWorkManifestConfigsUpdateStrategyServerSideApply,
    ManifestWorkManifestConfigsUpdateStrategyServerSideApplyIgnoreFields,
    ManifestWorkManifestConfigsUpdateStrategyServerSideApplyIgnoreFieldsCondition,
    ManifestWorkManifestConfigsUpdateStrategyType, ManifestWorkSpec, ManifestWorkWorkload,
};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::delivered::owning_application_set;
use crate::route::target::Target;

/// Label on every ManifestWork argocd-pull manages, so it can list its own.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "argocd-pull";
/// Annotation with the UID of the hub Application the work was built for,
/// so a work left over from a deleted Application of the same name is told
/// apart from the current one.
pub const HUB_APP_UID: &str = "argocd-pull.io/hub-application-uid";

/// OCM refuses a ManifestWork whose manifests exceed 500 KiB.
pub const MAX_MANIFESTS_BYTES: usize = 500 * 1024;
/// Kubernetes object names are DNS subdomains of at most 253 characters,
/// and OCM's work agent names the AppliedManifestWork of a work
/// `<64-character hub hash>-<work name>`: a work name over 188 characters
/// is accepted by the hub and never applied on the cluster.
pub const MAX_NAME: usize = 253 - 64 - 1;
const HASH_LEN: usize = 10;

/// Scalar feedback, which every work agent returns.
pub const FEEDBACK_SCALARS: [(&str, &str); 5] = [
    ("healthStatus", ".status.health.status"),
    ("syncStatus", ".status.sync.status"),
    (
        "operationStateStartedAt",
        ".status.operationState.startedAt",
    ),
    ("operationStatePhase", ".status.operationState.phase"),
    ("syncRevision", ".status.sync.revision"),
];
/// Richer feedback, opt-in. The messages are strings and come back from any
/// work agent; the conditions are a list, returned as JsonRaw only by work
/// agents with the `RawFeedbackJsonString` feature gate, and only up to 1024
/// characters (the work agent's `--max-json-raw-length`).
pub const FEEDBACK_RAW: [(&str, &str); 3] = [
    ("conditions", ".status.conditions"),
    ("operationStateMessage", ".status.operationState.message"),
    ("healthMessage", ".status.health.message"),
];

#[derive(Clone, Debug)]
pub struct WorkOptions {
    /// Ask the work agent for the structured feedback rules too.
    pub raw_feedback: bool,
    /// How long the work agent may take to apply a work before the hub
    /// copy shows `WorkNotApplied`.
    pub apply_timeout: std::time::Duration,
    /// Reconciles that run at once.
    pub workers: usize,
}

impl Default for WorkOptions {
    fn default() -> Self {
        Self {
            raw_feedback: false,
            apply_timeout: std::time::Duration::from_secs(300),
            workers: 32,
        }
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    #[error(
        "the delivered Application is {size} bytes, over the 500 KiB ({MAX_MANIFESTS_BYTES} bytes) ManifestWork limit: \
         move large inline values (e.g. Helm values) into the Git repository"
    )]
    TooLarge { size: usize },
}

/// The name of the ManifestWork for a hub Application: `<namespace>.<name>`,
/// unambiguous because namespaces contain no dots; when that is longer than
/// [`MAX_NAME`] (188) characters, a prefix of it plus a hash of the whole.
pub fn work_name(app_namespace: &str, app_name: &str) -> String {
    let full = format!("{app_namespace}.{app_name}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = hex(&Sha256::digest(full.as_bytes()))[..HASH_LEN].to_string();
    let mut prefix = full[..MAX_NAME - HASH_LEN - 1].to_string();
    // A DNS subdomain's labels end in an alphanumeric character.
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}-{hash}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The ManifestWork delivering `delivered` (built by
/// [`super::delivered_copy`] from `app`) to `target`.
pub fn manifest_work(
    app: &Application,
    target: &Target,
    delivered: Value,
    options: &WorkOptions,
) -> Result<ManifestWork, WorkError> {
    let size = serde_json::to_vec(&delivered)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_MANIFESTS_BYTES {
        return Err(WorkError::TooLarge { size });
    }
    let app_ns = app.metadata.namespace.clone().unwrap_or_default();
    let app_name = app.metadata.name.clone().unwrap_or_default();

    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]);
    let mut annotations = BTreeMap::from([
        (keys::HUB_APP_NAMESPACE.to_string(), app_ns.clone()),
        (keys::HUB_APP_NAME.to_string(), app_name.clone()),
        (
            HUB_APP_UID.to_string(),
            app.metadata.uid.clone().unwrap_or_default(),
        ),
    ]);
    if let Some(set) = owning_application_set(app) {
        labels.insert(keys::APPLICATION_SET_LABEL.into(), "true".into());
        annotations.insert(keys::HOSTING_APPLICATION_SET.into(), set);
    }

    let rules = FEEDBACK_SCALARS
        .iter()
        .chain(
            options
                .raw_feedback
                .then_some(FEEDBACK_RAW.iter())
                .into_iter()
                .flatten(),
        )
        .map(
            |(name, path)| ManifestWorkManifestConfigsFeedbackRulesJsonPaths {
                name: (*name).into(),
                path: (*path).into(),
                ..Default::default()
            },
        )
        .collect();
    let manifest = match delivered {
        Value::Object(map) => map.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    Ok(ManifestWork {
        metadata: ObjectMeta {
            name: Some(work_name(&app_ns, &app_name)),
            namespace: Some(target.cluster.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: ManifestWorkSpec {
            workload: Some(ManifestWorkWorkload {
                manifests: Some(vec![manifest]),
            }),
            manifest_configs: Some(vec![ManifestWorkManifestConfigs {
                resource_identifier: ManifestWorkManifestConfigsResourceIdentifier {
                    group: Some("argoproj.io".into()),
                    resource: "applications".into(),
                    namespace: Some(target.app_namespace.clone()),
                    name: app_name,
                },
                feedback_rules: Some(vec![ManifestWorkManifestConfigsFeedbackRules {
                    r#type: ManifestWorkManifestConfigsFeedbackRulesType::JsonPaths,
                    json_paths: Some(rules),
                }]),
                feedback_scrape_type: Some(ManifestWorkManifestConfigsFeedbackScrapeType::Watch),
                update_strategy: Some(ManifestWorkManifestConfigsUpdateStrategy {
                    r#type: ManifestWorkManifestConfigsUpdateStrategyType::ServerSideApply,
                    server_side_apply: Some(ManifestWorkManifestConfigsUpdateStrategyServerSideApply {
                        force: Some(true),
                        // Argo CD clears .operation once it has run it; without
                        // this the work agent would re-apply it forever.
                        ignore_fields: Some(vec![
                            ManifestWorkManifestConfigsUpdateStrategyServerSideApplyIgnoreFields {
                                condition: ManifestWorkManifestConfigsUpdateStrategyServerSideApplyIgnoreFieldsCondition::OnSpokeChange,
                                json_paths: vec![".operation".into()],
                            },
                        ]),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        },
        status: None,
    })
}

/// The generation the work agent's `Applied=True` condition observed:
/// `None` when the work is not reported applied, `Some(None)` when the
/// report names no generation.
fn applied_generation(work: &ManifestWork) -> Option<Option<i64>> {
    work.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())?
        .iter()
        .find(|c| c.type_ == "Applied" && c.status == "True")
        .map(|c| c.observed_generation)
}

/// Whether the work agent has applied the current version of `work` to the
/// spoke (its `Applied` condition observed this generation).
pub fn applied_on_spoke(work: &ManifestWork) -> bool {
    let generation = work.metadata.generation;
    generation.is_some() && applied_generation(work) == Some(generation)
}

/// Like [`applied_on_spoke`], but a report that names no generation counts
/// as the current one: enough to say the work agent is not silent.
pub fn reported_applied(work: &ManifestWork) -> bool {
    applied_generation(work).is_some_and(|g| g.is_none() || g == work.metadata.generation)
}

/// Whether the desired work is already what the cluster has, so that
/// applying it again would change nothing. The delivered manifests must be
/// equal (the API server stores them as they are, and a removed
/// `.operation` must count); elsewhere the server may add defaults, so the
/// desired fields only need to be present.
pub fn is_applied(desired: &ManifestWork, existing: &ManifestWork) -> bool {
    let (d, e) = match (
        serde_json::to_value(&desired.spec),
        serde_json::to_value(&existing.spec),
    ) {
        (Ok(d), Ok(e)) => (d, e),
        _ => return false,
    };
    let carried = |w: &ManifestWork| {
        w.annotations()
            .contains_key(super::operation::PREVIOUS_STARTED_AT)
    };
    d.get("workload") == e.get("workload")
        && contains(&e, &d)
        && desired
            .labels()
            .iter()
            .all(|(k, v)| existing.labels().get(k) == Some(v))
        && desired
            .annotations()
            .iter()
            .all(|(k, v)| existing.annotations().get(k) == Some(v))
        && carried(desired) == carried(existing)
}

/// Whether `big` has every field of `small` with the same value; lists must
/// have the same length.
fn contains(big: &Value, small: &Value) -> bool {
    match (big, small) {
        (Value::Object(b), Value::Object(s)) => s
            .iter()
            .all(|(k, v)| v.is_null() || b.get(k).is_some_and(|bv| contains(bv, v))),
        (Value::Array(b), Value::Array(s)) => {
            b.len() == s.len() && b.iter().zip(s).all(|(bv, sv)| contains(bv, sv))
        }
        _ => big == small,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::delivered_copy;
    use serde_json::json;

    fn app(name: &str) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": name, "namespace": "hub-apps", "uid": "uid-1" },
            "spec": { "project": "default", "destination": {} }
        }))
        .unwrap()
    }

    fn target() -> Target {
        Target {
            cluster: "cluster1".into(),
            app_namespace: "argocd".into(),
        }
    }

    fn is_dns_subdomain(s: &str) -> bool {
        s.len() <= 253
            && s.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn work_names_are_deterministic_valid_and_distinct() {
        assert_eq!(work_name("hub-apps", "guestbook"), "hub-apps.guestbook");
        // Names that would collide when joined with '-' stay apart.
        assert_ne!(work_name("a-b", "c"), work_name("a", "b-c"));
        let long = "x".repeat(63);
        for name in [
            format!("{long}.{long}.{long}.{long}"),
            format!("{long}.{long}.{long}.{long}-"),
            format!("{long}.{long}.{long}.{}", "y".repeat(50)),
        ] {
            let n = work_name("some-namespace", &name);
            assert!(
                n.len() <= 188,
                "{} chars: the work agent's AppliedManifestWork name must fit",
                n.len()
            );
            assert!(format!("{}-{n}", "h".repeat(64)).len() <= 253);
            assert!(is_dns_subdomain(&n), "{n}");
            assert_eq!(n, work_name("some-namespace", &name), "deterministic");
        }
        // Long names that share the kept prefix still differ.
        let a = format!("{long}.{long}.{long}.{long}a");
        let b = format!("{long}.{long}.{long}.{long}b");
        assert_ne!(work_name("ns", &a), work_name("ns", &b));
    }

    #[test]
    fn manifest_work_shape_matches_the_reference() {
        let app = app("guestbook");
        let t = target();
        let work =
            manifest_work(&app, &t, delivered_copy(&app, &t), &WorkOptions::default()).unwrap();
        let v = serde_json::to_value(&work).unwrap();
        assert_eq!(v["metadata"]["name"], "hub-apps.guestbook");
        assert_eq!(v["metadata"]["namespace"], "cluster1");
        assert_eq!(
            v["metadata"]["annotations"][keys::HUB_APP_NAMESPACE],
            "hub-apps"
        );
        assert_eq!(
            v["metadata"]["annotations"][keys::HUB_APP_NAME],
            "guestbook"
        );
        assert_eq!(v["metadata"]["annotations"][HUB_APP_UID], "uid-1");
        assert_eq!(v["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(
            v["spec"]["workload"]["manifests"][0]["metadata"]["name"],
            "guestbook"
        );
        let config = &v["spec"]["manifestConfigs"][0];
        assert_eq!(
            config["resourceIdentifier"],
            json!({ "group": "argoproj.io", "resource": "applications", "namespace": "argocd", "name": "guestbook" })
        );
        assert_eq!(config["feedbackScrapeType"], "Watch");
        assert_eq!(config["feedbackRules"][0]["type"], "JSONPaths");
        let paths: Vec<(String, String)> = config["feedbackRules"][0]["jsonPaths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().into(),
                    p["path"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(
            paths,
            FEEDBACK_SCALARS
                .iter()
                .map(|(n, p)| (n.to_string(), p.to_string()))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            config["updateStrategy"],
            json!({ "type": "ServerSideApply", "serverSideApply": {
                "force": true,
                "ignoreFields": [{ "condition": "OnSpokeChange", "jsonPaths": [".operation"] }]
            }})
        );
    }

    #[test]
    fn raw_feedback_rules_are_opt_in() {
        let app = app("guestbook");
        let t = target();
        let opts = WorkOptions {
            raw_feedback: true,
            ..Default::default()
        };
        let work = manifest_work(&app, &t, delivered_copy(&app, &t), &opts).unwrap();
        let rules = &work.spec.manifest_configs.unwrap()[0]
            .feedback_rules
            .clone()
            .unwrap()[0];
        assert_eq!(
            rules.json_paths.as_ref().unwrap().len(),
            FEEDBACK_SCALARS.len() + FEEDBACK_RAW.len()
        );
    }

    #[test]
    fn refuses_an_oversized_application_with_a_fix() {
        let mut app = app("big");
        app.data["spec"]["source"] =
            json!({ "helm": { "values": "x".repeat(MAX_MANIFESTS_BYTES) } });
        let t = target();
        let err =
            manifest_work(&app, &t, delivered_copy(&app, &t), &WorkOptions::default()).unwrap_err();
        assert!(matches!(err, WorkError::TooLarge { size } if size > MAX_MANIFESTS_BYTES));
        assert!(err.to_string().contains("500 KiB"), "{err}");
    }

    #[test]
    fn applied_when_nothing_would_change() {
        let a = app("guestbook");
        let desired = manifest_work(
            &a,
            &target(),
            delivered_copy(&a, &target()),
            &WorkOptions::default(),
        )
        .unwrap();
        // The server adds defaults and its own metadata: still applied.
        let mut stored = serde_json::to_value(&desired).unwrap();
        stored["metadata"]["resourceVersion"] = json!("7");
        stored["metadata"]["labels"]["extra"] = json!("x");
        stored["spec"]["deleteOption"] = json!({ "propagationPolicy": "Foreground" });
        let stored: ManifestWork = serde_json::from_value(stored).unwrap();
        assert!(is_applied(&desired, &stored));

        // A changed or removed field of the delivered Application is not.
        let mut op = serde_json::to_value(&stored).unwrap();
        op["spec"]["workload"]["manifests"][0]["operation"] = json!({ "sync": {} });
        let with_op: ManifestWork = serde_json::from_value(op).unwrap();
        assert!(!is_applied(&desired, &with_op));

        // A feedback rule more or less is not.
        let raw = manifest_work(
            &a,
            &target(),
            delivered_copy(&a, &target()),
            &WorkOptions {
                raw_feedback: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!is_applied(&raw, &stored));
        assert!(!is_applied(&desired, &raw));

        // Nor is a missing label, or a handover annotation left behind.
        let mut bare = stored.clone();
        bare.labels_mut().remove(MANAGED_BY_LABEL);
        assert!(!is_applied(&desired, &bare));
        let mut left = stored.clone();
        left.annotations_mut().insert(
            crate::render::operation::PREVIOUS_STARTED_AT.into(),
            String::new(),
        );
        assert!(!is_applied(&desired, &left));
    }

    #[test]
    fn applied_on_spoke_means_this_generation() {
        let mut w: ManifestWork = serde_json::from_value(serde_json::json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": { "name": "w", "generation": 2 },
            "spec": {},
            "status": { "conditions": [{ "type": "Applied", "status": "True",
                "observedGeneration": 1, "reason": "x", "message": "x",
                "lastTransitionTime": "2026-01-01T00:00:00Z" }] }
        }))
        .unwrap();
        assert!(!applied_on_spoke(&w), "an older generation was applied");
        assert!(!reported_applied(&w));
        w.metadata.generation = Some(1);
        assert!(applied_on_spoke(&w) && reported_applied(&w));
        // A report that names no generation: applied for the silence check,
        // not for a refresh hand-over.
        w.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].observed_generation = None;
        assert!(!applied_on_spoke(&w) && reported_applied(&w));
        w.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert!(!applied_on_spoke(&w) && !reported_applied(&w));
    }
}
