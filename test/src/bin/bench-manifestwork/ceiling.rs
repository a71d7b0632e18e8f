//! The hub API server's own write ceiling, measured in the same run: with no
//! controller running, how many Application status writes per second it
//! takes from `concurrency` writers. A controller's status write rate is
//! printed as a fraction of it, so a figure says how close to the hardware
//! a controller gets, on this machine, at this moment.

use std::time::Instant;

use anyhow::Result;
use argocd_pull_apis::argocd::application_resource;
use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::Cluster;

use crate::run::{REVISION, STARTED_AT};

/// Creates `n` Applications (no pull label, so nothing would deliver them),
/// then writes a status onto each, as a controller does (merge patch of the
/// whole object: the Application CRD has no status subresource); returns the
/// status writes per second. Removes them afterwards.
pub async fn measure(
    hub: &Cluster,
    client: &kube::Client,
    n: usize,
    concurrency: usize,
    run: usize,
) -> Result<f64> {
    let ns = format!("bench-r{run}-ceiling");
    hub.ensure_namespace(&ns).await?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &application_resource());
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let app: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": { "name": format!("ceiling-{i:05}") },
                    "spec": {
                        "project": "default",
                        "source": { "repoURL": "https://git.example/fleet.git", "path": "guestbook", "targetRevision": "HEAD" },
                        "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" }
                    }
                }))?;
                api.create(&PostParams::default(), &app).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;

    let pp = PatchParams::default();
    let t0 = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let (api, pp) = (api.clone(), &pp);
            async move {
                let status = json!({ "status": {
                    "health": { "status": "Healthy" },
                    "sync": { "status": "Synced", "revision": REVISION },
                    "operationState": { "phase": "Succeeded", "startedAt": STARTED_AT, "operation": {} }
                }});
                api.patch(&format!("ceiling-{i:05}"), pp, &Patch::Merge(status))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;
    let rate = n as f64 / t0.elapsed().as_secs_f64();

    let dp = DeleteParams::background();
    api.delete_collection(&dp, &ListParams::default()).await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces.delete(&ns, &dp).await?;
    Ok(rate)
}
