//! The hub's side of the gRPC transport, apart from the streams: the index
//! fed by watches (which hub Application goes to which cluster and key), the
//! per-cluster state, and the workers that write to the hub API server
//! (status, mirrors, command completion, finalizer release).
//!
//! The desired set of each cluster is computed from the watch caches as the
//! events arrive, without any API call, so a session can compare digests as
//! soon as the caches are synced; everything that writes goes through a
//! keyed work queue whose workers run in parallel across objects.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::ocm::ManagedClusterAddOn;
use argocd_pull_proto::v1::ObjectKey;
use argocd_pull_runtime::workqueue::WorkQueue;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio::sync::watch;

mod claimed;
mod fleet;
mod holding;
mod index;
mod mirror;
mod projects;
mod workers;

pub use index::{Decision, Index};
use mirror::mirror_work;

use super::GrpcConfig;
use super::cluster::{ClusterState, Item, Work};
use super::metrics::GrpcMetrics;
use crate::hub::cached::CachedApp;
use crate::hub::caches::{self, Caches};
use crate::hub::watches::{Consumer, Event};
use crate::status::AppWriter;
use crate::transport::grpc::assign::{self, Assignment, Facts, HubRef};

/// Field manager of the read-only mirrors.
pub const MIRROR_MANAGER: &str = "argocd-pull-mirror";

/// Shared by the sessions, the event loop and the workers.
pub struct Hub {
    /// This hub, for the tasks it starts from a watch event.
    me: std::sync::Weak<Hub>,
    pub config: GrpcConfig,
    pub client: kube::Client,
    pub metrics: GrpcMetrics,
    /// Private to the hub: sessions and the rest read it through methods
    /// ([`Hub::winner`], [`Hub::owner`], [`Hub::removal`], ...).
    index: Mutex<Index>,
    clusters: Mutex<HashMap<String, Arc<ClusterState>>>,
    /// The hub's one set of caches, shared with the ManifestWork transport.
    caches: Caches,
    /// What the workers write; sessions add to it with [`Hub::enqueue`].
    queue: WorkQueue<Work>,
    /// Applications whose last status write was the first of two steps
    /// (`Progressing` before the reported health): the echo of that write
    /// goes in the queue's second lane ([`WorkQueue::add_urgent`]).
    follow_ups: Mutex<HashSet<HubRef>>,
    synced: watch::Sender<bool>,
    /// The one writer of hub Applications, shared with the ManifestWork
    /// transport.
    pub writer: Arc<AppWriter>,
    next_session: AtomicU64,
    /// Told of Applications that move to or from this transport, for the
    /// ManifestWork controller to look at again (while it runs).
    on_switch: std::sync::OnceLock<OnSwitch>,
    /// With several replicas: which one writes for a cluster.
    claims: std::sync::OnceLock<Arc<super::claims::Claims>>,
    /// Counts the changes of AppProjects and credential Secrets, for the
    /// sessions that keep them on their clusters ([`Hub::project_set`]).
    projects_epoch: watch::Sender<u64>,
    /// The record of what each agent holds ([`Hub::set_holders`]).
    holders: std::sync::OnceLock<Arc<super::holders::Holders>>,
}

/// What [`Hub::on_transport_switch`] calls: the Application, and the
/// trigger its ManifestWork reconcile is counted under.
type OnSwitch = Box<dyn Fn(&HubRef, &'static str) + Send + Sync>;

impl Hub {
    /// A transport reading `caches`, which must be fed by
    /// [`crate::hub::watches`] with [`Scope::grpc`](crate::hub::watches::Scope)
    /// and this hub among the consumers.
    pub fn new(
        config: GrpcConfig,
        client: kube::Client,
        metrics: GrpcMetrics,
        caches: Caches,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| {
            metrics.bind(me.clone());
            Self {
                me: me.clone(),
                writer: AppWriter::new(client.clone()),
                caches,
                config,
                client,
                metrics,
                index: Mutex::default(),
                clusters: Mutex::default(),
                queue: WorkQueue::new(),
                follow_ups: Mutex::default(),
                synced: watch::channel(false).0,
                next_session: AtomicU64::new(1),
                claims: std::sync::OnceLock::new(),
                on_switch: std::sync::OnceLock::new(),
                projects_epoch: watch::channel(0).0,
                holders: std::sync::OnceLock::new(),
            }
        })
    }

    /// Queues `work` for the writers (a hub Application to look at again,
    /// or a mirror).
    pub fn enqueue(&self, work: Work) {
        self.queue.add(work);
    }

    /// How much work waits for the writers.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Stops the writers once what is queued is done (the server's end).
    pub fn close_queue(&self) {
        self.queue.close();
    }

    /// The agent mode `cluster` is configured for (its
    /// AddOnDeploymentConfig), as the caches show it.
    pub fn configured_mode(
        &self,
        cluster: &str,
    ) -> Option<Result<crate::hub::mode::Configured, String>> {
        self.caches.configured_mode(cluster)
    }

    /// Whether `cluster`'s ManagedCluster exists, as the caches show it.
    pub fn cluster_exists(&self, cluster: &str) -> bool {
        self.caches.cluster_exists(cluster)
    }

    /// Whether the argocd-pull addon is enabled on `cluster`.
    pub fn addon_enabled(&self, cluster: &str) -> bool {
        self.caches.addon_enabled(cluster)
    }

    /// Whether the hub's caches have had their first full lists.
    pub fn caches_synced(&self) -> bool {
        self.caches.is_synced()
    }

    pub fn session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// The state of `cluster`, created on first use.
    pub fn cluster(&self, cluster: &str) -> Arc<ClusterState> {
        self.clusters
            .lock()
            .expect("never poisoned")
            .entry(cluster.to_string())
            .or_insert_with(|| {
                Arc::new(ClusterState::counting_delivery(
                    cluster,
                    self.metrics.delivery.clone(),
                ))
            })
            .clone()
    }

    pub fn clusters(&self) -> Vec<Arc<ClusterState>> {
        self.clusters
            .lock()
            .expect("never poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Resolves once every watch has its first full list.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    fn assign(&self, app: &Application) -> Assignment {
        assign::assign(
            app,
            &Facts {
                grpc_served: true,
                authorization: &self.config.authorization,
                world: &self.caches,
            },
        )
    }

    // -----------------------------------------------------------------------
    // The hub's watch events -> index -> desired sets

    /// Applies one event of the hub's watches. Until every watch has had
    /// its first full list the index is not built (nothing reads it yet):
    /// [`Consumer::synced`] builds it once then, instead of once per event
    /// and per list (with 10,000 Applications and 1,000 clusters, tens of
    /// thousands of passes).
    fn handle(&self, ev: &Event) {
        use watcher::Event as E;
        let synced = self.is_synced();
        match ev {
            Event::App(e) => self.app_event(e, synced),
            // Revocation (see `super::super::revoke`): a cluster that left
            // OCM is cut off at once; one whose addon was disabled once its
            // agent has let go of the Applications moving to ManifestWork.
            Event::Cluster(E::Delete(mc)) => {
                self.revoke(&mc.name_any(), "its ManagedCluster was deleted");
                self.forget_holders(&mc.name_any());
            }
            Event::Cluster(E::Apply(mc) | E::InitApply(mc))
                if self.caches.addon_enabled(&mc.name_any()) =>
            {
                self.allow(&mc.name_any())
            }
            Event::Addon(e) => self.addon_event(e, synced),
            Event::Mirror(E::Apply(m) | E::InitApply(m) | E::Delete(m)) => {
                if let Some(work) = mirror_work(m) {
                    if let Work::Mirror { cluster, key } = &work {
                        self.seed_mirror(cluster, key, m);
                    }
                    self.queue.add(work);
                }
            }
            // Until then the index is not built at all.
            _ if !synced => {}
            Event::Decision(E::Apply(d) | E::InitApply(d) | E::Delete(d)) => {
                let ns = d.namespace();
                self.reassign_where(|app| app.namespace() == ns);
            }
            // A project changed: each of its Applications is decided again
            // (one no longer allowed keeps its copy on the cluster as it was).
            Event::Project(E::Apply(p) | E::InitApply(p) | E::Delete(p)) => {
                let name = p.name_any();
                self.reassign_where(|app| caches::uses_project(app, &name));
                self.project_or_credential_changed();
            }
            Event::Credential(E::Apply(_) | E::Delete(_) | E::InitDone) => {
                self.project_or_credential_changed()
            }
            // A list again after the watch was down: anything may have changed.
            Event::Decision(E::InitDone) | Event::Project(E::InitDone) => {
                self.reassign_all();
                self.project_or_credential_changed();
            }
            _ => {}
        }
    }

    /// An event of the hub Applications' watch (see [`Hub::handle`]).
    fn app_event(&self, ev: &watcher::Event<CachedApp>, synced: bool) {
        use watcher::Event as E;
        match ev {
            E::Delete(a) => {
                let r = HubRef::of(a);
                self.writer.written().forget(&r.namespace, &r.name);
                self.unassign(&r);
            }
            E::InitDone => {
                // Applications deleted while the watch was down.
                let known: Vec<HubRef> = self.index.lock().expect("never poisoned").refs();
                for r in known {
                    if self.caches.apps.get(&app_ref(&r)).is_none() {
                        self.unassign(&r);
                    }
                }
            }
            // Until then the index is not built at all.
            E::Apply(a) | E::InitApply(a) if synced => {
                // The echo of the first step of a two-step status write
                // (`Progressing`, then what was reported) brings the second
                // step: in the queue's second lane, in turn with new work,
                // instead of behind every Application waiting for its first
                // write (at a fleet's first start every copy showed
                // `Progressing` before any showed more). The next event of
                // the Application after that write is its echo, or a newer
                // change that needs a decision as much.
                let (r, assignment) = self.route(a);
                let urgent = self.follow_ups.lock().expect("never poisoned").remove(&r);
                self.apply(r, assignment, urgent);
            }
            _ => {}
        }
    }

    /// An event of the ManagedClusterAddOns' watch (see [`Hub::handle`]).
    fn addon_event(&self, ev: &watcher::Event<ManagedClusterAddOn>, synced: bool) {
        use watcher::Event as E;
        match ev {
            E::Apply(a) | E::InitApply(a) => {
                let cluster = a.namespace().unwrap_or_default();
                self.allow(&cluster);
                if synced {
                    self.reassign_targeting(&cluster);
                }
            }
            E::Delete(a) => {
                let cluster = a.namespace().unwrap_or_default();
                if synced {
                    self.reassign_targeting(&cluster);
                }
                if let Some(hub) = self.me.upgrade() {
                    hub.revoke_once_released(cluster, "the argocd-pull addon was disabled");
                }
            }
            // A list again after the watch was down: anything may have changed.
            E::InitDone if synced => {
                self.reassign_all();
                self.project_or_credential_changed();
            }
            _ => {}
        }
    }

    fn reassign_all(&self) {
        self.reassign_where(|_| true);
    }

    fn reassign_targeting(&self, cluster: &str) {
        self.reassign_where(|app| caches::targets(app, cluster));
    }

    fn reassign_where(&self, filter: impl Fn(&CachedApp) -> bool) {
        let apps: Vec<Arc<CachedApp>> = self
            .caches
            .apps
            .state()
            .into_iter()
            .filter(|a| filter(a))
            .collect();
        // Parsing and routing are pure, and most of the index build at a
        // start (100,000 Applications: several seconds before any agent is
        // welcomed): on every core. The index takes the results in turn.
        for (r, a) in parallel_map(&apps, |app| self.route(app)) {
            self.apply(r, a, false);
        }
    }

    /// Calls `f` with every Application that moves to or from the gRPC
    /// transport (set once).
    pub fn on_transport_switch(&self, f: impl Fn(&HubRef, &'static str) + Send + Sync + 'static) {
        let _ = self.on_switch.set(Box::new(f));
    }

    /// Where `cached` goes (pure: reads the caches, changes nothing).
    fn route(&self, cached: &CachedApp) -> (HubRef, Assignment) {
        let app = cached.application();
        (HubRef::of(&app), self.assign(&app))
    }

    /// Puts `a` in the index, settles the keys it touches and queues `r`
    /// (in the urgent lane when `urgent`).
    fn apply(&self, r: HubRef, a: Assignment, urgent: bool) {
        let ours = |a: Option<&Assignment>| !matches!(a, None | Some(Assignment::NotOurs { .. }));
        let was = ours(self.index.lock().expect("never poisoned").assignment(&r));
        let switched = was != ours(Some(&a));
        let slots = self.index.lock().expect("never poisoned").set(&r, Some(a));
        // Told once the index shows it: the ManifestWork side skips what
        // the index says is this transport's ([`Hub::grpc_cluster`]).
        if switched && let Some(f) = self.on_switch.get() {
            f(&r, "transport-switch");
        }
        for (cluster, key) in slots {
            self.settle(&cluster, &key);
        }
        if urgent {
            self.queue.add_urgent(Work::App(r));
        } else {
            self.queue.add(Work::App(r));
        }
    }

    fn unassign(&self, r: &HubRef) {
        self.follow_ups.lock().expect("never poisoned").remove(r);
        let slots = self.index.lock().expect("never poisoned").set(r, None);
        for (cluster, key) in slots {
            self.settle(&cluster, &key);
        }
    }

    /// Decides what the cluster's agent must have under `key`, from every
    /// hub Application that names it (see [`Index::decide`]).
    fn settle(&self, cluster: &str, key: &ObjectKey) {
        let cs = self.cluster(cluster);
        let (decision, others) = self
            .index
            .lock()
            .expect("never poisoned")
            .decide(cluster, key);
        match decision {
            Decision::Deliver(desired) => cs.set_desired(key, desired),
            Decision::Delete { hub_uid } => cs.set_deleting(key, &hub_uid),
            Decision::Keep => {}
            Decision::Release => cs.release(key),
            Decision::Remove => {
                cs.remove(key);
                cs.forget_if_idle(key);
            }
        }
        // The others show the conflict (or its end).
        for r in others {
            self.queue.add(Work::App(r));
        }
    }

    /// The cluster the gRPC transport delivers `r` to, or refuses it for;
    /// `None` when `r` is not this transport's (as far as the index knows:
    /// a change of transport is told through [`Hub::on_transport_switch`]
    /// once the index shows it).
    pub fn grpc_cluster(&self, r: &HubRef) -> Option<String> {
        match self.index.lock().expect("never poisoned").assignment(r) {
            Some(Assignment::Deliver { cluster, .. } | Assignment::Refused { cluster, .. }) => {
                Some(cluster.clone())
            }
            Some(Assignment::NotOurs { .. }) | None => None,
        }
    }

    /// The hub Application that holds `key` on `cluster` (see
    /// [`Index::winner`]).
    pub fn winner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.index
            .lock()
            .expect("never poisoned")
            .winner(cluster, key)
    }

    /// The hub Application that owns `key` on `cluster`, whichever
    /// transport delivers it (see [`Index::owner`]).
    pub fn owner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.index
            .lock()
            .expect("never poisoned")
            .owner(cluster, key)
    }

    /// What a key the hub does not want becomes, when the agent still has
    /// it (see [`Index::removal`]).
    pub fn removal(&self, cluster: &str, key: &ObjectKey, version: &str) -> Option<Item> {
        self.index
            .lock()
            .expect("never poisoned")
            .removal(cluster, key, version)
    }
}

fn app_ref(r: &HubRef) -> ObjectRef<CachedApp> {
    ObjectRef::new(&r.name).within(&r.namespace)
}

impl Consumer for Hub {
    fn event(&self, event: &Event) {
        self.handle(event);
    }

    fn synced(&self) {
        self.reassign_all();
        tracing::info!("gRPC transport: index built from the hub's caches");
        self.synced.send_replace(true);
    }
}

/// `f` over `items` on up to as many threads as there are cores, the
/// results in the order of `items`. The calling thread takes a share too.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Below this a thread costs more than it saves.
    const MIN_PER_THREAD: usize = 512;
    let threads = threads.min(items.len() / MIN_PER_THREAD).max(1);
    if threads == 1 {
        return items.iter().map(&f).collect();
    }
    let per = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|scope| {
        let mut chunks = items.chunks(per);
        let first = chunks.next().unwrap_or_default();
        let others: Vec<_> = chunks
            .map(|c| scope.spawn(move || c.iter().map(f).collect::<Vec<R>>()))
            .collect();
        let mut out: Vec<R> = first.iter().map(f).collect();
        for h in others {
            out.extend(h.join().expect("routing does not panic"));
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::parallel_map;

    #[test]
    fn parallel_map_keeps_every_item_in_order() {
        for n in [0, 1, 511, 512, 1024, 5000] {
            let items: Vec<usize> = (0..n).collect();
            let out = parallel_map(&items, |i| i * 2);
            assert_eq!(
                out,
                items.iter().map(|i| i * 2).collect::<Vec<_>>(),
                "n = {n}"
            );
        }
    }
}
