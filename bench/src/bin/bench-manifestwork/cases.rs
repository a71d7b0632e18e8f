//! What a controller gets right under load. Alongside each run's load, a few
//! Applications in their own namespace check four things a user relies on
//! (docs/benchmarks.md, "Correctness under load"):
//!
//! - feedback matched by resource: the work agent reports another manifest
//!   first and the Application second; the hub copy must show the
//!   Application's values, not the first manifest's;
//! - long names: a 253-character Application name (the longest Kubernetes
//!   allows) must get a work and its status;
//! - deleted works: an Application with Argo CD's resources finalizer is
//!   deleted, half of them after their work was deleted out of band; the
//!   Application must go and no work must stay behind;
//! - refresh delivered: `argocd.argoproj.io/refresh` set on the hub copy
//!   must reach the delivered copy in the work.
//!
//! A case that is not right within a minute after the load converged counts
//! as wrong.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::keys;
use argocd_pull_bench::work_agent::{SeenWork, feed_back, manifestwork_resource};
use futures::future::join_all;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::GRACE;
use crate::hub::application;
use crate::run::REVISION;

/// Passed / tried, per case.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    pub by_resource: (usize, usize),
    pub long_names: (usize, usize),
    pub deleted_works: (usize, usize),
    pub refresh: (usize, usize),
}

/// When the run's load converged (or gave up): the cases get [`GRACE`] more.
#[derive(Default)]
pub struct LoadEnd(Mutex<Option<Instant>>);

impl LoadEnd {
    pub fn finish(&self) {
        self.0.lock().unwrap().get_or_insert_with(Instant::now);
    }

    fn over(&self, hard: Instant) -> bool {
        Instant::now() > hard || self.0.lock().unwrap().is_some_and(|t| t.elapsed() > GRACE)
    }
}

const REFRESH: &str = "argocd.argoproj.io/refresh";

/// The longest name Kubernetes allows, unique per index.
pub fn long_name(i: usize) -> String {
    let mut name = format!("long-{i}-");
    while name.len() < 253 {
        name.push('x');
    }
    name
}

/// Runs every case with `k` Applications each in namespace `ns` (which
/// selects `cluster`), started while the load is created.
pub async fn run(
    client: kube::Client,
    ns: String,
    cluster: String,
    k: usize,
    run: usize,
    end: std::sync::Arc<LoadEnd>,
    hard: Instant,
) -> Result<Outcome> {
    let apps: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &application_resource());
    let works: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &cluster, &manifestwork_resource());
    let by_resource: Vec<String> = (0..k).map(|i| format!("by-resource-{i}")).collect();
    let long: Vec<String> = (0..k).map(long_name).collect();
    let deleted: Vec<String> = (0..k).map(|i| format!("deleted-{i}")).collect();
    let refresh: Vec<String> = (0..k).map(|i| format!("refresh-{i}")).collect();
    let all: Vec<&String> = by_resource
        .iter()
        .chain(&long)
        .chain(&deleted)
        .chain(&refresh)
        .collect();

    let tag = format!("{run}-cases");
    for name in &all {
        let mut app = application(name, &ns, &cluster, 0)?;
        app.labels_mut()
            .insert(crate::run::RUN_LABEL.into(), tag.clone());
        if name.starts_with("deleted-") {
            app.finalizers_mut()
                .push(keys::RESOURCES_FINALIZER.to_string());
        }
        // A name the controller cannot handle must not stop the others.
        if let Err(e) = apps.create(&PostParams::default(), &app).await {
            tracing::warn!(name = name.as_str(), "case Application not created: {e}");
        }
    }

    // Every case needs its work first.
    let mut seen: HashMap<String, String> = HashMap::new();
    while seen.len() < all.len() && !end.over(hard) {
        seen = works_by_app(&works, &ns).await.unwrap_or(seen);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let work_of = |app: &str| {
        seen.get(app).map(|w| SeenWork {
            namespace: cluster.clone(),
            name: w.clone(),
            app_namespace: ns.clone(),
            app_name: app.to_string(),
        })
    };

    // The work agent's part, and the user's.
    for name in &by_resource {
        if let Some(w) = work_of(name)
            && let Err(e) = feed_back_second(&client, &w).await
        {
            tracing::warn!("case feedback (by resource) not written: {e:#}");
        }
    }
    for name in &long {
        if let Some(w) = work_of(name)
            && let Err(e) = feed_back(client.clone(), w, crate::run::REVISION).await
        {
            tracing::warn!("case feedback (long name) not written: {e:#}");
        }
    }
    for name in &refresh {
        let patch = json!({ "metadata": { "annotations": { REFRESH: "normal" } } });
        let _ = apps
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await;
    }
    let dp = DeleteParams::background();
    for (i, name) in deleted.iter().enumerate() {
        if i % 2 == 1
            && let Some(w) = seen.get(name)
        {
            let _ = works.delete(w, &dp).await;
        }
        let _ = apps.delete(name, &dp).await;
    }

    // Wait until every case is right, or time is up.
    let mut outcome;
    loop {
        let shows = |name: &String| {
            let apps = apps.clone();
            let name = name.clone();
            async move { matches!(apps.get_opt(&name).await, Ok(Some(a)) if shows_status(&a)) }
        };
        let refreshed = |name: &String| {
            let works = works.clone();
            let work = seen.get(name).cloned();
            async move {
                let Some(work) = work else { return false };
                matches!(works.get_opt(&work).await, Ok(Some(w)) if w.data.pointer(
                    &format!("/spec/workload/manifests/0/metadata/annotations/{}", REFRESH.replace('/', "~1"))
                ).and_then(Value::as_str) == Some("normal"))
            }
        };
        let left = works_by_app(&works, &ns).await.unwrap_or_default();
        let gone = |name: &String| {
            let apps = apps.clone();
            let name = name.clone();
            let work_left = left.contains_key(&name);
            async move { !work_left && matches!(apps.get_opt(&name).await, Ok(None)) }
        };
        let count = |v: Vec<bool>| (v.iter().filter(|b| **b).count(), v.len());
        outcome = Outcome {
            by_resource: count(join_all(by_resource.iter().map(shows)).await),
            long_names: count(join_all(long.iter().map(shows)).await),
            deleted_works: count(join_all(deleted.iter().map(gone)).await),
            refresh: count(join_all(refresh.iter().map(refreshed)).await),
        };
        let all_right = [
            outcome.by_resource,
            outcome.long_names,
            outcome.deleted_works,
            outcome.refresh,
        ]
        .iter()
        .all(|(ok, of)| ok == of);
        if all_right || end.over(hard) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(outcome)
}

fn shows_status(app: &DynamicObject) -> bool {
    let status = app.data.get("status");
    let at = |p: &str| status.and_then(|s| s.pointer(p)).and_then(Value::as_str);
    at("/health/status") == Some("Healthy")
        && at("/sync/status") == Some("Synced")
        && at("/sync/revision") == Some(REVISION)
}

/// The works in the cluster namespace that point back at an Application of
/// namespace `ns`: hub Application name -> work name.
async fn works_by_app(works: &Api<DynamicObject>, ns: &str) -> Result<HashMap<String, String>> {
    let list = works.list_metadata(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter(|w| w.metadata.deletion_timestamp.is_none())
        .filter_map(|w| {
            let a = w.annotations();
            (a.get(keys::HUB_APP_NAMESPACE).map(String::as_str) == Some(ns))
                .then(|| a.get(keys::HUB_APP_NAME).cloned())
                .flatten()
                .map(|app| (app, w.name_any()))
        })
        .collect())
}

/// The work agent's feedback with another manifest reported first, whose
/// values a controller reading index 0 would copy.
async fn feed_back_second(client: &kube::Client, w: &SeenWork) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &w.namespace, &manifestwork_resource());
    let values = |health: &str, sync: &str| -> Vec<Value> {
        [
            ("healthStatus", health),
            ("syncStatus", sync),
            ("syncRevision", REVISION),
        ]
        .iter()
        .map(|(n, v)| json!({ "name": n, "fieldValue": { "type": "String", "string": v } }))
        .collect()
    };
    let status = json!({ "status": { "resourceStatus": { "manifests": [
        { "resourceMeta": { "group": "", "version": "v1", "kind": "ConfigMap", "resource": "configmaps",
                            "namespace": w.app_namespace, "name": "decoy", "ordinal": 1 },
          "conditions": [],
          "statusFeedback": { "values": values("Degraded", "OutOfSync") } },
        { "resourceMeta": { "group": "argoproj.io", "version": "v1alpha1", "kind": "Application",
                            "resource": "applications", "namespace": w.app_namespace,
                            "name": w.app_name, "ordinal": 0 },
          "conditions": [],
          "statusFeedback": { "values": values("Healthy", "Synced") } }
    ]}}});
    api.patch_status(&w.name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_the_longest_allowed_and_distinct() {
        assert_eq!(long_name(0).len(), 253);
        assert_eq!(long_name(12).len(), 253);
        assert_ne!(long_name(1), long_name(2));
    }
}
