//! Every replica serves gRPC; a cluster's writes are made by one replica
//! at a time ([`rule`] says who). This is the I/O around it, on
//! `coordination.k8s.io` Leases in the hub-controller's namespace:
//!
//! - **presence** (`argocd-pull-replica-<identity>`): one per process,
//!   renewed every `renew_every`; a replica whose presence has not changed
//!   for its duration (on this process's clock) is dead, and its claims
//!   may be taken. A replica that cannot renew for `renew_deadline`
//!   (shorter than the duration) stops writing for every cluster before
//!   anyone may take over, and goes on serving its agents; once it renews
//!   again it reads back each claim it held before it writes again. (It
//!   does not exit: under a slow API server, replicas exiting and their
//!   agents reconnecting elsewhere all at once would only add load.)
//! - **claim** (`argocd-pull-cluster-<cluster>`): exists while the
//!   replica its agent is connected to holds it; written when an agent
//!   connects and when its stream ends, never renewed.
//!
//! Both are watched (one watch, by label), so whether this replica acts for
//! a cluster is answered from memory.
//!
//! - [`rule`]: who writes, what a claimer does next (pure);
//! - `view`: what this replica knows of the claims and presences, and
//!   what it concludes (alive, dead, abandoned), pure;
//! - this file: claiming and releasing a cluster;
//! - `presence`: renewing this replica's presence, suspending and resuming
//!   its writes, noticing the dead;
//! - `leases`: the watch that keeps the view.

mod leases;
mod presence;
pub mod rule;
mod view;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use tokio::sync::{Notify, mpsc, watch};

use rule::Step;
use view::{Me, View};

/// Label on both kinds of Lease: `presence` or `claim`.
pub const ROLE_LABEL: &str = "argocd-pull.io/lease";
/// The cluster a claim is for: the one annotation of every per-cluster
/// Lease of the hub's.
pub use crate::lease_records::CLUSTER_ANNOTATION;
/// The replica whose agent session asks the holder to let go.
pub const WANTED_BY_ANNOTATION: &str = "argocd-pull.io/wanted-by";
/// On a presence: where the other replicas reach this one's live endpoint
/// (`host:port`), to forward a live read of a cluster whose agent is
/// connected here.
pub const LIVE_ADDRESS_ANNOTATION: &str = "argocd-pull.io/live-address";

/// Where the Leases live and how fast presence moves.
#[derive(Clone, Debug)]
pub struct ClaimsConfig {
    pub namespace: String,
    /// This process (the leader Lease's identity).
    pub identity: String,
    /// A presence unchanged this long is dead.
    pub presence_duration: Duration,
    /// How often the presence is renewed.
    pub renew_every: Duration,
    /// Past this without a renewal, this replica stops writing (shorter
    /// than `presence_duration`).
    pub renew_deadline: Duration,
    /// A claim without a live holder this long is deleted by the leader.
    pub abandoned_after: Duration,
    /// Where the other replicas reach this one's live endpoint (its
    /// presence says so), if it serves one.
    pub live_address: Option<String>,
}

impl ClaimsConfig {
    /// 8 s presence, renewed every 2 s, writes suspended after 6 s without
    /// a renewal: a killed replica's clusters are taken over at most 8 s
    /// after its last renewal.
    pub fn new(namespace: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            identity: identity.into(),
            presence_duration: Duration::from_secs(8),
            renew_every: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(6),
            abandoned_after: Duration::from_secs(80),
            live_address: None,
        }
    }
}

/// This replica's view of the claims and presences, and its own writes.
pub struct Claims {
    api: Api<Lease>,
    config: ClaimsConfig,
    view: Mutex<View>,
    leader: AtomicBool,
    /// Clusters whose claim changed (who acts for them may have).
    changed: mpsc::UnboundedSender<String>,
    changes: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    /// Any claim changed: claimers waiting for a holder look again.
    notify: Notify,
    synced: watch::Sender<bool>,
    /// The Leases have had their first full list.
    listed: AtomicBool,
    /// The presence could not be renewed in time: no writes until it is,
    /// and the claims are read back.
    suspended: watch::Sender<bool>,
    /// One claim or release at a time per cluster.
    locks: ClusterLocks,
}

fn version_of(lease: &Lease) -> u64 {
    lease
        .resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One lock per cluster, for one claim or release at a time.
#[derive(Default)]
struct ClusterLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl ClusterLocks {
    fn of(&self, cluster: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.0
            .lock()
            .expect("never poisoned")
            .entry(cluster.to_string())
            .or_default()
            .clone()
    }
}

/// Delete options that delete only the version given.
fn delete_at(version: u64) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some(version.to_string()),
            uid: None,
        }),
        ..Default::default()
    }
}

/// `cluster`'s claim, held by `identity`.
fn claim_lease(cluster: &str, identity: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(rule::claim_name(cluster)),
            labels: Some([(ROLE_LABEL.to_string(), "claim".to_string())].into()),
            annotations: Some([(CLUSTER_ANNOTATION.to_string(), cluster.to_string())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            acquire_time: Some(now()),
            ..Default::default()
        }),
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Claims {
    pub fn new(client: kube::Client, config: ClaimsConfig) -> Arc<Self> {
        let (changed, changes) = mpsc::unbounded_channel();
        Arc::new(Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            view: Mutex::default(),
            leader: AtomicBool::new(false),
            changed,
            changes: Mutex::new(Some(changes)),
            notify: Notify::new(),
            synced: watch::channel(false).0,
            listed: AtomicBool::new(false),
            suspended: watch::channel(false).0,
            locks: ClusterLocks::default(),
        })
    }

    /// Clusters whose claim changed, for the transport to look at again
    /// (taken once).
    pub fn changes(&self) -> Option<mpsc::UnboundedReceiver<String>> {
        self.changes.lock().expect("never poisoned").take()
    }

    /// This replica leads (it then acts for unclaimed clusters).
    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::SeqCst);
    }

    /// Resolves once the Leases are listed and this replica's presence
    /// exists.
    pub async fn wait_synced(&self) {
        let _ = self.synced.subscribe().wait_for(|s| *s).await;
    }

    /// Who asks the view.
    fn me(&self) -> Me<'_> {
        Me {
            identity: &self.config.identity,
            suspended: *self.suspended.borrow(),
            presence_duration: self.config.presence_duration,
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().expect("never poisoned")
    }

    /// Whether this replica writes for `cluster` now.
    pub fn acts_for(&self, cluster: &str) -> bool {
        if *self.suspended.borrow() {
            return false;
        }
        let leader = self.leader.load(Ordering::SeqCst);
        let me = self.me();
        let mut view = self.view();
        let claim = view.claim(&me, cluster, Instant::now());
        rule::acts_for(claim, me.identity, leader)
    }

    /// Whether this replica holds `cluster`'s claim.
    pub fn holds(&self, cluster: &str) -> bool {
        self.view()
            .held_version(&self.config.identity, cluster)
            .is_some()
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// The live replica other than this one that holds `cluster`'s claim,
    /// with where its live endpoint is, if its presence says.
    pub fn live_peer(&self, cluster: &str) -> Option<(String, String)> {
        let me = self.me();
        self.view().live_peer(&me, cluster, Instant::now())
    }

    /// Whether another replica asked this one to let go of `cluster`.
    pub fn asked_to_let_go(&self, cluster: &str) -> bool {
        let me = self.me();
        self.view()
            .claim(&me, cluster, Instant::now())
            .is_some_and(|c| rule::must_let_go(c, me.identity))
    }

    /// Records a claim as read or written; newer versions only. Tells the
    /// transport when the holder changed or someone asked for it.
    fn record(&self, cluster: &str, lease: Option<&Lease>, deleted_version: Option<u64>) {
        if self.view().record(cluster, lease, deleted_version) {
            let _ = self.changed.send(cluster.to_string());
            self.notify.notify_waiters();
        }
    }

    /// Claims `cluster` for this replica's session, asking a live holder to
    /// let go; returns whether it is held, or `false` once `current` says
    /// the session is over. Waits while writes are suspended.
    pub async fn claim(&self, cluster: &str, current: impl Fn() -> bool) -> bool {
        self.wait_synced().await;
        let lock = self.locks.of(cluster);
        let name = rule::claim_name(cluster);
        loop {
            if !current() {
                return false;
            }
            if *self.suspended.borrow() {
                tokio::time::sleep(self.config.renew_every / 2).await;
                continue;
            }
            let notified = self.notify.notified();
            let outcome = self.claim_once(cluster, &name, &lock, &current).await;
            match outcome {
                Ok(true) => return true,
                Ok(false) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    tracing::warn!(%cluster, error = %e, "cannot claim the cluster; retrying")
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(self.config.renew_every / 2) => {}
            }
        }
    }

    /// One attempt of [`Claims::claim`], under the cluster's `lock`: true
    /// when the claim is held, false when it is not (yet).
    async fn claim_once(
        &self,
        cluster: &str,
        name: &str,
        lock: &tokio::sync::Mutex<()>,
        current: &impl Fn() -> bool,
    ) -> Result<bool, kube::Error> {
        let _g = lock.lock().await;
        if !current() {
            return Ok(false);
        }
        // No claim as far as the watch knows (an agent's first
        // connection, the usual case): create it without reading
        // first; one that exists after all answers 409.
        let unseen = !self.view().knows(cluster);
        if unseen && self.create_unread(cluster).await? {
            return Ok(true);
        }
        let read = self.api.get_opt(name).await?;
        self.record(cluster, read.as_ref(), None);
        // The view now holds what was read (nothing, if nothing was).
        let step = {
            let me = self.me();
            let mut view = self.view();
            rule::step(view.claim(&me, cluster, Instant::now()), me.identity)
        };
        self.take_step(cluster, name, step, read).await
    }

    /// Creates `cluster`'s claim without having read it; false when it
    /// exists after all.
    async fn create_unread(&self, cluster: &str) -> Result<bool, kube::Error> {
        match self
            .api
            .create(
                &PostParams::default(),
                &claim_lease(cluster, &self.config.identity),
            )
            .await
        {
            Ok(l) => {
                self.record(cluster, Some(&l), None);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Does what [`rule::step`] decided for `cluster`'s claim, as `read`
    /// (named `name`); true when it is held.
    async fn take_step(
        &self,
        cluster: &str,
        name: &str,
        step: Step,
        read: Option<Lease>,
    ) -> Result<bool, kube::Error> {
        match (step, read) {
            (Step::Held, _) => Ok(true),
            (Step::Create, _) => {
                let l = self
                    .api
                    .create(
                        &PostParams::default(),
                        &claim_lease(cluster, &self.config.identity),
                    )
                    .await?;
                self.record(cluster, Some(&l), None);
                Ok(true)
            }
            (Step::Take, Some(old)) => {
                let mut l = claim_lease(cluster, &self.config.identity);
                l.metadata.resource_version = old.resource_version();
                let l = self.api.replace(name, &PostParams::default(), &l).await?;
                tracing::info!(%cluster, previous = ?old.spec.and_then(|s| s.holder_identity), "took over the cluster's writes");
                self.record(cluster, Some(&l), None);
                Ok(true)
            }
            (Step::Ask { holder }, Some(mut old)) => {
                old.annotations_mut()
                    .insert(WANTED_BY_ANNOTATION.into(), self.config.identity.clone());
                let l = self.api.replace(name, &PostParams::default(), &old).await?;
                tracing::info!(%cluster, %holder, "the cluster's agent moved here: asked its previous replica to let go");
                self.record(cluster, Some(&l), None);
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    /// Lets go of `cluster` if this replica holds it and `free` still
    /// says so (no new session came meanwhile); returns whether it did.
    pub async fn release(&self, cluster: &str, free: impl Fn() -> bool) -> bool {
        let lock = self.locks.of(cluster);
        let _g = lock.lock().await;
        if !free() {
            return false;
        }
        let name = rule::claim_name(cluster);
        // First with the version the view has of this replica's own claim,
        // without reading: a claim changed since answers 409, and is read.
        let known = self.view().held_version(&self.config.identity, cluster);
        if let Some(version) = known {
            match self.api.delete(&name, &delete_at(version)).await {
                Ok(_) => {
                    self.record(cluster, None, Some(version));
                    return true;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.record(cluster, None, Some(version));
                    return true;
                }
                Err(_) => {}
            }
        }
        for _ in 0..5 {
            let read = match self.api.get_opt(&name).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(%cluster, error = %e, "cannot release the cluster; retrying");
                    tokio::time::sleep(self.config.renew_every / 2).await;
                    continue;
                }
            };
            let Some(l) = read else {
                self.record(cluster, None, None);
                return true;
            };
            if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                != Some(self.config.identity.as_str())
            {
                self.record(cluster, Some(&l), None);
                return false;
            }
            match self.api.delete(&name, &delete_at(version_of(&l))).await {
                Ok(_) => {
                    self.record(cluster, None, Some(version_of(&l)));
                    return true;
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => continue,
                Err(e) => {
                    tracing::warn!(%cluster, error = %e, "cannot release the cluster; retrying");
                    tokio::time::sleep(self.config.renew_every / 2).await;
                }
            }
        }
        false
    }
}
