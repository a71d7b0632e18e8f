//! Reconciles one pull-model hub Application: delivers it in a ManifestWork,
//! writes the fed-back status onto it, and on deletion removes the work
//! before releasing Argo CD's finalizers.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::handover::{hand_over_to_grpc, orphan_work, other_owner};
use super::{Context, Error, WORK_MANAGER};
use crate::render::delivered_copy;
use crate::render::operation::{self, carried_operation};
use crate::render::work::{
    applied_on_spoke, is_applied, manifest_work, reported_applied, work_name,
};
use crate::route::HubRef;
use crate::route::decide::{Facts, Route, decide};
use crate::route::target::{Target, target};
use crate::route::transport::Transport;
use crate::status::Reason;
use crate::status::condition::{
    OWNED, condition_of, owned_status, set_condition, shows_any_of_ours,
};
use crate::status::feedback::{feedback, not_applied, spoke_problem, status_update};
use crate::status::writer::{COMMAND_MANAGER, holds_argocd_finalizer};
use crate::watch::cached::CachedApp;
use crate::watch::caches::Lookup;

pub async fn reconcile(app: Arc<CachedApp>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(app.as_ref());
    let trigger = ctx.queue.started(&key);
    ctx.metrics.reconciles.inc();
    ctx.metrics
        .triggers
        .get_or_create(&crate::metrics::TriggerLabels {
            transport: "manifestwork",
            trigger,
        })
        .inc();
    let started = std::time::Instant::now();
    // Every Application is reconciled when the controller starts, and all
    // of them wait here for the caches: parse each only once it can go
    // ahead, and keep the (large) state of the reconcile off the waiting
    // task (with 10,000 Applications the waiting parsed copies took 200 MiB
    // and the waiting tasks 75 MiB).
    ctx.caches.wait_synced().await;
    if let Some(hub) = &ctx.grpc {
        hub.wait_synced().await;
    }
    let result = if ctx.held_by_grpc(&HubRef::of(app.as_ref())) {
        // Decided by the gRPC transport; a switch away from it comes back.
        Ok(Action::await_change())
    } else if ctx.writer.behind(app.identity()) {
        // The cache does not show our last write of this Application yet:
        // deciding now would repeat or undo it. Its echo comes back here.
        ctx.metrics.echo_waits.inc();
        Ok(Action::await_change())
    } else {
        Box::pin(reconcile_inner(&app.application(), &ctx)).await
    };
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    ctx.queue.finished();
    if result.is_err() {
        ctx.metrics.reconcile_errors.inc();
    }
    result
}

/// One pass over a hub Application: its route, then (delivered by
/// ManifestWork and owning its spoke key) its work, the commands it hands
/// over, and the status fed back. Each step that decides the pass is done
/// returns the [`Action`] ([`ControlFlow::Break`]).
async fn reconcile_inner(app: &Application, ctx: &Context) -> Result<Action, Error> {
    let route = decide(
        app,
        &Facts {
            grpc_served: ctx.grpc.is_some(),
            authorization: &ctx.authorization,
            world: &ctx.caches,
        },
    );
    if app.metadata.deletion_timestamp.is_some() {
        return reconcile_deleting(app, route, ctx).await;
    }
    let target = match delivered_here(app, route, ctx).await? {
        ControlFlow::Continue(t) => t,
        ControlFlow::Break(action) => return Ok(action),
    };
    let (applied, work_name) = match deliver(app, &target, ctx).await? {
        ControlFlow::Continue(w) => w,
        ControlFlow::Break(action) => return Ok(action),
    };
    // One write to the Application per pass: after it, the echo of the
    // write brings the Application back here and the rest is decided from
    // the cache showing it (never from an older copy).
    if let Some(action) = hand_over_commands(app, &target, &applied, ctx).await? {
        return Ok(action);
    }
    write_feedback(app, &target, &work_name, &applied, ctx).await
}

/// A hub Application being deleted: the gRPC side deletes what it
/// delivered; a work of one refused for another's spoke key is orphaned
/// first, so that the owner's copy stays; then the work goes and the
/// finalizers are released ([`finalize`]).
async fn reconcile_deleting(
    app: &Application,
    route: Route,
    ctx: &Context,
) -> Result<Action, Error> {
    match route {
        // The gRPC side deletes it on the spoke and releases it.
        Route::Deliver {
            transport: Transport::Grpc,
            target,
        } => hand_over_to_grpc(app, &target, ctx).await,
        // Another Application owns the spoke copy: a work of this one
        // (from before the owner came) must not take it along.
        Route::Deliver { target, .. } if other_owner(app, &target, ctx).is_some() => {
            orphan_work(app, &target, ctx, "refused").await?;
            finalize(app, ctx).await
        }
        _ => finalize(app, ctx).await,
    }
}

/// Where `app` goes when this transport delivers it and it owns its spoke
/// key; otherwise the pass ends here: not pulled, the gRPC transport's
/// (a work left from before is handed over), or refused (a condition and
/// an Event say why).
async fn delivered_here(
    app: &Application,
    route: Route,
    ctx: &Context,
) -> Result<ControlFlow<Action, Target>, Error> {
    let target = match route {
        Route::NotPulled => return Ok(ControlFlow::Break(Action::await_change())),
        Route::Deliver {
            transport: Transport::ManifestWork,
            target,
        } => target,
        // The gRPC transport delivers it or says why not; a work left from
        // before is handed over.
        Route::Deliver { target, .. }
        | Route::Refused {
            by: Transport::Grpc,
            target: Some(target),
            ..
        } => {
            return hand_over_to_grpc(app, &target, ctx)
                .await
                .map(ControlFlow::Break);
        }
        Route::Refused {
            reason, message, ..
        } => {
            // A cluster joining or a PlacementDecision changing triggers a
            // reconcile (see `super::triggers`).
            refuse(app, ctx, reason, &message).await?;
            return Ok(ControlFlow::Break(Action::await_change()));
        }
    };
    if let Some(owner) = other_owner(app, &target, ctx) {
        let msg = format!(
            "Application {}/{} on cluster {} is already delivered for {owner}, which keeps it: rename this Application or change its {} annotation",
            target.app_namespace,
            app.name_any(),
            target.cluster,
            keys::MANAGED_CLUSTER_APP_NAMESPACE
        );
        refuse(app, ctx, Reason::SpokeConflict, &msg).await?;
        // A work of this Application from before is removed, leaving the
        // spoke copy to its owner.
        orphan_work(app, &target, ctx, "refused").await?;
        return Ok(ControlFlow::Break(Action::await_change()));
    }
    Ok(ControlFlow::Continue(target))
}

/// Writes `app`'s ManifestWork on `target`'s cluster unless the one there
/// already carries it; returns the work as applied and its name. The pass
/// ends here when the work is too large, when a work of the same name
/// belongs to another Application or is still being deleted, or when the
/// cache still shows an Application just deleted.
async fn deliver(
    app: &Application,
    target: &Target,
    ctx: &Context,
) -> Result<ControlFlow<Action, (ManifestWork, String)>, Error> {
    let (ns, name) = (app.namespace().unwrap_or_default(), app.name_any());
    let mut work = match manifest_work(app, target, delivered_copy(app, target), &ctx.options) {
        Ok(w) => w,
        Err(e) => {
            refuse(app, ctx, Reason::TooLarge, &e.to_string()).await?;
            return Ok(ControlFlow::Break(Action::await_change()));
        }
    };
    let work_name = work.name_any();
    let works: Api<ManifestWork> = Api::namespaced(ctx.client.clone(), &target.cluster);
    let existing = match ctx.caches.work(&target.cluster, &work_name) {
        Lookup::Known(w) => w.map(|w| *w),
        Lookup::Stale => works.get_opt(&work_name).await?,
    };
    if let Some(existing) = &existing {
        if existing.metadata.deletion_timestamp.is_some() {
            // The work of a deleted Application of the same name is still
            // being removed from the spoke; deliver once it is gone.
            ctx.trigger_later(app, "requeue-deleting");
            return Ok(ControlFlow::Break(Action::requeue(Duration::from_secs(2))));
        }
        let a = existing.annotations();
        if a.get(keys::HUB_APP_NAMESPACE) != Some(&ns) || a.get(keys::HUB_APP_NAME) != Some(&name) {
            let msg = format!(
                "ManifestWork {}/{work_name} already exists for another Application; rename this Application",
                target.cluster
            );
            refuse(app, ctx, Reason::WorkConflict, &msg).await?;
            return Ok(ControlFlow::Break(Action::await_change()));
        }
    } else {
        // About to create a work: make sure the Application is really still
        // there, not a stale cache entry of one just deleted (the sweep would
        // have removed its work, and we would bring it back).
        let apps: Api<Application> =
            Api::namespaced_with(ctx.client.clone(), &ns, &application_resource());
        let fresh = apps.get_opt(&name).await?;
        if fresh.is_none_or(|f| f.metadata.uid != app.metadata.uid) {
            return Ok(ControlFlow::Break(Action::await_change()));
        }
    }
    let spoke_started = existing
        .as_ref()
        .and_then(|w| feedback(w, &target.app_namespace, &name))
        .and_then(|f| f.started_at);
    let carried = carried_operation(
        app.data.get("operation"),
        existing.as_ref(),
        spoke_started.as_deref(),
    );
    operation::apply_to(&mut work, carried);
    let applied = match existing.filter(|e| is_applied(&work, e)) {
        Some(unchanged) => unchanged,
        None => {
            let applied = works
                .patch(
                    &work_name,
                    &PatchParams::apply(WORK_MANAGER).force(),
                    &Patch::Apply(&work),
                )
                .await?;
            ctx.caches.written.record(&applied.metadata);
            tracing::debug!(namespace = %ns, name = %name, cluster = %target.cluster, work = %work_name, "delivered");
            applied
        }
    };
    Ok(ControlFlow::Continue((applied, work_name)))
}

/// Takes off the hub copy a sync or refresh the work has handed over to
/// the spoke, so that it is not run again: the pass's one write, when there
/// is one to make.
async fn hand_over_commands(
    app: &Application,
    target: &Target,
    applied: &ManifestWork,
    ctx: &Context,
) -> Result<Option<Action>, Error> {
    let (ns, name) = (app.namespace().unwrap_or_default(), app.name_any());
    if app.data.get("operation").is_some_and(|o| !o.is_null()) {
        // Handed over to the spoke in the work; the hub copy must not run it
        // again. A merge patch removes only .operation.
        if ctx
            .writer
            .patch(app, COMMAND_MANAGER, &json!({ "operation": null }))
            .await?
            .is_some()
        {
            tracing::info!(namespace = %ns, name = %name, cluster = %target.cluster, "sync operation handed over to the spoke");
        }
        return Ok(Some(Action::await_change()));
    }
    if app.annotations().contains_key(keys::REFRESH) && applied_on_spoke(applied) {
        // The work agent has put the refresh on the spoke's copy, where Argo
        // CD takes it off once done. Take it off the hub copy too, or every
        // later apply of the work would ask for another refresh.
        let patch = json!({ "metadata": {
            "resourceVersion": app.resource_version(),
            "annotations": { keys::REFRESH: null },
        }});
        // None: changed meanwhile, decided again from its next version.
        if ctx
            .writer
            .patch(app, COMMAND_MANAGER, &patch)
            .await?
            .is_some()
        {
            tracing::info!(namespace = %ns, name = %name, cluster = %target.cluster, "refresh handed over to the spoke");
        }
        return Ok(Some(Action::await_change()));
    }
    Ok(None)
}

/// Writes what the work agent fed back onto the hub copy, with the
/// condition for a problem on the spoke or an apply overdue; looked at
/// again when the apply would become overdue.
async fn write_feedback(
    app: &Application,
    target: &Target,
    work_name: &str,
    applied: &ManifestWork,
    ctx: &Context,
) -> Result<Action, Error> {
    let name = app.name_any();
    let mut status = feedback(applied, &target.app_namespace, &name)
        .map(|fb| status_update(&fb))
        .unwrap_or_else(|| json!({}));
    let waited = unapplied_for(ctx, &target.cluster, work_name, applied);
    let overdue = waited.filter(|w| *w >= ctx.options.apply_timeout);
    let problem = spoke_problem(applied, &target.app_namespace, &name)
        .or_else(|| overdue.map(|w| not_applied(&target.cluster, work_name, w)));
    set_condition(
        &mut status,
        problem
            .as_ref()
            .map(|p| format!("{}: {}", p.reason, p.message)),
    );
    write_status(app, ctx, status).await?;
    match waited {
        // Looked at again when the apply is overdue, unless the work
        // agent's report comes first.
        // (Not counted in the queue's depth while it waits: its reconcile
        // counts as a `requeue` trigger.)
        Some(w) if w < ctx.options.apply_timeout => {
            Ok(Action::requeue(ctx.options.apply_timeout - w))
        }
        _ => Ok(Action::await_change()),
    }
}

/// How long the work agent has left the work's current version unapplied,
/// as far as this process has seen; `None` once it reports it applied.
fn unapplied_for(
    ctx: &Context,
    cluster: &str,
    name: &str,
    work: &ManifestWork,
) -> Option<Duration> {
    let mut unapplied = ctx.unapplied.lock().expect("lock");
    let key = (cluster.to_string(), name.to_string());
    if reported_applied(work) {
        unapplied.remove(&key);
        return None;
    }
    Some(
        unapplied
            .entry(key)
            .or_insert_with(std::time::Instant::now)
            .elapsed(),
    )
}

/// Records why the Application is not delivered: a condition on it and,
/// when the reason is new, a Warning event, both saying what to fix.
async fn refuse(
    app: &Application,
    ctx: &Context,
    reason: Reason,
    message: &str,
) -> Result<(), Error> {
    let current = app.data.get("status").cloned().unwrap_or(Value::Null);
    let condition = format!("{reason}: {message}");
    // Keep whatever status the spoke reported last; add the condition.
    let mut status = owned_status(&current);
    set_condition(&mut status, Some(condition.clone()));
    write_status(app, ctx, status).await?;
    if condition_of(&current) != Some(condition.as_str()) {
        tracing::warn!(namespace = %app.namespace().unwrap_or_default(), name = %app.name_any(), %reason, message, "not delivered");
        ctx.metrics
            .refused
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: reason.as_str().into(),
            })
            .inc();
        ctx.writer
            .event(app, EventType::Warning, reason.as_str(), message)
            .await;
    }
    Ok(())
}

/// Writes `status` (argocd-pull's fields only) through the one writer.
async fn write_status(app: &Application, ctx: &Context, mut status: Value) -> Result<(), Error> {
    let current = app.data.get("status").unwrap_or(&Value::Null);
    if let Value::Object(map) = &mut status
        && map.is_empty()
    {
        if !shows_any_of_ours(current) {
            // Nothing to report and nothing of ours to take back: writing
            // would only cost a write and the reconcile its echo triggers.
            return Ok(());
        }
        // Applying an empty status would remove every field we own and
        // leave `status: null`, which the schema refuses; an empty condition
        // list says the same and is valid.
        map.insert("conditions".into(), json!([]));
    }
    ctx.writer.write_status(app, &status, Some(&OWNED)).await?;
    Ok(())
}

async fn finalize(app: &Application, ctx: &Context) -> Result<Action, Error> {
    if !holds_argocd_finalizer(app) {
        // Nothing of ours holds it; the sweep removes the work.
        return Ok(Action::await_change());
    }
    if let Ok(t) = target(app) {
        let works: Api<ManifestWork> = Api::namespaced(ctx.client.clone(), &t.cluster);
        let name = work_name(&app.namespace().unwrap_or_default(), &app.name_any());
        match works.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        ctx.caches.written.forget(&t.cluster, &name);
        if works.get_opt(&name).await?.is_some() {
            // The work agent is still deleting the spoke's copy.
            ctx.trigger_later(app, "requeue-deleting");
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
    }
    ctx.writer.release_finalizers(app).await?;
    Ok(Action::await_change())
}
