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
use kube::core::ObjectMeta;
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
/// work agent; the conditions and the managed resources (what the hub's
/// Argo CD UI draws its tree from) are lists, returned as JsonRaw only by
/// work agents with the `RawFeedbackJsonString` feature gate, and only up
/// to 1024 characters each (the work agent's `--max-json-raw-length`).
pub const FEEDBACK_RAW: [(&str, &str); 4] = [
    ("conditions", ".status.conditions"),
    ("operationStateMessage", ".status.operationState.message"),
    ("healthMessage", ".status.health.message"),
    ("resources", ".status.resources"),
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
    let metadata = work_metadata(app, target, &app_ns, &app_name);
    let rules = feedback_rules(options);
    let manifest = match delivered {
        Value::Object(map) => map.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    Ok(ManifestWork {
        metadata,
        spec: ManifestWorkSpec {
            workload: Some(ManifestWorkWorkload {
                manifests: Some(vec![manifest]),
            }),
            manifest_configs: Some(vec![application_config(target, app_name, rules)]),
            ..Default::default()
        },
        status: None,
    })
}

/// The work's name, in the cluster's namespace, and the labels and
/// annotations that say it is argocd-pull's and which hub Application (of
/// which ApplicationSet, if any) it was built for.
fn work_metadata(app: &Application, target: &Target, app_ns: &str, app_name: &str) -> ObjectMeta {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]);
    let mut annotations = BTreeMap::from([
        (keys::HUB_APP_NAMESPACE.to_string(), app_ns.to_string()),
        (keys::HUB_APP_NAME.to_string(), app_name.to_string()),
        (
            HUB_APP_UID.to_string(),
            app.metadata.uid.clone().unwrap_or_default(),
        ),
    ]);
    if let Some(set) = owning_application_set(app) {
        labels.insert(keys::APPLICATION_SET_LABEL.into(), "true".into());
        annotations.insert(keys::HOSTING_APPLICATION_SET.into(), set);
    }
    ObjectMeta {
        name: Some(work_name(app_ns, app_name)),
        namespace: Some(target.cluster.clone()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    }
}

/// The status fields the work agent sends back: the scalars always, the
/// richer ones when `options` asks for them.
fn feedback_rules(options: &WorkOptions) -> Vec<ManifestWorkManifestConfigsFeedbackRulesJsonPaths> {
    FEEDBACK_SCALARS
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
        .collect()
}

/// How the work agent treats the delivered Application named `app_name` on
/// `target`: watched for the feedback `rules`, server-side applied with
/// force, its `.operation` left to the cluster's Argo CD.
fn application_config(
    target: &Target,
    app_name: String,
    rules: Vec<ManifestWorkManifestConfigsFeedbackRulesJsonPaths>,
) -> ManifestWorkManifestConfigs {
    ManifestWorkManifestConfigs {
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
    }
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
mod tests;
