//! The hub API server's own write ceiling, measured in the same run: with no
//! controller running, how many Application status writes per second it
//! takes from `concurrency` writers. A controller's status write rate is
//! printed as a fraction of it, so a figure says how close to the hardware
//! a controller gets, on this machine, at this moment.
//!
//! It is measured twice: bare, and again with two watches of the written
//! Applications open. During a run every write is also sent to the
//! controller's watch and to the benchmark's, and decoded by both on the
//! same two cores; the second figure says what that costs, so that a
//! controller's share of the bare ceiling can be read against it.

use std::time::Instant;

use anyhow::Result;
use argocd_pull_apis::argocd::application_resource;
use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testenv::Cluster;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The sync's start in the statuses written, as a controller would write it.
const STARTED_AT: &str = "2026-01-01T00:00:00Z";

/// Watches open in the second measurement: the controller's and the
/// benchmark's.
pub const WATCHES: usize = 2;

/// Status writes per second, bare and with [`WATCHES`] watches open.
#[derive(Clone, Copy, Debug)]
pub struct Ceiling {
    pub bare: f64,
    pub watched: f64,
}

/// Creates `n` Applications (no pull label, so nothing would deliver them),
/// then writes a status onto each, as a controller does (merge patch of the
/// whole object: the Application CRD has no status subresource), and again
/// a newer one with two watches of them open; returns both rates. Removes
/// them afterwards.
pub async fn measure(
    hub: &Cluster,
    client: &kube::Client,
    n: usize,
    concurrency: usize,
    run: usize,
) -> Result<Ceiling> {
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

    let bare = write_statuses(&api, n, concurrency, 1).await?;
    let watching = open_watches(&api, WATCHES).await;
    let watched = write_statuses(&api, n, concurrency, 2).await?;
    for w in watching {
        w.abort();
    }

    let dp = DeleteParams::background();
    api.delete_collection(&dp, &ListParams::default()).await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces.delete(&ns, &dp).await?;
    Ok(Ceiling { bare, watched })
}

/// Writes a status onto each of the `n` Applications, its revision (a
/// commit hash's 40 hex digits) telling `pass` from the others; returns
/// the writes per second.
async fn write_statuses(
    api: &Api<DynamicObject>,
    n: usize,
    concurrency: usize,
    pass: u32,
) -> Result<f64> {
    let revision = &format!("{pass:040x}");
    let pp = PatchParams::default();
    let t0 = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let (api, pp) = (api.clone(), &pp);
            async move {
                let status = json!({ "status": {
                    "health": { "status": "Healthy" },
                    "sync": { "status": "Synced", "revision": revision },
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
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// Opens `count` watches of the Applications `api` reaches, each decoding
/// every event; returns once each has had its first full list.
async fn open_watches(api: &Api<DynamicObject>, count: usize) -> Vec<JoinHandle<()>> {
    let (listed, mut ready) = mpsc::channel(count);
    let tasks = (0..count)
        .map(|_| {
            let (api, listed) = (api.clone(), listed.clone());
            tokio::spawn(async move {
                let mut events = watcher::watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(event) = events.next().await {
                    if let Ok(watcher::Event::InitDone) = event {
                        let _ = listed.send(()).await;
                    }
                }
            })
        })
        .collect();
    for _ in 0..count {
        ready.recv().await;
    }
    tasks
}
