//! The hub's side of the gRPC transport, apart from the streams, as parts
//! that each own their state:
//!
//! - [`Routes`]: the index fed by watches (which hub Application goes to
//!   which cluster and key) and each cluster's desired set, computed from
//!   the watch caches as the events arrive, without any API call, so a
//!   session can compare digests as soon as the caches are synced;
//! - [`Clusters`]: the per-cluster state the sessions move messages in
//!   and out of;
//! - [`Workers`]: everything that writes to the hub API server (status,
//!   commands through the [`CommandRelay`], finalizer release, the
//!   [`Mirrors`]), one keyed work queue whose workers run in parallel
//!   across objects;
//! - [`Acting`]: with several replicas, which clusters this one writes for;
//! - [`Holding`]: the record of what each agent holds.
//!
//! [`Hub`] puts them together, feeds them the watch events and is what
//! sessions, revocation and the server talk to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use argocd_pull_apis::ocm::ManagedClusterAddOn;
use argocd_pull_proto::v1::ObjectKey;
use argocd_pull_runtime::workqueue::WorkQueue;
use kube::ResourceExt;
use kube::runtime::watcher;
use tokio::sync::watch;

mod admission;
mod claimed;
mod clusters;
mod fleet;
mod granted;
mod holding;
mod index;
mod mirror;
mod parts;
mod projects;
mod relay;
mod routes;
mod workers;

pub use admission::run_deny_list;
pub use claimed::Acting;
pub use clusters::Clusters;
pub use granted::Granted;
pub use holding::Holding;
pub use index::{Decision, Index};
pub use mirror::Mirrors;
pub use parts::{HubParts, MakeTrees};
pub use relay::CommandRelay;
pub use routes::{Routes, Switches};
pub use workers::Workers;

use mirror::mirror_work;

use super::claims::Claims;
use super::cluster::{ClusterState, Item, Work};
use super::config::GrpcConfig;
use super::metrics::GrpcMetrics;
use crate::status::AppWriter;
use crate::transport::grpc::assign::HubRef;
use crate::watch::caches::{self, Caches};
use crate::watch::watches::{Consumer, Event};

/// Field manager of the read-only mirrors.
pub const MIRROR_MANAGER: &str = "argocd-pull-mirror";

/// Shared by the sessions, the event loop and the workers.
pub struct Hub {
    /// This hub, for the tasks it starts from a watch event.
    me: std::sync::Weak<Hub>,
    pub config: GrpcConfig,
    pub client: kube::Client,
    pub metrics: GrpcMetrics,
    /// The hub's one set of caches, shared with the ManifestWork transport.
    caches: Caches,
    /// The one writer of hub Applications, shared with the ManifestWork
    /// transport.
    pub writer: Arc<AppWriter>,
    next_session: AtomicU64,
    routes: Arc<Routes>,
    clusters: Arc<Clusters>,
    writing: Writing,
    offers: Offers,
}

/// The parts that write to the hub API server, and what decides what they
/// may write: built together ([`HubParts`]), each consulting the others.
struct Writing {
    /// What the workers write; sessions add to it with [`Hub::enqueue`].
    queue: WorkQueue<Work>,
    workers: Arc<Workers>,
    acting: Arc<Acting>,
    holding: Arc<Holding>,
    /// The record of what the hub authorized, as the leader keeps it
    /// ([`crate::authorized`]), with what this replica delivered.
    granted: Arc<Granted>,
}

/// What sessions are offered beyond Applications: the cluster's
/// AppProjects, the trees and the live views.
struct Offers {
    /// Counts the changes of AppProjects and credential Secrets, for the
    /// sessions that keep them on their clusters ([`Hub::project_set`]).
    projects_epoch: watch::Sender<u64>,
    /// The writer of the hub copies' trees for argocd-server, when the hub
    /// writes them (`--argocd-redis`): agents are then offered `trees`.
    trees: Option<Arc<crate::status::trees::Trees>>,
    /// The live endpoint's URL when it serves argocd-server
    /// (`--live-addr`): agents are then offered `live-views`.
    live_url: Option<String>,
}

impl Hub {
    /// Queues `work` for the writers (a hub Application to look at again,
    /// or a mirror).
    pub fn enqueue(&self, work: Work) {
        self.writing.queue.add(work);
    }

    /// How much work waits for the writers.
    pub fn queued(&self) -> usize {
        self.writing.queue.len()
    }

    /// Stops the writers once what is queued is done (the server's end).
    pub fn close_queue(&self) {
        self.writing.queue.close();
    }

    /// The agent mode `cluster` is configured for (its
    /// AddOnDeploymentConfig), as the caches show it.
    pub fn configured_mode(
        &self,
        cluster: &str,
    ) -> Option<Result<crate::watch::mode::Configured, String>> {
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
        self.clusters.get(cluster)
    }

    /// The state of `cluster` if there is one (a name nobody uses is not
    /// given one).
    pub fn find_cluster(&self, cluster: &str) -> Option<Arc<ClusterState>> {
        self.clusters.find(cluster)
    }

    pub fn clusters(&self) -> Vec<Arc<ClusterState>> {
        self.clusters.all()
    }

    /// Resolves once every watch has its first full list (and the index is
    /// built from them).
    pub async fn wait_synced(&self) {
        self.routes.wait_built().await;
    }

    pub fn is_synced(&self) -> bool {
        self.routes.is_built()
    }

    /// Runs `n` workers until the queue is closed.
    pub async fn run_workers(self: Arc<Self>, n: usize) {
        self.writing.workers.clone().run(n).await;
    }

    // -----------------------------------------------------------------------
    // The hub's watch events -> the parts

    /// Applies one event of the hub's watches. Until every watch has had
    /// its first full list the index is not built (nothing reads it yet):
    /// [`Consumer::synced`] builds it once then.
    fn handle(&self, ev: &Event) {
        use watcher::Event as E;
        let synced = self.is_synced();
        match ev {
            Event::App(e) => {
                if let E::Delete(a) = e {
                    let r = HubRef::of(a);
                    self.writer.written().forget(&r.namespace, &r.name);
                }
                self.routes.app_event(e);
            }
            // Revocation (see `admission`): a cluster that left
            // OCM is cut off at once; one whose addon was disabled once its
            // agent has let go of the Applications moving to ManifestWork.
            Event::Cluster(E::Delete(mc)) => {
                self.revoke(&mc.name_any(), "its ManagedCluster was deleted");
                self.writing.holding.forget_holders(&mc.name_any());
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
                        self.writing.workers.mirrors.seed(cluster, key, m);
                    }
                    self.writing.queue.add(work);
                }
            }
            // Until then the index is not built at all.
            _ if !synced => {}
            Event::Decision(E::Apply(d) | E::InitApply(d) | E::Delete(d)) => {
                let ns = d.namespace();
                self.routes.reassign_where(|app| app.namespace() == ns);
            }
            // A project changed: each of its Applications is decided again
            // (one no longer allowed keeps its copy on the cluster as it was).
            Event::Project(E::Apply(p) | E::InitApply(p) | E::Delete(p)) => {
                let name = p.name_any();
                self.routes
                    .reassign_where(|app| caches::uses_project(app, &name));
                self.project_or_credential_changed();
            }
            Event::Credential(E::Apply(_) | E::Delete(_) | E::InitDone) => {
                self.project_or_credential_changed()
            }
            // A list again after the watch was down: anything may have changed.
            Event::Decision(E::InitDone) | Event::Project(E::InitDone) => {
                self.routes.reassign_all();
                self.project_or_credential_changed();
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
                    self.routes.reassign_targeting(&cluster);
                }
            }
            E::Delete(a) => {
                let cluster = a.namespace().unwrap_or_default();
                if synced {
                    self.routes.reassign_targeting(&cluster);
                }
                if let Some(hub) = self.me.upgrade() {
                    hub.revoke_once_released(cluster, "the argocd-pull addon was disabled");
                }
            }
            // A list again after the watch was down: anything may have changed.
            E::InitDone if synced => {
                self.routes.reassign_all();
                self.project_or_credential_changed();
            }
            _ => {}
        }
    }

    // -----------------------------------------------------------------------
    // What the sessions and the ManifestWork transport ask

    /// See [`Routes::grpc_cluster`].
    pub fn grpc_cluster(&self, r: &HubRef) -> Option<String> {
        self.routes.grpc_cluster(r)
    }

    /// See [`Routes::winner`].
    pub fn winner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.routes.winner(cluster, key)
    }

    /// See [`Routes::owner`].
    pub fn owner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.routes.owner(cluster, key)
    }

    /// See [`Routes::removal`].
    pub fn removal(&self, cluster: &str, key: &ObjectKey, version: &str) -> Option<Item> {
        self.routes.removal(cluster, key, version)
    }

    /// See [`Mirrors::taken`].
    pub fn mirror_taken(&self, cluster: &str, key: &ObjectKey) -> bool {
        self.writing.workers.mirrors.taken(cluster, key)
    }

    // -----------------------------------------------------------------------
    // Several replicas: see [`Acting`] and [`Holding`]

    pub fn claims(&self) -> Option<&Arc<Claims>> {
        self.writing.acting.claims()
    }

    /// Whether this replica writes for `cluster` (always, with one replica).
    pub fn acts_for(&self, cluster: &str) -> bool {
        self.writing.acting.acts_for(cluster)
    }

    /// See [`Acting::claim_for`].
    pub fn claim_for(&self, cluster: &str, cs: &Arc<ClusterState>, id: u64) {
        self.writing.acting.claim_for(cluster, cs, id);
    }

    /// See [`Acting::session_ended`].
    pub fn session_ended(&self, cluster: &str, cs: &Arc<ClusterState>) {
        self.writing.acting.session_ended(cluster, cs);
    }

    /// See [`Acting::follow_claims`].
    pub async fn follow_claims(self: Arc<Self>) {
        self.writing.acting.clone().follow_claims().await;
    }

    /// See [`Acting::requeue_all`].
    pub fn requeue_all(&self) {
        self.writing.acting.requeue_all();
    }

    pub fn trees(&self) -> Option<&Arc<crate::status::trees::Trees>> {
        self.offers.trees.as_ref()
    }

    /// The live endpoint's URL, when it serves.
    pub fn live_url(&self) -> Option<&str> {
        self.offers.live_url.as_deref()
    }

    /// What this hub offers agents: every capability of the release,
    /// `trees` when it writes them and `live-views` (with `live-credits`
    /// and `terminal`) when its live endpoint serves.
    pub fn offer(&self) -> argocd_pull_proto::version::HubOffer {
        let mut offer = argocd_pull_proto::version::HubOffer {
            heartbeat: self.config.heartbeat,
            heartbeat_min: self.config.heartbeat_min,
            ..Default::default()
        };
        if self.live_url().is_some() {
            offer
                .capabilities
                .insert(argocd_pull_proto::version::CAPABILITY_LIVE_VIEWS.to_string());
            offer
                .capabilities
                .insert(argocd_pull_proto::version::CAPABILITY_LIVE_CREDITS.to_string());
            offer
                .capabilities
                .insert(argocd_pull_proto::version::CAPABILITY_TERMINAL.to_string());
        }
        if self.trees().is_some() {
            offer
                .capabilities
                .insert(argocd_pull_proto::version::CAPABILITY_TREES.to_string());
        }
        offer
    }

    /// See [`Granted::owned_by`].
    pub fn granted_to(&self, cluster: &str, key: &ObjectKey, hub_uid: Option<&str>) -> bool {
        self.writing.granted.owned_by(cluster, key, hub_uid)
    }

    /// See [`Holding::held_by`].
    pub fn held_by(&self, cluster: &str, key: &ObjectKey) -> Option<String> {
        self.writing.holding.held_by(cluster, key)
    }

    /// See [`Holding::keep_holders`].
    pub async fn keep_holders(self: Arc<Self>) {
        self.writing.holding.clone().keep_holders().await;
    }
}

impl Consumer for Hub {
    fn event(&self, event: &Event) {
        self.handle(event);
    }

    fn synced(&self) {
        self.routes.build();
        tracing::info!("gRPC transport: index built from the hub's caches");
    }
}
