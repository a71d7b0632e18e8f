//! Keeps one Argo CD cluster Secret per ManagedCluster in the hub's Argo CD
//! namespace. Removal is left to Kubernetes garbage collection through the
//! Secret's owner reference to its ManagedCluster.
//!
//! The Secrets are written, never read: watching them would need `list`
//! on every Secret of the Argo CD namespace (RBAC cannot narrow a list by
//! label), `argocd-secret` and repository credentials included. So a
//! Secret deleted or edited by hand is restored by the periodic
//! re-apply ([`RESTORE_EVERY`]) instead of by a watch, and a new leader
//! applies every Secret once more, spread at [`FIRST_PASS_PER_SECOND`].
//! A cluster is written when it appears and when its spec changes (a new
//! generation), not on its status updates. Its `server` depends on the
//! other clusters too ([`choose_server`]: two clusters never get one
//! server), so a cluster whose URL or server changed has the clusters
//! that give the same URL, now or before, looked at again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_pull_apis::ocm::ManagedCluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use super::WORK_MANAGER;
use crate::render::cluster_secret::{
    ServerRefused, choose_server, cluster_secret, cluster_url, live_cluster_secret, placeholder,
    same_server, secret_name, slim,
};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// How often each cluster's Secret is applied again.
pub const RESTORE_EVERY: Duration = Duration::from_secs(600);

/// A new term's first pass applies every cluster's Secret again, at most
/// this many a second: a leader that takes over a large fleet must not
/// crowd out the status writes of the failover it is part of. (Without
/// reading Secrets it cannot tell which are current; see the module's
/// doc for why it does not read them.)
pub const FIRST_PASS_PER_SECOND: u32 = 10;

struct Ctx {
    client: Client,
    namespace: String,
    first_pass: Mutex<Spread>,
    /// The hosts the hub's API server is known by (see
    /// [`crate::render::cluster_secret::check_server`]).
    hub: Vec<String>,
    /// With the live endpoint on, every Secret points there.
    live: crate::transport::grpc::live::LiveArgs,
    recorder: Recorder,
    /// Every ManagedCluster (slimmed), which each server is chosen among.
    clusters: Store<ManagedCluster>,
    /// Per cluster, the URL it gave and the server written when it was
    /// last looked at.
    chosen: Mutex<HashMap<String, Chosen>>,
    /// Clusters to look at again.
    again: mpsc::UnboundedSender<ObjectRef<ManagedCluster>>,
}

/// What a cluster's Secret was written from, and with.
#[derive(Clone, Debug, Default, PartialEq)]
struct Chosen {
    url: String,
    server: String,
}

/// Spreads the first reconcile of each cluster in a term: the n-th cluster
/// seen is written `n / rate` after the term started (at once when that
/// moment has passed: a cluster that appears later waits for nobody).
#[derive(Debug)]
struct Spread {
    start: Instant,
    interval: Duration,
    seen: HashSet<String>,
}

impl Spread {
    fn new(start: Instant, per_second: u32) -> Self {
        Self {
            start,
            interval: Duration::from_secs(1) / per_second.max(1),
            seen: Default::default(),
        }
    }

    /// How long the reconcile of `uid` at `now` should wait before it
    /// writes; `None` to write now.
    fn delay(&mut self, uid: &str, now: Instant) -> Option<Duration> {
        if self.seen.contains(uid) {
            return None;
        }
        let slot = self.interval * self.seen.len() as u32;
        self.seen.insert(uid.to_string());
        (self.start + slot)
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
    }
}

/// Runs until `shutdown` resolves.
pub async fn run(
    client: Client,
    argocd_namespace: String,
    hub: Vec<String>,
    live: crate::transport::grpc::live::LiveArgs,
    shutdown: argocd_pull_runtime::shutdown::Shutdown,
) {
    let clusters: Api<ManagedCluster> = Api::all(client.clone());
    let reporter = Reporter {
        controller: "argocd-pull-hub-controller".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    // The Secret depends on the cluster's name, uid and spec: only a new
    // generation (or a new cluster) is worth a write. Status updates, which
    // OCM's registration agent makes all the time, are not.
    let (reader, writer) = reflector::store();
    let (again, looks) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        namespace: argocd_namespace,
        first_pass: Mutex::new(Spread::new(Instant::now(), FIRST_PASS_PER_SECOND)),
        hub,
        live,
        clusters: reader.clone(),
        chosen: Mutex::default(),
        again,
    });
    let changed = watcher(clusters, watcher::Config::default())
        .default_backoff()
        .modify(slim)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let running = Controller::for_stream(changed, reader)
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(looks))
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
        // What it gave may now go to another cluster.
        let gone = ctx
            .chosen
            .lock()
            .expect("never poisoned")
            .remove(&cluster.name_any());
        let fleet = ctx.clusters.state();
        ctx.look_again_at_others(&cluster, &fleet, gone.unwrap_or_default(), None);
        return Ok(Action::await_change());
    }
    let uid = cluster.metadata.uid.clone().unwrap_or_default();
    // With the live endpoint, its server: nothing the cluster wrote is used.
    match ctx.live.endpoint() {
        Ok(Some(live)) => {
            ctx.write(&live_cluster_secret(&cluster, &ctx.namespace, &live))
                .await?;
            return Ok(Action::requeue(RESTORE_EVERY));
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(cluster = %cluster.name_any(), error = %e, "cannot write the cluster Secret for the live endpoint; retrying");
            return Ok(Action::requeue(Duration::from_secs(15)));
        }
    }
    let wait = ctx
        .first_pass
        .lock()
        .expect("never poisoned")
        .delay(&uid, Instant::now());
    if let Some(wait) = wait {
        return Ok(Action::requeue(wait));
    }
    let fleet = ctx.clusters.state();
    let (server, refused) = choose_server(&cluster, &ctx.hub, fleet.iter().map(|c| &**c));
    if let Some((url, why)) = &refused {
        refused_server(&cluster, url, why, &server, &ctx).await;
    }
    let now = Chosen {
        url: cluster_url(&cluster).unwrap_or_default().to_string(),
        server: server.clone(),
    };
    let before = ctx
        .chosen
        .lock()
        .expect("never poisoned")
        .insert(cluster.name_any(), now.clone());
    if before.as_ref() != Some(&now) {
        ctx.look_again_at_others(&cluster, &fleet, before.unwrap_or_default(), Some(now));
    }
    ctx.write(&cluster_secret(&cluster, &ctx.namespace, &server))
        .await?;
    Ok(Action::requeue(RESTORE_EVERY))
}

impl Ctx {
    /// Applies `secret` (whole: fields it no longer has go).
    async fn write(&self, secret: &Secret) -> Result<(), kube::Error> {
        Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                &secret.name_any(),
                &PatchParams::apply(WORK_MANAGER).force(),
                &Patch::Apply(secret),
            )
            .await?;
        Ok(())
    }

    /// `cluster` changed what it gives or gets (`before`, `now`; `None`:
    /// it is going): every other cluster of `fleet` whose URL is one of
    /// those, or is `cluster`'s placeholder, and every cluster whose
    /// placeholder is one of those URLs, may now have to give up its URL
    /// or placeholder or get it back. Converges: a cluster looked at again
    /// whose URL and server did not change has nobody else looked at.
    fn look_again_at_others(
        &self,
        cluster: &ManagedCluster,
        fleet: &[Arc<ManagedCluster>],
        before: Chosen,
        now: Option<Chosen>,
    ) {
        let name = cluster.name_any();
        let own = placeholder(&name);
        let mut urls = vec![own.as_str(), before.url.as_str()];
        if let Some(now) = &now {
            urls.push(now.url.as_str());
        }
        let given = |u: &str| !u.is_empty() && u != own;
        for other in fleet {
            if other.name_any() == name {
                continue;
            }
            let gives_one = cluster_url(other)
                .is_some_and(|theirs| urls.iter().any(|u| !u.is_empty() && same_server(u, theirs)));
            let named_by_one = urls
                .iter()
                .any(|u| given(u) && same_server(u, &placeholder(&other.name_any())));
            if gives_one || named_by_one {
                let _ = self.again.send(ObjectRef::from_obj(&**other));
            }
        }
    }
}

/// Tells the cluster's owner why its URL is not the Secret's server: a
/// Warning Event on the ManagedCluster (each time the Secret is written:
/// a new generation of the cluster, and every [`RESTORE_EVERY`]).
async fn refused_server(
    cluster: &ManagedCluster,
    url: &str,
    why: &ServerRefused,
    server: &str,
    ctx: &Ctx,
) {
    let name = cluster.name_any();
    let note = format!(
        "managedClusterClientConfigs[0].url {url:?} {why}: the Argo CD cluster Secret {}/{} is written with server {server} instead. Set the klusterlet's hub-facing API server URL (Klusterlet spec.externalServerURLs) to the cluster's real external API address",
        ctx.namespace,
        secret_name(&name)
    );
    tracing::warn!(cluster = %name, %url, %why, "cluster URL refused for the Argo CD cluster Secret");
    let event = Event {
        type_: EventType::Warning,
        reason: "ClusterURLRefused".into(),
        note: Some(note),
        action: "WriteClusterSecret".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &cluster.object_ref(&())).await {
        tracing::warn!(cluster = %name, error = %e, "could not publish event");
    }
}

fn error_policy(cluster: Arc<ManagedCluster>, error: &kube::Error, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(cluster = %cluster.name_any(), namespace = %ctx.namespace, %error,
        "cannot write the Argo CD cluster Secret (does the Argo CD namespace exist?); retrying");
    Action::requeue(Duration::from_secs(15))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_pass_is_spread_and_later_clusters_wait_for_nobody() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = Spread::new(t0, 10);
        // The first is written at once, the next ones 100 ms apart.
        assert_eq!(s.delay("a", t0), None);
        assert_eq!(s.delay("b", t0), Some(Duration::from_millis(100)));
        assert_eq!(s.delay("c", t0), Some(Duration::from_millis(200)));
        // Their requeue comes back: written then, not spread again.
        assert_eq!(s.delay("b", at(100)), None);
        assert_eq!(s.delay("c", at(200)), None);
        // A cluster that appears after the pass is written at once.
        assert_eq!(s.delay("d", at(5_000)), None);
        // One that appears during it waits for its slot only.
        let mut s = Spread::new(t0, 10);
        for (i, uid) in ["a", "b", "c", "d"].iter().enumerate() {
            s.delay(uid, t0);
            assert_eq!(s.seen.len(), i + 1);
        }
        assert_eq!(s.delay("e", at(250)), Some(Duration::from_millis(150)));
    }
}
