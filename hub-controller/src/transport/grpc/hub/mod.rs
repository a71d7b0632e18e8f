//! The hub's side of the gRPC transport, apart from the streams: the index
//! fed by watches (which hub Application goes to which cluster and key), the
//! per-cluster state, and the workers that write to the hub API server
//! (status, mirrors, command completion, finalizer release).
//!
//! The desired set of each cluster is computed from the watch caches as the
//! events arrive, without any API call, so a session can compare digests as
//! soon as the caches are synced; everything that writes goes through a
//! keyed work queue whose workers run in parallel across objects.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{ManagedClusterAddOn, placement_decision_resource};
use argocd_pull_proto::v1::ObjectKey;
use argocd_pull_runtime::workqueue::WorkQueue;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

mod index;
mod mirror;
mod workers;

pub use index::{Decision, Index};
use mirror::mirror_work;

use super::GrpcConfig;
use super::cluster::{ClusterState, Item, Work};
use super::metrics::GrpcMetrics;
use crate::hub::cached::CachedApp;
use crate::route::assign::{self, Assignment, Facts, HubRef};
use crate::status::AppWriter;

/// Field manager of the read-only mirrors.
pub const MIRROR_MANAGER: &str = "argocd-pull-mirror";

/// Shared by the sessions, the event loop and the workers.
pub struct Hub {
    pub config: GrpcConfig,
    pub client: kube::Client,
    pub metrics: GrpcMetrics,
    pub index: Mutex<Index>,
    clusters: Mutex<HashMap<String, Arc<ClusterState>>>,
    pub apps: Store<CachedApp>,
    pub mirrors: Store<CachedApp>,
    addons: Store<PartialObjectMeta<ManagedClusterAddOn>>,
    decisions: Store<DynamicObject>,
    pub queue: WorkQueue<Work>,
    synced: watch::Sender<bool>,
    /// The one writer of hub Applications, shared with the ManifestWork
    /// transport.
    pub writer: Arc<AppWriter>,
    next_session: AtomicU64,
    writers: Mutex<Option<Writers>>,
    /// Applications that moved to or from this transport, for the
    /// ManifestWork controller to look at again.
    switched: Mutex<Switches>,
}

type Switches = (
    Option<tokio::sync::mpsc::UnboundedSender<HubRef>>,
    Option<tokio::sync::mpsc::UnboundedReceiver<HubRef>>,
);

struct Writers {
    apps: reflector::store::Writer<CachedApp>,
    mirrors: reflector::store::Writer<CachedApp>,
    addons: reflector::store::Writer<PartialObjectMeta<ManagedClusterAddOn>>,
    decisions: reflector::store::Writer<DynamicObject>,
}

enum Ev {
    App(watcher::Event<CachedApp>),
    Mirror(watcher::Event<CachedApp>),
    Addon(watcher::Event<PartialObjectMeta<ManagedClusterAddOn>>),
    Decision(watcher::Event<DynamicObject>),
}

impl Hub {
    pub fn new(config: GrpcConfig, client: kube::Client, metrics: GrpcMetrics) -> Arc<Self> {
        let writers = Writers {
            apps: reflector::store::Writer::new(application_resource()),
            mirrors: reflector::store::Writer::new(application_resource()),
            addons: reflector::store::Writer::default(),
            decisions: reflector::store::Writer::new(placement_decision_resource()),
        };
        Arc::new(Self {
            writer: AppWriter::new(client.clone()),
            apps: writers.apps.as_reader(),
            mirrors: writers.mirrors.as_reader(),
            addons: writers.addons.as_reader(),
            decisions: writers.decisions.as_reader(),
            writers: Mutex::new(Some(writers)),
            config,
            client,
            metrics,
            index: Mutex::default(),
            clusters: Mutex::default(),
            queue: WorkQueue::new(),
            synced: watch::channel(false).0,
            next_session: AtomicU64::new(1),
            switched: Mutex::new({
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                (Some(tx), Some(rx))
            }),
        })
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
            .or_insert_with(|| Arc::new(ClusterState::new(cluster)))
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

    /// Whether the addon of `cluster` is enabled (its ManagedClusterAddOn exists).
    pub fn addon_enabled(&self, cluster: &str) -> bool {
        self.addons
            .get(&ObjectRef::new(keys::ADDON_NAME).within(cluster))
            .is_some()
    }

    fn assign(&self, app: &Application) -> Assignment {
        let addon_enabled = |c: &str| self.addon_enabled(c);
        let decided_in = |ns: &str| -> Vec<String> {
            self.decisions
                .state_filter(|pd| pd.namespace().as_deref() == Some(ns))
                .iter()
                .flat_map(|pd| argocd_pull_apis::ocm::decided_clusters(pd))
                .collect()
        };
        assign::assign(
            app,
            &Facts {
                grpc_served: true,
                addon_enabled: &addon_enabled,
                authorization: &self.config.authorization,
                decided_in: &decided_in,
            },
        )
    }

    // -----------------------------------------------------------------------
    // The event loop: watches -> index -> desired sets

    /// Watches the hub until `shutdown`, keeping the index and the desired
    /// sets current.
    pub async fn run_index(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let Some(w) = self.writers.lock().expect("never poisoned").take() else {
            tracing::error!("the gRPC index is already running");
            return;
        };
        let ar = application_resource();
        let apps = reflector(
            w.apps,
            watcher::watcher(
                Api::<CachedApp>::all_with(self.client.clone(), &ar),
                watcher::Config::default().labels(keys::PULL_LABEL),
            ),
        )
        .default_backoff()
        .map(|e| e.map(Ev::App))
        .boxed();
        let mirrors = reflector(
            w.mirrors,
            watcher::watcher(
                Api::<CachedApp>::all_with(self.client.clone(), &ar),
                watcher::Config::default().labels(keys::MIRROR_OF),
            ),
        )
        .default_backoff()
        .map(|e| e.map(Ev::Mirror))
        .boxed();
        let addons = reflector(
            w.addons,
            watcher::watcher(
                Api::<PartialObjectMeta<ManagedClusterAddOn>>::all(self.client.clone()),
                watcher::Config::default().fields(&format!("metadata.name={}", keys::ADDON_NAME)),
            ),
        )
        .default_backoff()
        .map(|e| e.map(Ev::Addon))
        .boxed();
        let pdr = placement_decision_resource();
        let decisions = reflector(
            w.decisions,
            watcher::watcher(
                Api::<DynamicObject>::all_with(self.client.clone(), &pdr),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .map(|e| e.map(Ev::Decision))
        .boxed();
        let mut events = futures::stream::select_all([apps, mirrors, addons, decisions]);
        // Which watches have had their first full list.
        let mut listed = [false; 4];
        tokio::pin!(shutdown);
        loop {
            let ev = tokio::select! {
                _ = &mut shutdown => return,
                ev = events.next() => ev,
            };
            match ev {
                None => return,
                Some(Err(e)) => tracing::warn!(error = %e, "watch of the hub failed; retrying"),
                Some(Ok(ev)) => {
                    let (i, done) = self.handle(ev);
                    if done && !listed[i] {
                        listed[i] = true;
                        if listed.iter().all(|l| *l) {
                            self.reassign_all();
                            tracing::info!("gRPC transport: hub caches synced");
                            self.synced.send_replace(true);
                        }
                    }
                }
            }
        }
    }

    /// Applies one event; returns which watch it came from and whether it
    /// ends a full list. Until every watch has had its first full list the
    /// index is not built (nothing reads it yet): `run_index` builds it once
    /// then, instead of once per event and per list (with 10,000
    /// Applications and 1,000 clusters, tens of thousands of passes).
    fn handle(&self, ev: Ev) -> (usize, bool) {
        use watcher::Event as E;
        let synced = self.is_synced();
        match ev {
            Ev::App(e) => match e {
                E::Apply(a) | E::InitApply(a) => {
                    if synced {
                        self.reassign(&a);
                    }
                    (0, false)
                }
                E::Delete(a) => {
                    let r = HubRef::of(&a);
                    self.writer.written().forget(&r.namespace, &r.name);
                    self.unassign(&r);
                    (0, false)
                }
                E::Init => (0, false),
                E::InitDone => {
                    // Applications deleted while the watch was down.
                    let known: Vec<HubRef> = self.index.lock().expect("never poisoned").refs();
                    for r in known {
                        if self.apps.get(&app_ref(&r)).is_none() {
                            self.unassign(&r);
                        }
                    }
                    (0, true)
                }
            },
            Ev::Mirror(e) => match e {
                E::Apply(m) | E::InitApply(m) | E::Delete(m) => {
                    if let Some(work) = mirror_work(&m) {
                        if let Work::Mirror { cluster, key } = &work {
                            self.seed_mirror(cluster, key, &m);
                        }
                        self.queue.add(work);
                    }
                    (1, false)
                }
                E::Init => (1, false),
                E::InitDone => (1, true),
            },
            Ev::Addon(e) => match e {
                E::Apply(a) | E::InitApply(a) | E::Delete(a) => {
                    if synced {
                        self.reassign_where(|app| {
                            app.annotations()
                                .get(keys::MANAGED_CLUSTER)
                                .map(String::as_str)
                                == a.namespace().as_deref()
                        });
                    }
                    (2, false)
                }
                E::Init => (2, false),
                E::InitDone => {
                    if synced {
                        self.reassign_all();
                    }
                    (2, true)
                }
            },
            Ev::Decision(e) => match e {
                E::Apply(d) | E::InitApply(d) | E::Delete(d) => {
                    if synced {
                        let ns = d.namespace();
                        self.reassign_where(|app| app.namespace() == ns);
                    }
                    (3, false)
                }
                E::Init => (3, false),
                E::InitDone => {
                    if synced {
                        self.reassign_all();
                    }
                    (3, true)
                }
            },
        }
    }

    fn reassign_all(&self) {
        self.reassign_where(|_| true);
    }

    fn reassign_where(&self, filter: impl Fn(&CachedApp) -> bool) {
        for app in self.apps.state() {
            if filter(&app) {
                self.reassign(&app);
            }
        }
    }

    /// Applications that move to or from the gRPC transport (taken once).
    pub fn transport_switches(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<HubRef>> {
        self.switched.lock().expect("never poisoned").1.take()
    }

    fn reassign(&self, cached: &CachedApp) {
        let app = cached.application();
        let r = HubRef::of(&app);
        let a = self.assign(&app);
        let ours = |a: Option<&Assignment>| !matches!(a, None | Some(Assignment::NotOurs { .. }));
        let was = ours(self.index.lock().expect("never poisoned").assignment(&r));
        if was != ours(Some(&a))
            && let Some(tx) = &self.switched.lock().expect("never poisoned").0
        {
            let _ = tx.send(r.clone());
        }
        let slots = self.index.lock().expect("never poisoned").set(&r, Some(a));
        for (cluster, key) in slots {
            self.settle(&cluster, &key);
        }
        self.queue.add(Work::App(r));
    }

    fn unassign(&self, r: &HubRef) {
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
    ObjectRef::new_with(&r.name, application_resource()).within(&r.namespace)
}
