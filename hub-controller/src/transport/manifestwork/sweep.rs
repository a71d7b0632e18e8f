//! Periodic removal of ManifestWorks whose hub Application is gone, or no
//! longer targets that cluster. Applications created by an ApplicationSet
//! with `preserveResourcesOnDeletion` have no finalizer, so their deletion
//! is never seen by the reconciler; this is how their works go.
//!
//! The sweep also adopts the works of argocd-pull-integration (named
//! `<app>-<uid prefix>`, with the same back-pointer annotations but not our
//! managed-by label) once our own work delivers the same Application: the
//! old work is switched to `deleteOption: Orphan` and deleted, so the work
//! agent leaves the Application on the spoke to our work.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PartialObjectMeta, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::watch::cached::CachedWork;
use crate::watch::caches::{Caches, work_owner};

use crate::metrics::Metrics;
use crate::render::work::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::route::target::{is_pulled, target};

/// Whether a work should go, given its hub Application (if it still exists).
pub fn is_orphan(work: &impl kube::Resource, app: Option<&Application>) -> bool {
    let Some(app) = app else { return true };
    if app.metadata.deletion_timestamp.is_some() {
        // The reconciler handles deletions of Applications with finalizers.
        return false;
    }
    if !is_pulled(app) {
        return true;
    }
    match target(app) {
        Ok(t) => work.namespace().as_deref() != Some(t.cluster.as_str()),
        // Leave it: the Application shows a condition, and an annotation typo
        // must not delete what runs on the spoke.
        Err(_) => false,
    }
}

/// Whether `work` (metadata) is a work of argocd-pull-integration delivering
/// the same Application that our work `ours` now delivers.
pub fn is_adoptable(work: &PartialObjectMeta<ManifestWork>, ours: &impl kube::Resource) -> bool {
    let (a, o) = (work.annotations(), ours.annotations());
    work.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY)
        && work.name_any() != ours.name_any()
        && work.namespace() == ours.namespace()
        && a.get(keys::HUB_APP_NAMESPACE).is_some()
        && a.get(keys::HUB_APP_NAMESPACE) == o.get(keys::HUB_APP_NAMESPACE)
        && a.get(keys::HUB_APP_NAME) == o.get(keys::HUB_APP_NAME)
        && work.metadata.deletion_timestamp.is_none()
}

/// Orphan-deletes the works of argocd-pull-integration that our `works`
/// replace; returns how many. Only works without our managed-by label are
/// listed (metadata, a page at a time): on a hub where the migration is
/// done that is none, whatever the size of the fleet.
async fn adopt_legacy(
    client: &Client,
    ours: &[Arc<CachedWork>],
    metrics: &Metrics,
) -> Result<usize, kube::Error> {
    let mut ours_by_app: HashMap<(String, String, String), &CachedWork> = HashMap::new();
    for w in ours {
        let a = w.annotations();
        if let (Some(ns), Some(name)) = (a.get(keys::HUB_APP_NAMESPACE), a.get(keys::HUB_APP_NAME))
        {
            ours_by_app.insert(
                (w.namespace().unwrap_or_default(), ns.clone(), name.clone()),
                w,
            );
        }
    }
    let all: Api<ManifestWork> = Api::all(client.clone());
    let mut params = ListParams::default()
        .labels(&format!("!{MANAGED_BY_LABEL}"))
        .limit(PAGE);
    let mut adopted = 0;
    loop {
        let page = all.list_metadata(&params).await?;
        for work in page.items {
            let a = work.annotations();
            let key = (
                work.namespace().unwrap_or_default(),
                a.get(keys::HUB_APP_NAMESPACE).cloned().unwrap_or_default(),
                a.get(keys::HUB_APP_NAME).cloned().unwrap_or_default(),
            );
            let Some(our) = ours_by_app.get(&key) else {
                continue;
            };
            if is_adoptable(&work, *our) && orphan_delete(client, &key.0, &work.name_any()).await? {
                adopted += 1;
                metrics.works_adopted.inc();
                tracing::info!(cluster = %key.0, legacy = %work.name_any(), work = %our.name_any(),
                    namespace = %key.1, name = %key.2, "adopted the Application from an argocd-pull-integration ManifestWork; orphan-deleted the old work");
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(adopted),
        }
    }
}

/// Switches a work to `deleteOption: Orphan` and deletes it, so that the
/// work agent leaves what it applied; false when it is already gone.
async fn orphan_delete(client: &Client, cluster: &str, name: &str) -> Result<bool, kube::Error> {
    let api: Api<ManifestWork> = Api::namespaced(client.clone(), cluster);
    let orphan =
        serde_json::json!({ "spec": { "deleteOption": { "propagationPolicy": "Orphan" } } });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(orphan))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
        Err(e) => return Err(e),
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
        Err(e) => Err(e),
    }
}

/// Page size of the one list the sweep still makes.
const PAGE: u32 = 500;

/// An Application with its metadata only: all that decides whether a work
/// is an orphan.
fn meta_only(meta: ObjectMeta) -> Application {
    Application {
        types: None,
        metadata: meta,
        data: serde_json::Value::Null,
    }
}

/// Whether `work` is an orphan, asked of the API server: the caches named
/// it a candidate, but they may be behind (an Application created a moment
/// ago, or the watch lagging), and a wrongly deleted work would delete what
/// runs on the spoke.
async fn confirmed_orphan(client: &Client, work: &CachedWork) -> Result<bool, kube::Error> {
    let a = work.annotations();
    let (Some(ns), Some(name)) = (a.get(keys::HUB_APP_NAMESPACE), a.get(keys::HUB_APP_NAME)) else {
        return Ok(false);
    };
    let api: Api<Application> = Api::namespaced_with(client.clone(), ns, &application_resource());
    let live = api.get_metadata_opt(name).await?;
    Ok(is_orphan(
        work,
        live.map(|m| meta_only(m.metadata)).as_ref(),
    ))
}

/// One pass; returns how many works were deleted. Candidates come from the
/// watch caches (our works, the pulled Applications), so a pass lists
/// nothing of ours: listing every work each minute was the hub's peak
/// memory (91 of 143 MiB of heap at 5,000 Applications). Each candidate is
/// confirmed against the API server before it is deleted.
pub async fn sweep_once(
    client: &Client,
    caches: &Caches,
    metrics: &Metrics,
) -> Result<usize, kube::Error> {
    caches.wait_synced().await;
    let works = caches.works.state();
    metrics.works_managed.set(works.len() as i64);
    let mut deleted = 0;
    let mut delivering = Vec::with_capacity(works.len());
    for work in works {
        let Some(owner) = work_owner(work.as_ref()) else {
            continue;
        };
        let cached = caches.apps.get(&owner).map(|a| meta_only(a.metadata()));
        if !is_orphan(work.as_ref(), cached.as_ref()) {
            delivering.push(work);
            continue;
        }
        if !confirmed_orphan(client, &work).await? {
            continue;
        }
        let wns = work.namespace().unwrap_or_default();
        let api: Api<ManifestWork> = Api::namespaced(client.clone(), &wns);
        match api.delete(&work.name_any(), &DeleteParams::default()).await {
            Ok(_) => {
                deleted += 1;
                metrics.works_swept.inc();
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        tracing::info!(cluster = %wns, work = %work.name_any(), namespace = %owner.namespace.as_deref().unwrap_or_default(), name = %owner.name, "deleted orphaned ManifestWork");
    }
    if let Err(e) = adopt_legacy(client, &delivering, metrics).await {
        tracing::warn!(error = %e, "could not adopt argocd-pull-integration ManifestWorks; will retry");
    }
    Ok(deleted)
}

/// Sweeps every `interval` until `shutdown` resolves.
pub async fn run(
    client: Client,
    caches: Caches,
    metrics: Metrics,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {
                // A pass waits for the caches first: shutdown must not wait
                // for it (nor for a pass under way).
                tokio::select! {
                    _ = &mut shutdown => return,
                    result = sweep_once(&client, &caches, &metrics) => {
                        if let Err(e) = result {
                            tracing::warn!(error = %e, "sweep of orphaned ManifestWorks failed; will retry");
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn work_in(cluster: &str) -> ManifestWork {
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": { "name": "ns.app", "namespace": cluster }, "spec": {}
        }))
        .unwrap()
    }

    fn app(label: &str, cluster: &str, deleting: bool) -> Application {
        let mut meta = json!({ "name": "app", "namespace": "ns",
            "labels": { keys::PULL_LABEL: label },
            "annotations": { keys::MANAGED_CLUSTER: cluster } });
        if deleting {
            meta["deletionTimestamp"] = json!("2026-11-21T10:00:00Z");
        }
        serde_json::from_value(
            json!({ "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": meta, "spec": {} }),
        )
        .unwrap()
    }

    #[test]
    fn orphan_table() {
        let w = work_in("c1");
        let cases = [
            (None, true, "Application gone"),
            (
                Some(app("true", "c1", false)),
                false,
                "still delivered here",
            ),
            (
                Some(app("true", "c2", false)),
                true,
                "now targets another cluster",
            ),
            (Some(app("false", "c1", false)), true, "opted out"),
            (
                Some(app("true", "c1", true)),
                false,
                "being deleted: the reconciler's job",
            ),
            (
                Some(app("true", "Bad_Name", false)),
                false,
                "annotation typo: never delete",
            ),
        ];
        for (a, want, why) in cases {
            assert_eq!(is_orphan(&w, a.as_ref()), want, "{why}");
        }
    }

    #[test]
    fn adopts_only_legacy_works_of_the_same_application() {
        let mut ours = work_in("c1");
        ours.annotations_mut().extend([
            (keys::HUB_APP_NAMESPACE.to_string(), "ns".to_string()),
            (keys::HUB_APP_NAME.to_string(), "app".to_string()),
        ]);
        ours.labels_mut()
            .insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
        let meta = |name: &str, ns: &str, app_ns: &str, app: &str, label: bool| {
            let mut v = json!({ "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
                "metadata": { "name": name, "namespace": ns,
                    "annotations": { keys::HUB_APP_NAMESPACE: app_ns, keys::HUB_APP_NAME: app } } });
            if label {
                v["metadata"]["labels"] = json!({ MANAGED_BY_LABEL: MANAGED_BY });
            }
            serde_json::from_value::<PartialObjectMeta<ManifestWork>>(v).unwrap()
        };
        let cases = [
            (
                meta("app-1a2b3", "c1", "ns", "app", false),
                true,
                "upstream's work",
            ),
            (
                meta("ns.app", "c1", "ns", "app", false),
                false,
                "our own name",
            ),
            (
                meta("app-1a2b3", "c2", "ns", "app", false),
                false,
                "another cluster",
            ),
            (
                meta("app-1a2b3", "c1", "ns", "other", false),
                false,
                "another Application",
            ),
            (
                meta("app-1a2b3", "c1", "other", "app", false),
                false,
                "another namespace",
            ),
            (
                meta("app-1a2b3", "c1", "ns", "app", true),
                false,
                "carries our label",
            ),
        ];
        for (w, want, why) in cases {
            assert_eq!(is_adoptable(&w, &ours), want, "{why}");
        }
    }
}
