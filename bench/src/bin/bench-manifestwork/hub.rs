//! The benchmark's side of the hub: the Applications and namespaces it
//! creates, the watches through which it sees what a controller wrote, and
//! the OCM work agent it plays.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork, Placement, placement_decision_resource};
use argocd_pull_bench::work_agent::SeenWork;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::Cluster;
use tokio::sync::Notify;

use crate::controller::Controller;
use crate::run::{REVISION, REVISION_2, RUN_LABEL};

/// What OCM registration leaves on the hub for each joined cluster: the
/// ManagedCluster and its namespace.
pub async fn setup_clusters(hub: &Cluster, client: &kube::Client, n: usize) -> Result<Vec<String>> {
    let names: Vec<String> = (1..=n).map(|i| format!("cluster{i:03}")).collect();
    let api: Api<ManagedCluster> = Api::all(client.clone());
    for name in &names {
        hub.ensure_namespace(name).await?;
        let mc: ManagedCluster = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": { "name": name },
            "spec": { "hubAcceptsClient": true,
                      "managedClusterClientConfigs": [{ "url": format!("https://{name}.example:6443") }] }
        }))?;
        api.create(&PostParams::default(), &mc).await?;
    }
    Ok(names)
}

/// A team namespace whose Placement selects every cluster: what OCM's
/// placement controller leaves (PlacementDecisions of at most 100 clusters).
pub async fn team_namespace(
    hub: &Cluster,
    client: &kube::Client,
    name: &str,
    clusters: &[String],
) -> Result<()> {
    hub.ensure_namespace(name).await?;
    // The hub-controller counts only decisions a Placement controls.
    let placement: Placement = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
        "metadata": { "name": "bench", "namespace": name }, "spec": {}
    }))?;
    let placement = Api::<Placement>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &placement)
        .await?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), name, &placement_decision_resource());
    for (i, chunk) in clusters.chunks(100).enumerate() {
        let pd_name = format!("bench-decision-{}", i + 1);
        let pd: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
            "metadata": { "name": pd_name, "namespace": name,
                          "labels": { keys::PLACEMENT_LABEL: "bench" },
                          "ownerReferences": [{
                              "apiVersion": "cluster.open-cluster-management.io/v1beta1",
                              "kind": "Placement", "name": "bench",
                              "uid": placement.metadata.uid, "controller": true,
                              "blockOwnerDeletion": true }] }
        }))?;
        api.create(&PostParams::default(), &pd).await?;
        let decisions: Vec<Value> = chunk
            .iter()
            .map(|c| json!({ "clusterName": c, "reason": "" }))
            .collect();
        api.patch_status(
            &pd_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "decisions": decisions } })),
        )
        .await?;
    }
    Ok(())
}

pub fn application(name: &str, ns: &str, cluster: &str, run: usize) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": ns,
            "labels": { keys::PULL_LABEL: "true", RUN_LABEL: run.to_string() },
            "annotations": { keys::MANAGED_CLUSTER: cluster, keys::SKIP_RECONCILE: "true" } },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://git.example/fleet.git", "path": "guestbook", "targetRevision": "HEAD" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" },
            "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
        }
    }))?)
}

/// Shared between the watch tasks and the run.
#[derive(Default)]
pub struct Progress {
    /// Hub Application (namespace/name) -> its work.
    pub works: Mutex<HashMap<String, SeenWork>>,
    /// Hub Applications that show the fed-back status.
    pub converged: Mutex<HashSet<String>>,
    /// Hub Applications that show the second feedback (the catch-up phase,
    /// [`REVISION_2`]).
    pub caught_up: Mutex<HashSet<String>>,
    /// The Application events of the catch-up phase (set once the phase
    /// starts; `None` before).
    pub catch_up_events: Mutex<Option<CatchUp>>,
    /// Watch events (one per write) on the run's works and Applications.
    pub work_events: AtomicUsize,
    pub app_events: AtomicUsize,
    pub changed: Notify,
}

/// Application events counted in the catch-up phase: how many, and when
/// the first and the latest came.
pub type CatchUp = (usize, Option<Instant>, Option<Instant>);

/// Waits until `done` holds (true) or the deadline passes (false); fails if
/// the controller exits meanwhile.
pub async fn wait_for(
    progress: &Progress,
    deadline: Instant,
    controller: &mut Controller,
    done: impl Fn(&Progress) -> bool,
) -> Result<bool> {
    loop {
        // Register before checking, so a change in between is not missed.
        let changed = progress.changed.notified();
        if done(progress) {
            return Ok(true);
        }
        if let Some(status) = controller.exited() {
            bail!(
                "the {} controller exited ({status}) during the run; see {}",
                controller.which.label(),
                controller.log.display()
            );
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let _ =
            tokio::time::timeout((deadline - now).min(Duration::from_millis(250)), changed).await;
    }
}

/// Records every ManifestWork that points back at a hub Application in one of
/// `team` namespaces: whatever its name, whoever wrote it. A metadata-only
/// watch keeps the benchmark's own load on the API server low; the delivered
/// Application has the hub copy's namespace and name (the benchmark sets no
/// `ocm-managed-cluster-app-namespace`), which is what the feedback matches.
pub async fn watch_works(client: kube::Client, team: HashSet<String>, progress: Arc<Progress>) {
    let api: Api<PartialObjectMeta<ManifestWork>> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(next) = events.next().await {
        let Ok(work) = next else { continue };
        let annotations = work.annotations();
        let (Some(app_ns), Some(app_name)) = (
            annotations.get(keys::HUB_APP_NAMESPACE),
            annotations.get(keys::HUB_APP_NAME),
        ) else {
            continue;
        };
        if !team.contains(app_ns) || work.metadata.deletion_timestamp.is_some() {
            continue;
        }
        progress.work_events.fetch_add(1, Ordering::Relaxed);
        let seen = SeenWork {
            namespace: work.namespace().unwrap_or_default(),
            name: work.name_any(),
            app_namespace: app_ns.clone(),
            app_name: app_name.clone(),
        };
        let key = format!("{app_ns}/{app_name}");
        let new = progress.works.lock().unwrap().insert(key, seen).is_none();
        if new {
            progress.changed.notify_waiters();
        }
    }
}

/// Records every Application of run `run` whose status shows the feedback.
pub async fn watch_apps(client: kube::Client, run: usize, progress: Arc<Progress>) {
    let api: Api<DynamicObject> = Api::all_with(client, &application_resource());
    let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
    let mut events = watcher::watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(next) = events.next().await {
        let Ok(app) = next else { continue };
        progress.app_events.fetch_add(1, Ordering::Relaxed);
        let status = app.data.get("status");
        let at = |p: &str| status.and_then(|s| s.pointer(p)).and_then(Value::as_str);
        let shows = at("/health/status") == Some("Healthy")
            && at("/sync/status") == Some("Synced")
            && at("/sync/revision") == Some(REVISION);
        let key = format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any());
        if let Some((events, first, last)) = progress.catch_up_events.lock().unwrap().as_mut() {
            *events += 1;
            first.get_or_insert_with(Instant::now);
            *last = Some(Instant::now());
        }
        if at("/health/status") == Some("Healthy")
            && at("/sync/status") == Some("Synced")
            && at("/sync/revision") == Some(REVISION_2)
            && progress.caught_up.lock().unwrap().insert(key.clone())
        {
            progress.changed.notify_waiters();
        }
        let mut converged = progress.converged.lock().unwrap();
        let changed = if shows {
            converged.insert(key)
        } else {
            // Upstream passes through Progressing on its way to Healthy.
            converged.remove(&key)
        };
        drop(converged);
        if changed {
            progress.changed.notify_waiters();
        }
    }
}
