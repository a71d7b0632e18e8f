//! Who keeps a spoke Application that more than one hub Application names
//! (the hold rule), and handing a ManifestWork over without touching the
//! spoke: a work is deleted only after its `deleteOption` orphans what it
//! applied.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::ocm::{ManifestWork, ManifestWorkDeleteOptionPropagationPolicy};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::{Context, Error};
use crate::render::work::work_name;
use crate::route::HubRef;
use crate::route::decide::Facts;
use crate::route::owner::{Seniority, owner_holding};
use crate::route::target::Target;
use crate::transport::grpc::assign::{Assignment, assign};
use crate::watch::caches::Lookup;
use argocd_pull_proto::v1::ObjectKey;

/// The gRPC transport delivers `app`: a ManifestWork left from before the
/// switch is deleted with `deleteOption: Orphan` first, so that the work
/// agent leaves the Application running on the spoke for the spoke-agent
/// to take over; nothing is ever deleted there by the switch.
pub(super) async fn hand_over_to_grpc(
    app: &Application,
    target: &Target,
    ctx: &Context,
) -> Result<Action, Error> {
    orphan_work(app, target, ctx, "handed over to the gRPC transport").await
}

/// The hub Application other than `app` that owns the spoke Application
/// `app` would be delivered as ([`crate::route::owner`]): among the hub
/// Applications that name it, those either transport would deliver; and
/// among those, one that already holds it keeps it
/// ([`owner_holding`]): its ManifestWork delivers it, or the cluster's
/// agent applied it for that one over gRPC (the hub's record of what each
/// agent holds, [`crate::transport::grpc::holders`]).
///
/// The hold rule is what stops a takeover: when the claim begins is the
/// tenant's choice (it sets the annotations), so an older hub Application
/// re-aimed at a key a younger one holds would otherwise own it, and its
/// work would be applied over the running spoke Application. A work, and
/// what an agent applied, are the cluster's state, which no tenant writes;
/// a refused claimant's work is deleted, so at most one holds a key for
/// long.
pub(super) fn other_owner(app: &Application, target: &Target, ctx: &Context) -> Option<HubRef> {
    let me = HubRef::of(app);
    let name = app.name_any();
    let slot = (
        target.cluster.clone(),
        target.app_namespace.clone(),
        name.clone(),
    );
    let claimants = ctx.caches.slots.claimants(&slot);
    if claimants.iter().all(|r| *r == me) {
        return None;
    }
    let facts = Facts {
        grpc_served: ctx.grpc.is_some(),
        authorization: &ctx.authorization,
        world: &ctx.caches,
    };
    let held_over_grpc = ctx.grpc.as_ref().and_then(|hub| {
        hub.held_by(
            &target.cluster,
            &ObjectKey {
                namespace: target.app_namespace.clone(),
                name: name.clone(),
            },
        )
    });
    let mine = delivers_by_work(ctx, target, &name, &me);
    let mut candidates = vec![(Seniority::of(&app.metadata), mine, me.clone())];
    for r in claimants.into_iter().filter(|r| *r != me) {
        let Some(cached) = ctx
            .caches
            .apps
            .get(&ObjectRef::new(&r.name).within(&r.namespace))
        else {
            continue;
        };
        let other = cached.application();
        // As the gRPC transport's index sees it (`route::assign`): the
        // same claimants on both sides, so both name the same owner.
        let holds = match assign(&other, &facts) {
            Assignment::Deliver { .. } => {
                held_over_grpc.is_some()
                    && held_over_grpc.as_deref() == other.metadata.uid.as_deref()
            }
            Assignment::NotOurs {
                by_work: Some(_), ..
            } => delivers_by_work(ctx, target, &name, &r),
            Assignment::NotOurs { .. } | Assignment::Refused { .. } => continue,
        };
        candidates.push((Seniority::of(&other.metadata), holds, r));
    }
    owner_holding(candidates.iter().map(|(s, holds, r)| (s, *holds, r)))
        .filter(|o| **o != me)
        .cloned()
}

/// Whether `r`'s ManifestWork on `target`'s cluster, as the cache has it,
/// delivers the spoke Application `name` in `target`'s namespace now.
fn delivers_by_work(ctx: &Context, target: &Target, name: &str, r: &HubRef) -> bool {
    let Lookup::Known(Some(work)) = ctx
        .caches
        .work(&target.cluster, &work_name(&r.namespace, &r.name))
    else {
        return false;
    };
    work.metadata.deletion_timestamp.is_none()
        && work.spec.manifest_configs.iter().flatten().any(|c| {
            c.resource_identifier.resource == "applications"
                && c.resource_identifier.name == name
                && c.resource_identifier.namespace.as_deref() == Some(&target.app_namespace)
        })
}

/// Deletes the ManifestWork of `app`, if any, with `deleteOption: Orphan`
/// first, so that the work agent leaves the spoke Application where it is
/// (for the gRPC transport to take over, or for the hub Application that
/// owns it).
pub(super) async fn orphan_work(
    app: &Application,
    target: &Target,
    ctx: &Context,
    why: &str,
) -> Result<Action, Error> {
    let name = work_name(&app.namespace().unwrap_or_default(), &app.name_any());
    let works: Api<ManifestWork> = Api::namespaced(ctx.client.clone(), &target.cluster);
    let existing = match ctx.caches.work(&target.cluster, &name) {
        Lookup::Known(w) => w.map(|w| *w),
        Lookup::Stale => works.get_opt(&name).await?,
    };
    let Some(work) = existing else {
        return Ok(Action::await_change());
    };
    let orphaned = work
        .spec
        .delete_option
        .as_ref()
        .and_then(|d| d.propagation_policy.as_ref())
        == Some(&ManifestWorkDeleteOptionPropagationPolicy::Orphan);
    if !orphaned {
        let orphan = json!({ "spec": { "deleteOption": { "propagationPolicy": "Orphan" } } });
        match works
            .patch(&name, &PatchParams::default(), &Patch::Merge(orphan))
            .await
        {
            Ok(w) => ctx.caches.written.record(&w.metadata),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    if work.metadata.deletion_timestamp.is_none() {
        match works.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        ctx.caches.written.forget(&target.cluster, &name);
        tracing::info!(namespace = %app.namespace().unwrap_or_default(), name = %app.name_any(), cluster = %target.cluster, work = %name, why,
            "ManifestWork deleted with the Application orphaned on the spoke");
    }
    Ok(Action::await_change())
}
