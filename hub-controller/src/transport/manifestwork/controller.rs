//! The ManifestWork transport's controller: the watches that trigger a
//! reconcile (Applications, argocd-pull's ManifestWorks, ManagedClusters,
//! PlacementDecisions, transport switches), the kube-runtime controller
//! that runs [`super::application::reconcile`], and its error policy.

use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork, placement_decision_resource};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, reflector};
use kube::runtime::{WatchStreamExt, predicates, watcher};

use super::application::reconcile;
use super::{Context, Error};
use crate::hub::cached::CachedApp;
use crate::hub::caches::{self};
use crate::render::work::{MANAGED_BY, MANAGED_BY_LABEL};

/// How long in-flight reconciles get to finish once shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the controller until `shutdown` resolves. `ready` is called once the
/// Application cache has its first full list, so that `/readyz` only passes
/// when the controller sees every Application.
pub async fn run(
    ctx: Arc<Context>,
    ready: impl FnOnce() + Send + 'static,
    shutdown: argocd_pull_runtime::shutdown::Shutdown,
) {
    let Some(writers) = ctx.take_writers() else {
        tracing::error!("the Application controller of this context is already running");
        return;
    };
    let ar = application_resource();
    let client = ctx.client.clone();
    let app_store = writers.apps.as_reader();
    let queue = ctx.queue.clone();

    // Applications with the pull label: the primary trigger.
    let q = queue.clone();
    let apps = reflector(
        writers.apps,
        watcher::watcher(
            Api::<CachedApp>::all_with(client.clone(), &ar),
            watcher::Config::default().labels(keys::PULL_LABEL),
        )
        .default_backoff(),
    )
    .inspect(move |event| {
        if let Ok(watcher::Event::Apply(a) | watcher::Event::InitApply(a)) = event {
            q.triggered(
                ObjectRef::from_obj_with(a, application_resource()),
                "application",
            );
        }
    })
    .applied_objects();

    // argocd-pull's works: feedback and deletions re-reconcile their owner.
    let works = reflector(
        writers.works,
        watcher::watcher(
            Api::<ManifestWork>::all(client.clone()),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
        )
        .default_backoff()
        .modify(drop_managed_fields),
    )
    .touched_objects();
    let (q, store) = (queue.clone(), app_store.clone());
    let work_owner = move |work: ManifestWork| {
        let owner = caches::work_owner(&work).filter(|o| store.get(o).is_some());
        if let Some(o) = &owner {
            q.triggered(o.clone(), "work");
        }
        owner
    };

    // A cluster joining delivers the Applications that were waiting for it.
    let clusters = reflector(
        writers.clusters,
        watcher::watcher(
            Api::<PartialObjectMeta<ManagedCluster>>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    )
    .applied_objects()
    .predicate_filter(predicates::generation, Default::default());
    let (q, store) = (queue.clone(), app_store.clone());
    let cluster_apps = move |mc: PartialObjectMeta<ManagedCluster>| {
        let refs = caches::apps_targeting(&store, &mc.name_any());
        refs.iter().for_each(|r| q.triggered(r.clone(), "cluster"));
        refs
    };

    // A Placement's decisions changing re-checks its namespace's Applications.
    let pdr = placement_decision_resource();
    let decisions = reflector(
        writers.decisions,
        watcher::watcher(
            Api::<DynamicObject>::all_with(client.clone(), &pdr),
            watcher::Config::default(),
        )
        .default_backoff(),
    )
    .touched_objects();
    let (q, store) = (queue.clone(), app_store.clone());
    let namespace_apps = move |pd: DynamicObject| {
        let refs = caches::apps_in(&store, &pd.namespace().unwrap_or_default());
        refs.iter()
            .for_each(|r| q.triggered(r.clone(), "placement"));
        refs
    };

    let mut controller = Controller::for_stream_with(apps, app_store.clone(), ar.clone())
        .watches_stream(works, work_owner)
        .watches_stream(clusters, cluster_apps)
        .watches_stream_with(decisions, namespace_apps, pdr);
    // Applications moving to or from the gRPC transport: deliver by work, or
    // hand the work over.
    if let Some(switches) = ctx.grpc.as_ref().and_then(|g| g.transport_switches()) {
        let q = queue.clone();
        let switched =
            tokio_stream::wrappers::UnboundedReceiverStream::new(switches).map(move |r| {
                let r = ObjectRef::new_with(&r.name, application_resource()).within(&r.namespace);
                q.triggered(r.clone(), "transport-switch");
                r
            });
        controller = controller.reconcile_on(switched);
    }

    let caches_ready = {
        let c = ctx.caches.clone();
        let synced = ctx.caches.synced.clone();
        let apps = app_store.clone();
        async move {
            let _ = apps.wait_until_ready().await;
            let _ = c.works.wait_until_ready().await;
            let _ = c.clusters.wait_until_ready().await;
            let _ = c.decisions.wait_until_ready().await;
            synced.send_replace(true);
        }
    };
    tokio::spawn(async move {
        // The stores' readiness is a oneshot that wakes only its last poller
        // (the controller's runner), so ask again now and then.
        tokio::pin!(caches_ready);
        loop {
            tokio::select! {
                _ = &mut caches_ready => return ready(),
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    });
    let (q, store, writer) = (queue.clone(), app_store, ctx.writer.clone());
    let grpc = ctx.grpc.clone();
    let down = shutdown.clone().wait();
    tokio::spawn(async move {
        tokio::pin!(down);
        loop {
            tokio::select! {
                _ = &mut down => return,
                _ = tokio::time::sleep(Duration::from_secs(10)) => {
                    q.prune(&store);
                    // Writes whose echo will never come: the Application is gone.
                    writer.written().retain(|ns, name| {
                        let r = ObjectRef::new_with(name, application_resource()).within(ns);
                        store.get(&r).is_some()
                            || grpc.as_ref().is_some_and(|g| g.mirrors.get(&r).is_some())
                    });
                }
            }
        }
    });

    let running = controller
        .graceful_shutdown_on(shutdown.clone().wait())
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile failed");
            }
        });
    // kube-runtime's graceful shutdown waits for the first list of the cache;
    // a shutdown that comes before it must not hang the process.
    tokio::select! {
        _ = running => {}
        _ = async { shutdown.wait().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "controller did not stop in time; stopping anyway");
        }
    }
}

/// The caches never read managedFields, which are often the largest part of
/// an object; dropping them keeps memory per Application down.
fn drop_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

fn error_policy(app: Arc<CachedApp>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.queue.triggered(
        ObjectRef::from_obj_with(app.as_ref(), application_resource()),
        "error-retry",
    );
    tracing::warn!(namespace = %app.namespace().unwrap_or_default(), name = %app.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
