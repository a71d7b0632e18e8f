//! The hub's side of the gRPC transport, apart from the streams: the index
//! fed by watches (which hub Application goes to which cluster and key), the
//! per-cluster state, and the workers that write to the hub API server
//! (status, mirrors, command completion, finalizer release).
//!
//! The desired set of each cluster is computed from the watch caches as the
//! events arrive, without any API call, so a session can compare digests as
//! soon as the caches are synced; everything that writes goes through a
//! keyed work queue whose workers run in parallel across objects.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{ManagedClusterAddOn, placement_decision_resource};
use argocd_pull_proto::content;
use argocd_pull_proto::digest::bucket_of;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMode, ObjectKey, OperationRequest, SyncOperation, operation_request,
};
use argocd_pull_runtime::workqueue::WorkQueue;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::GrpcConfig;
use super::cluster::{ClusterState, Item, Observation, Work};
use super::commands::{self, Command};
use super::metrics::GrpcMetrics;
use crate::hub::cached::CachedApp;
use crate::render::grpc as render;
use crate::route::assign::{self, Assignment, Facts, HubRef};
use crate::status::condition::condition_of;
use crate::status::observed::hub_status;
use crate::status::writer::{COMMAND_MANAGER, holds_argocd_finalizer};
use crate::status::{AppWriter, Reason};

/// Field manager of the read-only mirrors.
pub const MIRROR_MANAGER: &str = "argocd-pull-mirror";

/// Which hub Application goes where, by Application and by (cluster, key).
#[derive(Default)]
pub struct Index {
    assign: HashMap<HubRef, Assignment>,
    by_slot: HashMap<(String, ObjectKey), BTreeSet<HubRef>>,
}

impl Index {
    pub fn assignment(&self, r: &HubRef) -> Option<&Assignment> {
        self.assign.get(r)
    }

    /// The hub Application that delivers (cluster, key): the first, by
    /// namespace and name, of those assigned to deliver it.
    pub fn winner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.by_slot
            .get(&(cluster.to_string(), key.clone()))?
            .iter()
            .find(|r| matches!(self.assign.get(*r), Some(Assignment::Deliver { .. })))
            .cloned()
    }

    /// The Applications that name (cluster, key), with their assignment.
    fn at(&self, cluster: &str, key: &ObjectKey) -> Vec<(&HubRef, &Assignment)> {
        self.by_slot
            .get(&(cluster.to_string(), key.clone()))
            .into_iter()
            .flatten()
            .filter_map(|r| self.assign.get(r).map(|a| (r, a)))
            .collect()
    }

    pub fn has_slot(&self, cluster: &str, key: &ObjectKey) -> bool {
        self.by_slot
            .get(&(cluster.to_string(), key.clone()))
            .is_some_and(|s| !s.is_empty())
    }

    /// Records `a` for `r`; returns the slots whose decision may change.
    fn set(&mut self, r: &HubRef, a: Option<Assignment>) -> Vec<(String, ObjectKey)> {
        let old = match a {
            Some(a) => self.assign.insert(r.clone(), a),
            None => self.assign.remove(r),
        };
        let old_slot = old
            .as_ref()
            .and_then(|o| o.slot())
            .map(|(c, k)| (c.to_string(), k.clone()));
        let new_slot = self
            .assign
            .get(r)
            .and_then(|n| n.slot())
            .map(|(c, k)| (c.to_string(), k.clone()));
        if old_slot != new_slot {
            if let Some(s) = &old_slot
                && let Some(set) = self.by_slot.get_mut(s)
            {
                set.remove(r);
                if set.is_empty() {
                    self.by_slot.remove(s);
                }
            }
            if let Some(s) = &new_slot {
                self.by_slot.entry(s.clone()).or_default().insert(r.clone());
            }
        }
        old_slot.into_iter().chain(new_slot).collect()
    }
}

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
                    let known: Vec<HubRef> = self
                        .index
                        .lock()
                        .expect("never poisoned")
                        .assign
                        .keys()
                        .cloned()
                        .collect();
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
    /// hub Application that names it.
    fn settle(&self, cluster: &str, key: &ObjectKey) {
        let cs = self.cluster(cluster);
        let index = self.index.lock().expect("never poisoned");
        let at = index.at(cluster, key);
        let winner = at
            .iter()
            .find(|(_, a)| matches!(a, Assignment::Deliver { .. }));
        match winner {
            Some((
                _,
                Assignment::Deliver {
                    desired, deleting, ..
                },
            )) => {
                if *deleting {
                    cs.set_deleting(key, &desired.hub_uid);
                } else {
                    cs.set_desired(key, desired.clone());
                }
            }
            _ if at
                .iter()
                .any(|(_, a)| matches!(a, Assignment::Refused { .. })) =>
            {
                // Keep what the agent has until the refusal is fixed.
            }
            _ if !at.is_empty() => cs.release(key),
            _ => {
                cs.remove(key);
                cs.forget_if_idle(key);
            }
        }
        // Losers of a conflict show it.
        for (r, _) in at.iter().skip(1) {
            self.queue.add(Work::App((*r).clone()));
        }
    }

    /// What a key the hub does not want becomes, when the agent still has
    /// it (a digest repair): released if a hub Application now delivers it
    /// by ManifestWork, left alone while a refusal stands, deleted otherwise.
    pub fn removal(&self, cluster: &str, key: &ObjectKey, version: &str) -> Option<Item> {
        let index = self.index.lock().expect("never poisoned");
        let at = index.at(cluster, key);
        if let Some((
            _,
            Assignment::Deliver {
                desired,
                deleting: true,
                ..
            },
        )) = at
            .iter()
            .find(|(_, a)| matches!(a, Assignment::Deliver { deleting: true, .. }))
        {
            return Some(Item::Delete {
                hub_uid: desired.hub_uid.clone(),
            });
        }
        if at
            .iter()
            .any(|(_, a)| matches!(a, Assignment::Refused { .. } | Assignment::Deliver { .. }))
        {
            return None;
        }
        let hub_uid = assign::uid_of_version(version)?.to_string();
        Some(if at.is_empty() {
            Item::Delete { hub_uid }
        } else {
            Item::Release { hub_uid }
        })
    }

    /// A mirror seen on the hub is part of the hub's replica of the
    /// observed set until the agent reports it again (after a restart).
    fn seed_mirror(&self, cluster: &str, key: &ObjectKey, mirror: &CachedApp) {
        let Some(version) = mirror.annotations().get(render::MIRROR_VERSION) else {
            return;
        };
        let cs = self.cluster(cluster);
        let mut inner = cs.lock();
        inner
            .observed
            .entry(key.clone())
            .or_insert_with(|| Observation::Mirrored {
                version: version.clone(),
            });
    }

    // -----------------------------------------------------------------------
    // Workers

    /// Runs `n` workers until the queue is closed.
    pub async fn run_workers(self: Arc<Self>, n: usize) {
        let workers: Vec<_> = (0..n.max(1))
            .map(|_| {
                let hub = self.clone();
                tokio::spawn(async move {
                    while let Some(work) = hub.queue.next().await {
                        if let Err(e) = hub.reconcile(&work).await {
                            tracing::warn!(?work, error = %e, "gRPC transport: write failed; retrying");
                            hub.queue.add_after(work.clone(), Duration::from_secs(2));
                        }
                        hub.queue.done(&work);
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
    }

    async fn reconcile(&self, work: &Work) -> Result<(), kube::Error> {
        self.wait_synced().await;
        match work {
            Work::App(r) => self.reconcile_app(r).await,
            Work::Mirror { cluster, key } => self.reconcile_mirror(cluster, key).await,
        }
    }

    async fn reconcile_app(&self, r: &HubRef) -> Result<(), kube::Error> {
        let Some(cached) = self.apps.get(&app_ref(r)) else {
            return Ok(());
        };
        if self.writer.behind(&cached.metadata) {
            // Decided again when the echo of our last write arrives.
            return Ok(());
        }
        let app = cached.application();
        let assignment = self
            .index
            .lock()
            .expect("never poisoned")
            .assignment(r)
            .cloned();
        let (cluster, key, reason, message) = match assignment {
            None | Some(Assignment::NotOurs { .. }) => return Ok(()),
            Some(Assignment::Refused {
                cluster,
                key,
                reason,
                message,
            }) => (cluster, key, Some(reason), message),
            Some(Assignment::Deliver {
                cluster,
                key,
                deleting,
                ..
            }) => {
                let cs = self.cluster(&cluster);
                if deleting {
                    return self.finalize(&app, &cs, &key).await;
                }
                let winner = self
                    .index
                    .lock()
                    .expect("never poisoned")
                    .winner(&cluster, &key);
                if winner.as_ref() != Some(r) {
                    let other = winner.map(|w| w.to_string()).unwrap_or_default();
                    let msg = format!(
                        "Application {}/{} on cluster {cluster} is already delivered for {other}: rename this Application or change its {} annotation",
                        key.namespace,
                        key.name,
                        keys::MANAGED_CLUSTER_APP_NAMESPACE
                    );
                    (cluster, key, Some(Reason::SpokeConflict), msg)
                } else if cs.mode() == Some(AgentMode::Autonomous) {
                    let msg = format!(
                        "the agent of cluster {cluster} runs in autonomous mode: its Applications are defined on the cluster; deliver this one by ManifestWork (annotation {}: manifestwork) or run the agent in managed mode",
                        keys::TRANSPORT
                    );
                    (cluster, key, Some(Reason::AutonomousCluster), msg)
                } else {
                    let rejected = cs.lock().rejected.get(&key).cloned();
                    match rejected {
                        Some(m) => (
                            cluster,
                            key,
                            Some(Reason::RejectedByAgent),
                            format!("the agent refused it: {m}"),
                        ),
                        None => (cluster, key, None, String::new()),
                    }
                }
            }
        };
        let cs = self.cluster(&cluster);
        if reason.is_none() {
            self.commands(&app, Work::App(r.clone()), &cs, &key).await?;
        }
        let observed = match cs.lock().observed.get(&key) {
            Some(Observation::Observed { report, .. }) => {
                serde_json::from_slice::<Value>(&report.status_json).ok()
            }
            _ => None,
        };
        let condition = reason.map(|r| format!("{r}: {message}"));
        let current = app.data.get("status").cloned().unwrap_or(Value::Null);
        if observed.is_none() && condition.is_none() && condition_of(&current).is_none() {
            // Nothing reported yet and nothing wrong: nothing to write.
            return Ok(());
        }
        let status = hub_status(&current, observed.as_ref(), condition.clone());
        if status == current {
            return Ok(());
        }
        let newly_refused = condition.is_some() && condition_of(&current) != condition.as_deref();
        if self
            .writer
            .write_status(&app, &status, None)
            .await?
            .is_none()
        {
            return Ok(());
        }
        self.metrics.status_writes.inc();
        if let (true, Some(reason)) = (newly_refused, reason) {
            tracing::warn!(%cluster, namespace = %r.namespace, name = %r.name, %reason, %message, "not delivered");
            self.metrics.refuse(&cluster, reason.as_str());
            self.writer
                .event(&app, EventType::Warning, reason.as_str(), &message)
                .await;
        }
        Ok(())
    }

    /// A deleting hub Application: its Argo CD finalizers are released once
    /// the agent has reported the spoke copy gone after deleting it.
    async fn finalize(
        &self,
        app: &Application,
        cs: &ClusterState,
        key: &ObjectKey,
    ) -> Result<(), kube::Error> {
        if !holds_argocd_finalizer(app) {
            return Ok(());
        }
        let gone_for = cs.lock().gone.get(key).cloned();
        if gone_for.as_deref() != app.metadata.uid.as_deref() {
            return Ok(());
        }
        self.writer.release_finalizers(app).await
    }

    /// Stamps, sends and completes the sync and refresh commands `app`
    /// (a hub Application or a mirror) carries.
    async fn commands(
        &self,
        app: &Application,
        owner: Work,
        cs: &ClusterState,
        key: &ObjectKey,
    ) -> Result<(), kube::Error> {
        let refresh_id = cs
            .lock()
            .ops
            .iter()
            .find(|(_, op)| {
                op.owner == owner
                    && matches!(op.request.kind, Some(operation_request::Kind::Refresh(_)))
            })
            .map(|(id, _)| id.clone());
        let plan = commands::commands(app, refresh_id.as_deref());
        if let Some(patch) = plan.stamp {
            // Our own write brings the Application back here.
            self.writer.patch(app, COMMAND_MANAGER, &patch).await?;
            return Ok(());
        }
        let ids: Vec<String> = plan.ready.iter().map(|(id, _)| id.clone()).collect();
        cs.retain_ops(&owner, &ids);
        for (id, command) in plan.ready {
            let outcome = cs.lock().ops.get(&id).and_then(|op| op.outcome.clone());
            match outcome {
                None => {
                    let kind = match &command {
                        Command::Sync(op) => operation_request::Kind::Sync(SyncOperation {
                            operation_json: content::canonical(op),
                        }),
                        Command::Refresh(kind) => operation_request::Kind::Refresh(
                            argocd_pull_proto::v1::RefreshRequest { kind: *kind as i32 },
                        ),
                    };
                    let request = OperationRequest {
                        operation_id: id.clone(),
                        key: Some(key.clone()),
                        kind: Some(kind),
                    };
                    if cs.add_op(request, owner.clone()) {
                        tracing::debug!(cluster = %cs.name, id, "command queued for the agent");
                    }
                }
                Some((outcome, message)) => {
                    let Some(patch) = commands::completion_patch(app, &id, &command) else {
                        cs.op_done(&id);
                        continue;
                    };
                    // Changed meanwhile (None): decided again from its next version.
                    if self
                        .writer
                        .patch(app, COMMAND_MANAGER, &patch)
                        .await?
                        .is_some()
                    {
                        cs.op_done(&id);
                        let what = match command {
                            Command::Sync(_) => "sync",
                            Command::Refresh(_) => "refresh",
                        };
                        if outcome == AckOutcome::Rejected {
                            tracing::warn!(cluster = %cs.name, id, %message, "the agent refused a {what}");
                            self.writer
                                .event(
                                    app,
                                    EventType::Warning,
                                    "CommandRejected",
                                    &format!(
                                        "the agent of cluster {} refused the {what}: {message}",
                                        cs.name
                                    ),
                                )
                                .await;
                        } else {
                            tracing::info!(cluster = %cs.name, id, ?outcome, "{what} handed over to the spoke");
                        }
                    }
                    // One write per pass: the next one reads the new version.
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn reconcile_mirror(&self, cluster: &str, key: &ObjectKey) -> Result<(), kube::Error> {
        let cs = self.cluster(cluster);
        let cached = self
            .mirrors
            .get(&ObjectRef::new_with(&key.name, application_resource()).within(cluster));
        let cached_rv = cached
            .as_ref()
            .and_then(|m| m.metadata.resource_version.clone());
        if self.writer.written().behind_key(
            &(cluster.to_string(), key.name.clone()),
            cached_rv.as_deref(),
        ) {
            // Decided again when the echo of our last write arrives.
            return Ok(());
        }
        let current = cached.map(|m| m.application());
        let api: Api<Application> =
            Api::namespaced_with(self.client.clone(), cluster, &application_resource());
        let source = format!("{}/{}", key.namespace, key.name);
        let is_ours = |m: &Application| {
            m.annotations().get(keys::MIRROR_SOURCE) == Some(&source)
                && m.labels().get(keys::MIRROR_OF).map(String::as_str) == Some(cluster)
        };
        let observation = cs.lock().observed.get(key).cloned();
        match observation {
            Some(Observation::Observed { version, report }) => {
                let app: Value =
                    serde_json::from_slice(&report.application_json).unwrap_or_default();
                let status: Value = serde_json::from_slice(&report.status_json).unwrap_or_default();
                let wanted = render::mirror(cluster, key, &app, &status, &version);
                if current.is_none() {
                    // The mirror cache sees only mirrors: a hub Application
                    // of that name without our label is someone else's and
                    // must not be taken over.
                    if let Some(other) = api.get_opt(&key.name).await?
                        && !is_ours(&other)
                    {
                        let message = format!(
                            "cluster {cluster}'s Application {source} is not mirrored: this Application has its name in namespace {cluster}; rename one of them"
                        );
                        tracing::warn!(%cluster, %source, "a hub Application that is not this mirror has its name; not mirrored");
                        self.writer
                            .event(&other, EventType::Warning, "MirrorNameTaken", &message)
                            .await;
                        return Ok(());
                    }
                }
                if let Some(m) = &current {
                    if !is_ours(m) {
                        tracing::warn!(%cluster, %source, "a hub Application that is not this mirror has its name; not mirrored");
                        return Ok(());
                    }
                    if render::mirror_matches(m, &wanted) {
                        return self
                            .commands(
                                m,
                                Work::Mirror {
                                    cluster: cluster.into(),
                                    key: key.clone(),
                                },
                                &cs,
                                key,
                            )
                            .await;
                    }
                }
                let applied = api
                    .patch(
                        &key.name,
                        &PatchParams::apply(MIRROR_MANAGER).force(),
                        &Patch::Apply(&wanted),
                    )
                    .await?;
                self.writer.written().record(&applied.metadata);
                self.metrics.status_writes.inc();
                // Fields someone else added to the spec are not the
                // mirror's: take them out (server-side apply keeps them).
                let have = serde_json::to_value(&applied).unwrap_or_default();
                if let Some(diff) = content::merge_diff(
                    have.get("spec").unwrap_or(&Value::Null),
                    wanted.get("spec").unwrap_or(&Value::Null),
                ) {
                    let patch = json!({ "metadata": { "resourceVersion": applied.resource_version() }, "spec": diff });
                    match api
                        .patch(
                            &key.name,
                            &PatchParams::apply(MIRROR_MANAGER),
                            &Patch::Merge(patch),
                        )
                        .await
                    {
                        Ok(m) => self.writer.written().record(&m.metadata),
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Some(Observation::Gone) => {
                cs.lock().observed.remove(key);
                if let Some(m) = current.filter(|m| is_ours(m)) {
                    let dp = DeleteParams {
                        preconditions: Some(kube::api::Preconditions {
                            uid: m.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match api.delete(&key.name, &dp).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                    self.writer.written().forget(cluster, &key.name);
                    tracing::info!(%cluster, %source, "spoke Application gone; mirror deleted");
                }
                Ok(())
            }
            Some(Observation::Mirrored { .. }) => {
                // Known from the hub only (after a restart): the spec must
                // still be what the mirror was written with, else the agent
                // is asked for the Application again.
                if let Some(m) = current.filter(|m| is_ours(m)) {
                    let spec_hash = m.data.get("spec").map(content::hash).unwrap_or_default();
                    if m.annotations().get(keys::SPEC_HASH) != Some(&spec_hash) {
                        cs.lock().observed.remove(key);
                        cs.request_resync(bucket_of(key));
                    }
                    self.commands(
                        &m,
                        Work::Mirror {
                            cluster: cluster.into(),
                            key: key.clone(),
                        },
                        &cs,
                        key,
                    )
                    .await?;
                }
                Ok(())
            }
            None => Ok(()),
        }
    }
}

fn app_ref(r: &HubRef) -> ObjectRef<CachedApp> {
    ObjectRef::new_with(&r.name, application_resource()).within(&r.namespace)
}

/// The mirror work of a mirror seen on the hub.
fn mirror_work(m: &CachedApp) -> Option<Work> {
    let cluster = m.labels().get(keys::MIRROR_OF)?.clone();
    let (ns, name) = m.annotations().get(keys::MIRROR_SOURCE)?.split_once('/')?;
    Some(Work::Mirror {
        cluster,
        key: ObjectKey {
            namespace: ns.into(),
            name: name.into(),
        },
    })
}
