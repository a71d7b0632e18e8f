//! Periodic removal of ManifestWorks whose hub Application is gone, or no
//! longer targets that cluster. Applications created by an ApplicationSet
//! with `preserveResourcesOnDeletion` have no finalizer, so their deletion
//! is never seen by the reconciler; this is how their works go.

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

/// One pass; returns how many works were deleted.
pub async fn sweep_once(client: &Client, metrics: &Metrics) -> Result<usize, kube::Error> {
    let works: Api<ManifestWork> = Api::all(client.clone());
    let list = works
        .list(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")))
        .await?;
    metrics.works_managed.set(list.items.len() as i64);
    let mut deleted = 0;
    for work in list.items {
        let a = work.annotations();
        let (Some(ns), Some(name)) = (a.get(keys::HUB_APP_NAMESPACE), a.get(keys::HUB_APP_NAME))
        else {
            continue;
        };
        let apps: Api<Application> =
            Api::namespaced_with(client.clone(), ns, &application_resource());
        let app = apps.get_opt(name).await?;
        if is_orphan(&work, app.as_ref()) {
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
