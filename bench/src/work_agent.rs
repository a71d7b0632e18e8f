//! The OCM work agent as the benchmarks play it: for a ManifestWork the hub
//! wrote, what the work agent writes back once the spoke's Argo CD has
//! synced the delivered Application (the Applied conditions and the status
//! feedback, through the status subresource).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use argocd_pull_apis::ocm::ManifestWork;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// When the simulated sync started (the feedback's `operationStateStartedAt`).
pub const STARTED_AT: &str = "2026-01-01T00:00:00Z";

/// A delivered work as the benchmark's work agent needs it.
#[derive(Clone, Debug)]
pub struct SeenWork {
    pub namespace: String,
    pub name: String,
    /// The delivered Application's namespace and name (its resourceMeta).
    pub app_namespace: String,
    pub app_name: String,
}

pub fn manifestwork_resource() -> ApiResource {
    ApiResource::erase::<ManifestWork>(&())
}

/// Writes the feedback of `w`'s Application synced and healthy at
/// `revision`, the manifest matched by its resourceMeta.
pub async fn feed_back(client: kube::Client, w: SeenWork, revision: &str) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, &w.namespace, &manifestwork_resource());
    let values: Vec<Value> = [
        ("healthStatus", "Healthy"),
        ("syncStatus", "Synced"),
        ("syncRevision", revision),
        ("operationStatePhase", "Succeeded"),
        ("operationStateStartedAt", STARTED_AT),
    ]
    .iter()
    .map(|(n, v)| json!({ "name": n, "fieldValue": { "type": "String", "string": v } }))
    .collect();
    let status = json!({ "status": {
        "conditions": [{ "type": "Applied", "status": "True", "reason": "AppliedManifestWorkComplete",
                         "message": "Apply manifest work complete", "lastTransitionTime": STARTED_AT }],
        "resourceStatus": { "manifests": [{
            "resourceMeta": { "group": "argoproj.io", "version": "v1alpha1", "kind": "Application",
                              "resource": "applications", "namespace": w.app_namespace,
                              "name": w.app_name, "ordinal": 0 },
            "conditions": [{ "type": "Applied", "status": "True", "reason": "AppliedManifestComplete",
                             "message": "Apply manifest complete", "lastTransitionTime": STARTED_AT }],
            "statusFeedback": { "values": values }
        }]}
    }});
    api.patch_status(&w.name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .with_context(|| format!("feedback for ManifestWork {}/{}", w.namespace, w.name))?;
    Ok(())
}

/// The commit the simulated spoke reports for a target revision.
pub fn synced_revision(target: &str) -> String {
    format!("commit-of-{target}")
}

/// Whether a hub copy shows its work's feedback for the target revision
/// its spec names: synced at [`synced_revision`] of it, and healthy.
pub fn shows_feedback(app: &DynamicObject) -> bool {
    let at = |p: &str| app.data.pointer(p).and_then(Value::as_str);
    let target = at("/spec/source/targetRevision").unwrap_or_default();
    at("/status/health/status") == Some("Healthy")
        && at("/status/sync/status") == Some("Synced")
        && at("/status/sync/revision") == Some(synced_revision(target).as_str())
}

/// Plays the work agent of every cluster: each time a ManifestWork's
/// Application names a target revision not fed back yet, writes the
/// feedback of it synced at [`synced_revision`] of that target, at most
/// `concurrency` writes at once. Runs until the task is aborted.
pub fn play(client: kube::Client, concurrency: usize) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &manifestwork_resource());
        let permits = Arc::new(Semaphore::new(concurrency.max(1)));
        let mut fed: HashMap<(String, String), String> = HashMap::new();
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(next) = events.next().await {
            let Ok(work) = next else { continue };
            let Some((seen, target)) = delivered_application(&work) else {
                continue;
            };
            let key = (seen.namespace.clone(), seen.name.clone());
            if fed.get(&key) == Some(&target) {
                continue;
            }
            fed.insert(key, target.clone());
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            let client = client.clone();
            tokio::spawn(async move {
                if let Err(e) = feed_back(client, seen, &synced_revision(&target)).await {
                    eprintln!("work agent: {e:#}");
                }
                drop(permit);
            });
        }
    })
}

/// The work and the Application it delivers (its first manifest), with
/// the target revision that Application names.
fn delivered_application(work: &DynamicObject) -> Option<(SeenWork, String)> {
    let app = work.data.pointer("/spec/workload/manifests/0")?;
    let at = |p: &str| app.pointer(p).and_then(Value::as_str).map(str::to_string);
    if at("/kind").as_deref() != Some("Application") || work.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let seen = SeenWork {
        namespace: work.metadata.namespace.clone()?,
        name: work.metadata.name.clone()?,
        app_namespace: at("/metadata/namespace")?,
        app_name: at("/metadata/name")?,
    };
    Some((seen, at("/spec/source/targetRevision")?))
}
