//! The AppProjects (and their project-scoped repository credentials) that
//! travel to each cluster over the ManifestWork transport: one work per
//! project per cluster ([`crate::render::project`]), for exactly the
//! projects of the Applications this transport delivers there. A project
//! whose last Application leaves a cluster has its work deleted, which
//! removes the project and its credentials from the cluster; a credential
//! never reaches a cluster with no Application of its project.
//!
//! The leader keeps them, in passes: one after any change the watches
//! report (Applications, projects, credentials, Placements, clusters, the
//! works themselves), at most one every `SETTLE`, and one a minute
//! regardless. A pass parses only the Applications that changed since the
//! last one, unless something else changed (a project, a Placement), which
//! can change any decision.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::project_of;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_runtime::shutdown::Shutdown;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::{Context, WORK_MANAGER};
use crate::render::project::{
    PROJECT_LABEL, PROJECT_SPEC_HASH, credentials_by_project, delivered_project, project_work,
};
use crate::render::work::work_name;
use crate::route::decide::{Facts, Route, decide};
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
    /// at, and the (cluster, project) it was delivered to then.
    apps: HashMap<(String, String), Seen>,
}

/// An Application's resourceVersion last looked at, and the (cluster,
/// project) it was delivered to then.
type Seen = (Option<String>, Option<(String, String)>);

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

/// One pass: the project works every cluster should have, written where
/// they differ, deleted where no longer wanted.
async fn pass(ctx: &Context, memory: &mut Memory) -> Result<(), kube::Error> {
    let everything = ctx.projects.take_everything();
    decide_all(ctx, memory, everything);
    apply(ctx, memory).await
}

/// Which (cluster, project) each Application is delivered to by this
/// transport, for those changed since the last pass (all when
/// `everything`).
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
        let delivered = match decide(&app, &facts) {
            Route::Deliver {
                transport: Transport::ManifestWork,
                target,
            } if app.metadata.deletion_timestamp.is_none() => {
                Some((target.cluster, project_of(&app).to_string()))
            }
            // Refused (its project or authorization withdrawn, say) but
            // left on the cluster as it was: so are the project and the
            // credentials it was delivered with.
            Route::Refused {
                target: Some(target),
                ..
            } if app.metadata.deletion_timestamp.is_none() => {
                left_on(ctx, &target.cluster, &key).map(|p| (target.cluster, p))
            }
            _ => None,
        };
        memory.apps.insert(key, (rv, delivered));
    }
    memory.apps.retain(|k, _| seen.contains(k));
}

/// The project the Application `key` was delivered with, when its
/// ManifestWork is still on `cluster` (its delivered copy's
/// `spec.project`).
fn left_on(ctx: &Context, cluster: &str, key: &(String, String)) -> Option<String> {
    let Lookup::Known(Some(work)) = ctx.caches.work(cluster, &work_name(&key.0, &key.1)) else {
        return None;
    };
    if work.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let manifest = work.spec.workload.as_ref()?.manifests.as_ref()?.first()?;
    let project = manifest.get("spec")?.get("project")?.as_str()?;
    Some(
        if project.is_empty() {
            "default"
        } else {
            project
        }
        .to_string(),
    )
}

/// Writes the works `memory` wants, deletes the others.
async fn apply(ctx: &Context, memory: &Memory) -> Result<(), kube::Error> {
    let wanted: BTreeSet<&(String, String)> = memory
        .apps
        .values()
        .filter_map(|(_, d)| d.as_ref())
        .collect();
    // The credentials of each project.
    let secrets = ctx.caches.credentials.state();
    let credentials = credentials_by_project(secrets.iter().map(|s| &**s), DEFAULT_APP_NAMESPACE);
    let mut keep: BTreeSet<(String, String)> = BTreeSet::new();
    // One cluster's failure (a namespace being deleted, say) holds up no
    // other: each work is tried, the first error returned at the end.
    let mut failed = None;
    for (cluster, project) in wanted {
        let Some(object) = ctx.caches.project_object(project) else {
            // Its Applications are refused: nothing to deliver.
            continue;
        };
        let mut manifests = vec![delivered_project(&object, cluster, DEFAULT_APP_NAMESPACE)];
        manifests.extend(credentials.get(project).cloned().unwrap_or_default());
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
