//! Keeps one Argo CD cluster Secret per ManagedCluster in the hub's Argo CD
//! namespace. Removal is left to Kubernetes garbage collection through the
//! Secret's owner reference to its ManagedCluster.
//!
//! The Secrets are written, never read: watching them would need `list`
//! on every Secret of the Argo CD namespace (RBAC cannot narrow a list by
//! label), `argocd-secret` and repository credentials included. So a
//! Secret deleted or edited by hand is restored by the periodic
//! re-apply ([`RESTORE_EVERY`]) instead of by a watch.

use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::ocm::ManagedCluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use kube::{Client, ResourceExt};

use super::WORK_MANAGER;
use crate::render::cluster_secret::cluster_secret;

/// How often each cluster's Secret is applied again.
pub const RESTORE_EVERY: Duration = Duration::from_secs(600);

struct Ctx {
    client: Client,
    namespace: String,
}

/// Runs until `shutdown` resolves.
pub async fn run(
    client: Client,
    argocd_namespace: String,
    shutdown: argocd_pull_runtime::shutdown::Shutdown,
) {
    let clusters: Api<ManagedCluster> = Api::all(client.clone());
    let ctx = Arc::new(Ctx {
        client,
        namespace: argocd_namespace,
    });
    // The Secret depends on the cluster's name, uid and spec: only a new
    // generation (or a new cluster) is worth a write. Status updates, which
    // OCM's registration agent makes all the time, are not.
    let (reader, writer) = reflector::store();
    let changed = watcher(clusters, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let running = Controller::for_stream(changed, reader)
        .graceful_shutdown_on(shutdown.clone().wait())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    // A SIGTERM before the first list (a replica stopped just after it
    // took the lease) hung the process for good.
    let grace = super::controller::SHUTDOWN_GRACE;
    if !shutdown.bounded(running, grace).await {
        tracing::warn!(
            ?grace,
            "cluster Secret controller did not stop in time; stopping anyway"
        );
    }
}

async fn reconcile(cluster: Arc<ManagedCluster>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let secret = cluster_secret(&cluster, &ctx.namespace);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    api.patch(
        &secret.name_any(),
        &PatchParams::apply(WORK_MANAGER).force(),
        &Patch::Apply(&secret),
    )
    .await?;
    Ok(Action::requeue(RESTORE_EVERY))
}

fn error_policy(cluster: Arc<ManagedCluster>, error: &kube::Error, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(cluster = %cluster.name_any(), namespace = %ctx.namespace, %error,
        "cannot write the Argo CD cluster Secret (does the Argo CD namespace exist?); retrying");
    Action::requeue(Duration::from_secs(15))
}
