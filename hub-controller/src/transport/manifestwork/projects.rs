//! The AppProjects (and their project-scoped repository credentials) that
//! travel to each cluster over the ManifestWork transport: one work per
//! project per cluster ([`crate::render::project`]), for exactly the
//! projects the hub's record of what it authorized and delivered there
//! names ([`crate::authorized`]), and the credentials of those whose grant
//! still stands. What a tenant writes on a hub copy now, and what a
//! cluster writes in its works, never names a project: a copy kept after
//! a refusal keeps the grant it was delivered with. A project no grant
//! names any more has its work deleted, which leaves the AppProject on the
//! cluster and removes its credentials; a credential never reaches a
//! cluster with no standing grant of its project.
//!
//! The leader keeps them, and the record, in passes: one after any change
//! the watches report (Applications, projects, credentials, Placements,
//! clusters, the works themselves), at most one every `SETTLE`, and one a
//! minute regardless. A pass parses only the Applications that changed
//! since the last one, unless something else changed (a project, a
//! Placement), which can change any decision. Each pass writes the record
//! where it changed (both transports' grants: the gRPC ones as every
//! replica decides them), before the works that derive from it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::project_of;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_runtime::shutdown::Shutdown;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::{Context, WORK_MANAGER};
use crate::authorized::{self, ClusterRecord, Now, SpokeKey};
use crate::render::project::{
    PROJECT_LABEL, PROJECT_SPEC_HASH, credentials_by_project, delivered_project, project_work,
};
use crate::render::work::work_name;
use crate::route::decide::{Facts, Route, World, decide};
use crate::route::target::DEFAULT_APP_NAMESPACE;
use crate::route::transport::Transport;
use crate::watch::caches::Lookup;

/// The least time between two passes.
const SETTLE: Duration = Duration::from_millis(300);
/// A pass even when nothing was reported.
const RESYNC: Duration = Duration::from_secs(60);

/// What the passes remember between them.
#[derive(Default)]
pub struct Memory {
    /// Per Application (namespace, name): the resourceVersion last looked
    /// at, and what this transport decided for its spoke key then.
    apps: HashMap<(String, String), Seen>,
    /// The record as the last pass made it, by cluster (both transports).
    record: BTreeMap<String, ClusterRecord>,
    /// Whether `record` was read from the Leases (a term's first pass).
    seeded: bool,
}

/// An Application's resourceVersion last looked at, and the (cluster,
/// spoke key, decision) of this transport then.
type Seen = (Option<String>, Option<(String, SpokeKey, Now)>);

/// Keeps the project works until `down`.
pub async fn run(ctx: Arc<Context>, down: Shutdown) {
    tokio::select! {
        _ = ctx.caches.wait_synced() => {}
        _ = down.clone().wait() => return,
    }
    let mut memory = Memory::default();
    // The first pass of a term looks at everything.
    ctx.projects.everything_changed();
    loop {
        // A pass stuck on a stalled API server must not hold up the end
        // of the term (the step-down waits for this task); the next term
        // looks at everything again.
        let passed = tokio::select! {
            r = pass(&ctx, &mut memory) => r,
            _ = down.clone().wait() => return,
        };
        if let Err(e) = passed {
            tracing::warn!(error = %e, "keeping the AppProjects of the clusters failed; retrying");
        }
        tokio::select! {
            _ = ctx.projects.changed.notified() => {}
            _ = tokio::time::sleep(RESYNC) => ctx.projects.everything_changed(),
            _ = down.clone().wait() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(SETTLE) => {}
            _ = down.clone().wait() => return,
        }
    }
}

/// What the watches report to the passes.
#[derive(Default)]
pub struct Changes {
    pub changed: tokio::sync::Notify,
    /// Something other than an Application changed: decide every one again.
    everything: std::sync::atomic::AtomicBool,
}

impl Changes {
    /// An Application changed (the pass finds which).
    pub fn app_changed(&self) {
        self.changed.notify_one();
    }

    pub fn everything_changed(&self) {
        self.everything
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_one();
    }

    fn take_everything(&self) -> bool {
        self.everything
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }
}

/// One pass: the record, then the project works every cluster should
/// have, written where they differ, deleted where no longer wanted.
async fn pass(ctx: &Context, memory: &mut Memory) -> Result<(), kube::Error> {
    let everything = ctx.projects.take_everything();
    decide_all(ctx, memory, everything);
    record_all(ctx, memory);
    // The record first: a replica serving a cluster's agent, or the next
    // leader, derives from it.
    let persisted = persist(ctx, memory).await;
    let applied = apply(ctx, memory).await;
    persisted.and(applied)
}

/// What this transport decides for each Application's spoke key, for
/// those changed since the last pass (all when `everything`).
fn decide_all(ctx: &Context, memory: &mut Memory, everything: bool) {
    let facts = Facts {
        grpc_served: ctx.grpc.is_some(),
        authorization: &ctx.authorization,
        world: &ctx.caches,
    };
    let mut seen = BTreeSet::new();
    for cached in ctx.caches.apps.state() {
        let key = (cached.namespace().unwrap_or_default(), cached.name_any());
        let rv = cached.identity().resource_version.clone();
        seen.insert(key.clone());
        if !everything && memory.apps.get(&key).is_some_and(|(v, _)| *v == rv) {
            continue;
        }
        let app = cached.application();
        let now = if app.metadata.deletion_timestamp.is_some() {
            None
        } else {
            decided(ctx, &app, decide(&app, &facts), &key)
        };
        memory.apps.insert(key, (rv, now));
    }
    memory.apps.retain(|k, _| seen.contains(k));
}

/// What `route` means for the record, when this transport acts on it: a
/// delivery it owns is authorized now; a refusal whose work is still on
/// the cluster keeps the grant that work was delivered with (whatever the
/// work says now: a cluster may edit it).
fn decided(
    ctx: &Context,
    app: &argocd_pull_apis::argocd::Application,
    route: Route,
    key: &(String, String),
) -> Option<(String, SpokeKey, Now)> {
    let (target, now) = match route {
        Route::Deliver {
            transport: Transport::ManifestWork,
            target,
        } => {
            if super::handover::other_owner(app, &target, ctx).is_some() {
                return None;
            }
            let checked = ctx
                .caches
                .project_version(project_of(app))
                .unwrap_or_default();
            let grant = authorized::grant(app, &target, Transport::ManifestWork, checked);
            (target, Now::Authorized(grant))
        }
        Route::Refused {
            by: Transport::ManifestWork,
            target: Some(target),
            ..
        } if work_kept(ctx, &target.cluster, key) => {
            let owners = app.metadata.uid.clone().into_iter().collect();
            (target, Now::Kept { owners })
        }
        _ => return None,
    };
    let spoke = (target.app_namespace.clone(), key.1.clone());
    Some((target.cluster, spoke, now))
}

/// Whether the ManifestWork of Application `key` is on `cluster`, not
/// being deleted.
fn work_kept(ctx: &Context, cluster: &str, key: &(String, String)) -> bool {
    matches!(
        ctx.caches.work(cluster, &work_name(&key.0, &key.1)),
        Lookup::Known(Some(w)) if w.metadata.deletion_timestamp.is_none()
    )
}

/// The record of every cluster after this pass's decisions: this
/// transport's grants from its own, the gRPC transport's as every replica
/// computes them.
fn record_all(ctx: &Context, memory: &mut Memory) {
    if !memory.seeded {
        if let Some(records) = ctx.authorized.get() {
            for c in records.clusters() {
                memory
                    .record
                    .insert(c.clone(), (*records.record(&c).0).clone());
            }
        }
        memory.seeded = true;
    }
    let mut now: BTreeMap<String, Vec<(SpokeKey, Now)>> = BTreeMap::new();
    for (cluster, spoke, decision) in memory.apps.values().filter_map(|(_, d)| d.as_ref()) {
        now.entry(cluster.clone())
            .or_default()
            .push((spoke.clone(), decision.clone()));
    }
    let mut clusters: BTreeSet<String> = now.keys().cloned().collect();
    clusters.extend(memory.record.keys().cloned());
    if let Some(hub) = &ctx.grpc {
        clusters.extend(hub.clusters().iter().map(|cs| cs.name.clone()));
    }
    for cluster in clusters {
        let recorded: ClusterRecord = memory
            .record
            .get(&cluster)
            .into_iter()
            .flatten()
            .filter(|(_, g)| g.transport == Transport::ManifestWork)
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect();
        let mut next = authorized::next(&recorded, now.remove(&cluster).unwrap_or_default());
        if let Some(hub) = &ctx.grpc {
            next.extend(hub.authorized_record(&cluster));
        }
        if next.is_empty() {
            memory.record.remove(&cluster);
        } else {
            memory.record.insert(cluster, next);
        }
    }
}

/// Writes the record of every cluster whose Lease differs.
async fn persist(ctx: &Context, memory: &Memory) -> Result<(), kube::Error> {
    let Some(records) = ctx.authorized.get() else {
        return Ok(());
    };
    let mut clusters: BTreeSet<String> = memory.record.keys().cloned().collect();
    clusters.extend(records.clusters());
    let mut failed = None;
    let empty = ClusterRecord::new();
    for cluster in clusters {
        let want = memory.record.get(&cluster).unwrap_or(&empty);
        let (have, version) = records.record(&cluster);
        // A record over its bound is kept whole here and cut in the Lease:
        // compared as the Lease holds it, or it is written on every pass.
        if *have == *want || authorized::encode(&have).0 == authorized::encode(want).0 {
            continue;
        }
        match records.keep(&cluster, want, &version).await {
            Ok(()) => {
                tracing::info!(
                    cluster,
                    grants = want.len(),
                    "the record of what the hub authorized on the cluster written"
                );
            }
            Err(e) => {
                tracing::warn!(cluster, error = %e, "the record of what the hub authorized not written; retried on the next pass");
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Writes the works the record wants, deletes the others.
async fn apply(ctx: &Context, memory: &Memory) -> Result<(), kube::Error> {
    // The credentials of each project.
    let secrets = ctx.caches.projects.credentials.state();
    let credentials = credentials_by_project(secrets.iter().map(|s| &**s), DEFAULT_APP_NAMESPACE);
    let mut keep: BTreeSet<(String, String)> = BTreeSet::new();
    // One cluster's failure (a namespace being deleted, say) holds up no
    // other: each work is tried, the first error returned at the end.
    let mut failed = None;
    for (cluster, record) in &memory.record {
        let wanted = authorized::projects(
            record.values(),
            Transport::ManifestWork,
            |name| ctx.caches.project(name),
            ctx.authorization.projects.as_deref(),
        );
        for (project, with_credentials) in &wanted {
            let Some(object) = ctx.caches.project_object(project) else {
                continue;
            };
            let mut manifests = vec![delivered_project(&object, cluster, DEFAULT_APP_NAMESPACE)];
            if *with_credentials {
                manifests.extend(credentials.get(project).cloned().unwrap_or_default());
            }
            let work = match project_work(cluster, project, manifests) {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(cluster, project, error = %e, "AppProject not delivered");
                    continue;
                }
            };
            keep.insert((cluster.clone(), work.name_any()));
            if let Err(e) = write(ctx, cluster, project, &work).await {
                tracing::warn!(cluster, project, error = %e, "AppProject not written; retried on the next pass");
                failed.get_or_insert(e);
            }
        }
    }
    // Project works no longer wanted: their last Application has left.
    for w in ctx.caches.works.state() {
        if !w
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(PROJECT_LABEL))
            || w.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let cluster = w.namespace().unwrap_or_default();
        let name = w.name_any();
        if keep.contains(&(cluster.clone(), name.clone())) {
            continue;
        }
        let works: Api<ManifestWork> = Api::namespaced(ctx.client.clone(), &cluster);
        match works.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(cluster, work = %name, error = %e, "AppProject work not deleted; retried on the next pass");
                failed.get_or_insert(e);
                continue;
            }
        }
        ctx.caches.written.forget(&cluster, &name);
        tracing::info!(cluster, work = %name, "AppProject removed: no Application of it is delivered there");
    }
    failed.map_or(Ok(()), Err)
}

/// Writes the project work `work` of `project` to `cluster` unless the
/// one there was rendered the same.
async fn write(
    ctx: &Context,
    cluster: &str,
    project: &str,
    work: &ManifestWork,
) -> Result<(), kube::Error> {
    let name = work.name_any();
    let works: Api<ManifestWork> = Api::namespaced(ctx.client.clone(), cluster);
    // Its metadata says whether it must be written: no need to parse the
    // work (its credentials included) on every pass.
    let existing = match ctx.caches.cached_work(cluster, &name) {
        Some(cached) => cached.map(|w| w.metadata.clone()),
        None => works.get_opt(&name).await?.map(|w| w.metadata),
    };
    let get = |m: &Option<std::collections::BTreeMap<String, String>>, k: &str| {
        m.as_ref().and_then(|m| m.get(k)).cloned()
    };
    let unchanged = |e: &kube::api::ObjectMeta| {
        e.deletion_timestamp.is_none()
            && get(&e.annotations, PROJECT_SPEC_HASH)
                == get(&work.metadata.annotations, PROJECT_SPEC_HASH)
            && get(&e.labels, PROJECT_LABEL) == get(&work.metadata.labels, PROJECT_LABEL)
    };
    if existing.as_ref().is_some_and(unchanged) {
        return Ok(());
    }
    let applied = works
        .patch(
            &name,
            &PatchParams::apply(WORK_MANAGER).force(),
            &Patch::Apply(work),
        )
        .await?;
    ctx.caches.written.record(&applied.metadata);
    tracing::info!(cluster, project, work = %name, "AppProject delivered");
    Ok(())
}
