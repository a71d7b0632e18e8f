//! The ManifestWork transport's controller: the kube-runtime controller
//! that runs [`super::application::reconcile`] for every Application the
//! hub's watches trigger (see [`super::triggers`]) or that moves to or from
//! the gRPC transport, and its error policy.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::application::reconcile;
use super::{Context, Error};
use crate::watch::cached::CachedApp;

/// How long in-flight reconciles get to finish once shutdown begins.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the controller of one term until `shutdown` resolves, reconciling
/// the Applications that come on `triggered` (from
/// [`super::triggers::Gate::open`]). `ready` is called once the hub's
/// caches have their first full list. The caches are fed by
/// [`crate::watch::watches::Watches::run`], with the gate among its
/// consumers.
pub async fn run(
    ctx: Arc<Context>,
    triggered: tokio::sync::mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<CachedApp>>,
    ready: impl FnOnce() + Send + 'static,
    shutdown: argocd_pull_runtime::shutdown::Shutdown,
) {
    let app_store = ctx.caches.apps.clone();
    let queue = ctx.queue.clone();

    // Every trigger comes by reference from the hub's watches; the
    // controller reads the Applications from the shared cache.
    let controller = Controller::for_stream_with(
        futures::stream::pending::<Result<CachedApp, watcher::Error>>(),
        app_store.clone(),
        (),
    )
    .with_config(
        kube::runtime::controller::Config::default().concurrency(ctx.options.workers as u16),
    )
    .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
        triggered,
    ));
    let caches = ctx.caches.clone();
    tokio::spawn(async move {
        caches.wait_synced().await;
        ready();
    });
    let (q, store, writer) = (queue.clone(), app_store, ctx.writer.clone());
    let mirrors = ctx.caches.mirrors.clone();
    let c = ctx.clone();
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
                        let r = ObjectRef::new(name).within(ns);
                        store.get(&r).is_some()
                            || mirrors.get(&r).is_some()
                    });
                    // Works waiting to be applied that are gone.
                    c.unapplied.lock().expect("lock").retain(|(cluster, name), _| {
                        c.caches.works.get(&ObjectRef::new(name).within(cluster)).is_some()
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
    if !shutdown.bounded(running, SHUTDOWN_GRACE).await {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "controller did not stop in time; stopping anyway");
    }
}

fn error_policy(app: Arc<CachedApp>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.queue
        .triggered(ObjectRef::from_obj(app.as_ref()), "error-retry");
    tracing::warn!(namespace = %app.namespace().unwrap_or_default(), name = %app.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
