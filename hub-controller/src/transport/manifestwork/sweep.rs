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
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use kube::api::{Api, DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::{Client, ResourceExt};

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
/// replace; returns how many.
async fn adopt_legacy(
    client: &Client,
    ours: &[WorkMeta],
    metrics: &Metrics,
) -> Result<usize, kube::Error> {
    // Only metadata: the hub may hold many works that are not ours.
    let all: Api<ManifestWork> = Api::all(client.clone());
    let mut ours_by_app: HashMap<(String, String, String), &WorkMeta> = HashMap::new();
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
    let mut adopted = 0;
    for work in all.list_metadata(&ListParams::default()).await?.items {
        let a = work.annotations();
        let key = (
            work.namespace().unwrap_or_default(),
            a.get(keys::HUB_APP_NAMESPACE).cloned().unwrap_or_default(),
            a.get(keys::HUB_APP_NAME).cloned().unwrap_or_default(),
        );
        let Some(our) = ours_by_app.get(&key) else {
            continue;
        };
        if !is_adoptable(&work, *our) {
            continue;
        }
        let api: Api<ManifestWork> = Api::namespaced(client.clone(), &key.0);
        let orphan =
            serde_json::json!({ "spec": { "deleteOption": { "propagationPolicy": "Orphan" } } });
        match api
            .patch(
                &work.name_any(),
                &PatchParams::default(),
                &Patch::Merge(orphan),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => return Err(e),
        }
        match api.delete(&work.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        adopted += 1;
        metrics.works_adopted.inc();
        tracing::info!(cluster = %key.0, legacy = %work.name_any(), work = %our.name_any(),
            namespace = %key.1, name = %key.2, "adopted the Application from an argocd-pull-integration ManifestWork; orphan-deleted the old work");
    }
    Ok(adopted)
}

/// The Applications with the pull label, by namespace and name: their
/// metadata only (all that decides whether a work is an orphan), read a page
/// at a time, so that a sweep never holds a second copy of a large fleet's
/// Applications with their status (35 MiB for 3,000 in a heap profile).
async fn pulled_apps(
    client: &Client,
) -> Result<HashMap<(String, String), Application>, kube::Error> {
    let api: Api<Application> = Api::all_with(client.clone(), &application_resource());
    let mut params = ListParams::default().labels(keys::PULL_LABEL).limit(200);
    let mut apps = HashMap::new();
    loop {
        let page = api.list_metadata(&params).await?;
        for mut meta in page.items {
            meta.metadata.managed_fields = None;
            let app = Application {
                types: meta.types,
                metadata: meta.metadata,
                data: serde_json::Value::Null,
            };
            apps.insert((app.namespace().unwrap_or_default(), app.name_any()), app);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(apps),
        }
    }
}

type WorkMeta = PartialObjectMeta<ManifestWork>;

/// argocd-pull's ManifestWorks: their metadata only (all that decides
/// whether one is an orphan), a page at a time. Listed whole, 5,000 works
/// with the Applications they deliver took some 250 MiB for the moment of
/// each sweep, the hub-controller's peak memory.
async fn our_works(client: &Client) -> Result<Vec<WorkMeta>, kube::Error> {
    let api: Api<ManifestWork> = Api::all(client.clone());
    let mut params = ListParams::default()
        .labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"))
        .limit(500);
    let mut works = Vec::new();
    loop {
        let page = api.list_metadata(&params).await?;
        works.extend(page.items.into_iter().map(|mut w| {
            w.metadata.managed_fields = None;
            w
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(works),
        }
    }
}

/// One pass; returns how many works were deleted. The works are listed
/// first, then the labelled Applications (in that order, so an Application
/// created in between is still seen).
pub async fn sweep_once(client: &Client, metrics: &Metrics) -> Result<usize, kube::Error> {
    let works = our_works(client).await?;
    metrics.works_managed.set(works.len() as i64);
    let apps = pulled_apps(client).await?;
    let mut deleted = 0;
    let delivering: Vec<WorkMeta> = works
        .iter()
        .filter(|w| {
            let a = w.annotations();
            match (a.get(keys::HUB_APP_NAMESPACE), a.get(keys::HUB_APP_NAME)) {
                (Some(ns), Some(name)) => !is_orphan(*w, apps.get(&(ns.clone(), name.clone()))),
                _ => false,
            }
        })
        .cloned()
        .collect();
    if let Err(e) = adopt_legacy(client, &delivering, metrics).await {
        tracing::warn!(error = %e, "could not adopt argocd-pull-integration ManifestWorks; will retry");
    }
    for work in works {
        let a = work.annotations();
        let (Some(ns), Some(name)) = (a.get(keys::HUB_APP_NAMESPACE), a.get(keys::HUB_APP_NAME))
        else {
            continue;
        };
        if !is_orphan(&work, apps.get(&(ns.clone(), name.clone()))) {
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
        tracing::info!(cluster = %wns, work = %work.name_any(), namespace = %ns, name = %name, "deleted orphaned ManifestWork");
    }
    Ok(deleted)
}

/// Sweeps every `interval` until `shutdown` resolves.
pub async fn run(
    client: Client,
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
                if let Err(e) = sweep_once(&client, &metrics).await {
                    tracing::warn!(error = %e, "sweep of orphaned ManifestWorks failed; will retry");
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
