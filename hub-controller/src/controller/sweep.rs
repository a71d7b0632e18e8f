//! Periodic removal of ManifestWorks whose hub Application is gone, or no
//! longer targets that cluster. Applications created by an ApplicationSet
//! with `preserveResourcesOnDeletion` have no finalizer, so their deletion
//! is never seen by the reconciler; this is how their works go.

use std::collections::HashMap;
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};

use crate::delivery::target::{is_pulled, target};
use crate::delivery::work::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::metrics::Metrics;

/// Whether a work should go, given its hub Application (if it still exists).
pub fn is_orphan(work: &ManifestWork, app: Option<&Application>) -> bool {
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

/// One pass; returns how many works were deleted. Two LIST calls whatever
/// the fleet size: the works first, then the labelled Applications (in that
/// order, so an Application created in between is still seen).
pub async fn sweep_once(client: &Client, metrics: &Metrics) -> Result<usize, kube::Error> {
    let works: Api<ManifestWork> = Api::all(client.clone());
    let list = works
        .list(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")))
        .await?;
    metrics.works_managed.set(list.items.len() as i64);
    // An Application without the pull label would be an orphan's owner
    // anyway, so only labelled ones need to be known.
    let apps: Api<Application> = Api::all_with(client.clone(), &application_resource());
    let apps: HashMap<(String, String), Application> = apps
        .list(&ListParams::default().labels(keys::PULL_LABEL))
        .await?
        .items
        .into_iter()
        .map(|a| ((a.namespace().unwrap_or_default(), a.name_any()), a))
        .collect();
    let mut deleted = 0;
    for work in list.items {
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
}
