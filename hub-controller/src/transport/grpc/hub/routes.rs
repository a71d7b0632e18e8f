//! The hub's watch events -> the index -> each cluster's desired set: which
//! hub Application goes to which cluster and key, decided from the caches
//! as the events arrive (no API call), and what each key must be on its
//! agent. What needs a write is queued for the [workers](super::workers).

use std::sync::{Arc, Mutex};

use argocd_pull_apis::argocd::Application;
use argocd_pull_proto::v1::ObjectKey;
use argocd_pull_runtime::workqueue::WorkQueue;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio::sync::watch;

use super::clusters::Clusters;
use super::index::{Decision, HeldBy, Index};
use crate::authorized::{Now, SpokeKey};
use crate::route::authz::Authorization;
use crate::transport::grpc::assign::{self, Assignment, Facts, HubRef};
use crate::transport::grpc::cluster::{Item, Work};
use crate::watch::cached::CachedApp;
use crate::watch::caches::{self, Caches};

/// Where the hub tells of each Application that moves to or from the gRPC
/// transport: the Application, and the trigger its ManifestWork reconcile
/// is counted under.
pub type Switches = tokio::sync::mpsc::UnboundedSender<(HubRef, &'static str)>;

/// The index and what keeps it: the only part of the hub that changes it.
pub struct Routes {
    index: Mutex<Index>,
    /// Told of Applications that move to or from this transport, for the
    /// ManifestWork controller to look at again (while it runs).
    switches: Option<Switches>,
    /// Whether the index is built (every watch had its first full list).
    built: watch::Sender<bool>,
    caches: Caches,
    authorization: Authorization,
    clusters: Arc<Clusters>,
    queue: WorkQueue<Work>,
}

impl Routes {
    pub fn new(
        caches: Caches,
        authorization: Authorization,
        clusters: Arc<Clusters>,
        queue: WorkQueue<Work>,
        switches: Option<Switches>,
    ) -> Self {
        Self {
            index: Mutex::default(),
            switches,
            built: watch::channel(false).0,
            caches,
            authorization,
            clusters,
            queue,
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().expect("never poisoned")
    }

    /// Builds the index from the caches, once every watch has its first
    /// full list (instead of once per event and per list: with 10,000
    /// Applications and 1,000 clusters, tens of thousands of passes).
    pub fn build(&self) {
        self.reassign_all();
        self.built.send_replace(true);
    }

    /// Whether the index is built ([`Routes::build`]).
    pub fn is_built(&self) -> bool {
        *self.built.borrow()
    }

    /// Resolves once the index is built.
    pub async fn wait_built(&self) {
        let mut rx = self.built.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Tells of `r` on [`Switches`]; nobody listening is no error (the
    /// ManifestWork side has ended).
    fn switched(&self, r: &HubRef, trigger: &'static str) {
        if let Some(s) = &self.switches {
            let _ = s.send((r.clone(), trigger));
        }
    }

    /// From now on keys are decided with who the agents hold them for.
    pub fn set_held_by(&self, held_by: HeldBy) {
        self.index().set_held_by(held_by);
    }

    /// An event of the hub Applications' watch. Until the index is built
    /// only deletions count.
    pub fn app_event(&self, ev: &watcher::Event<CachedApp>) {
        use watcher::Event as E;
        match ev {
            E::Delete(a) => self.unassign(&HubRef::of(a)),
            E::InitDone => {
                // Applications deleted while the watch was down.
                let known: Vec<HubRef> = self.index().refs();
                for r in known {
                    if self.caches.apps.get(&app_ref(&r)).is_none() {
                        self.unassign(&r);
                    }
                }
            }
            E::Apply(a) | E::InitApply(a) if self.is_built() => {
                let (r, assignment) = self.route(a);
                self.apply(r, assignment);
            }
            _ => {}
        }
    }

    pub fn reassign_all(&self) {
        self.reassign_where(|_| true);
    }

    pub fn reassign_targeting(&self, cluster: &str) {
        self.reassign_where(|app| caches::targets(app, cluster));
    }

    pub fn reassign_where(&self, filter: impl Fn(&CachedApp) -> bool) {
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
            self.apply(r, a);
        }
    }

    fn assign(&self, app: &Application) -> Assignment {
        assign::assign(
            app,
            &Facts {
                grpc_served: true,
                authorization: &self.authorization,
                world: &self.caches,
            },
        )
    }

    /// Where `cached` goes (pure: reads the caches, changes nothing).
    fn route(&self, cached: &CachedApp) -> (HubRef, Assignment) {
        let app = cached.application();
        (HubRef::of(&app), self.assign(&app))
    }

    /// Puts `a` in the index, settles the keys it touches and queues `r`.
    fn apply(&self, r: HubRef, a: Assignment) {
        let ours = |a: Option<&Assignment>| !matches!(a, None | Some(Assignment::NotOurs { .. }));
        let was = ours(self.index().assignment(&r));
        let switched = was != ours(Some(&a));
        let slots = self.index().set(&r, Some(a));
        // Told once the index shows it: the ManifestWork side skips what
        // the index says is this transport's ([`Routes::grpc_cluster`]).
        if switched {
            self.switched(&r, "transport-switch");
        }
        for (cluster, key) in slots {
            self.settle(&cluster, &key);
        }
        self.queue.add(Work::App(r));
    }

    fn unassign(&self, r: &HubRef) {
        let slots = self.index().set(r, None);
        for (cluster, key) in slots {
            self.settle(&cluster, &key);
        }
    }

    /// Decides what the cluster's agent must have under `key`, from every
    /// hub Application that names it (see [`Index::decide`]).
    fn settle(&self, cluster: &str, key: &ObjectKey) {
        let cs = self.clusters.get(cluster);
        let (decision, others) = self.index().decide(cluster, key);
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

    /// The recorded holder of `key` on `cluster` changed: the key is
    /// decided again, and every Application that names it is looked at
    /// again (by the ManifestWork transport too) when its owner changed.
    pub fn holder_changed(&self, cluster: &str, key: &ObjectKey) {
        let named = self.index().reelect(cluster, key);
        if named.is_empty() {
            return;
        }
        self.settle(cluster, key);
        for r in named {
            self.switched(&r, "holder-change");
            self.queue.add(Work::App(r));
        }
    }

    /// What this transport decides now for each of `keys` on `cluster`, as
    /// the record of what the hub authorized takes it
    /// ([`crate::authorized::next`]): the grant of the copy delivered now,
    /// the refused hub Applications whose earlier copy stays, or nothing.
    pub fn grants_now(
        &self,
        cluster: &str,
        keys: impl IntoIterator<Item = ObjectKey>,
    ) -> Vec<(SpokeKey, Now)> {
        let index = self.index();
        keys.into_iter()
            .map(|key| {
                let now = match index.decide(cluster, &key).0 {
                    Decision::Deliver(d) => Now::Authorized((*d.grant).clone()),
                    Decision::Keep => Now::Kept {
                        owners: index
                            .refused_at(cluster, &key)
                            .iter()
                            .filter_map(|r| self.caches.apps.get(&app_ref(r)))
                            .filter_map(|a| a.identity().uid.clone())
                            .collect(),
                    },
                    _ => Now::Nothing,
                };
                ((key.namespace, key.name), now)
            })
            .collect()
    }

    /// The assignment of `r`, as the index holds it.
    pub fn assignment(&self, r: &HubRef) -> Option<Assignment> {
        self.index().assignment(r).cloned()
    }

    /// The Applications assigned to a cluster `wanted` accepts.
    pub fn refs_where(&self, wanted: impl Fn(&str) -> bool) -> Vec<HubRef> {
        let index = self.index();
        index
            .refs()
            .into_iter()
            .filter(|r| {
                index
                    .assignment(r)
                    .and_then(|a| a.slot())
                    .is_some_and(|(c, _)| wanted(c))
            })
            .collect()
    }

    /// Whether a hub Application names `key` on `cluster`.
    pub fn has_slot(&self, cluster: &str, key: &ObjectKey) -> bool {
        self.index().has_slot(cluster, key)
    }

    /// The cluster the gRPC transport delivers `r` to, or refuses it for;
    /// `None` when `r` is not this transport's (as far as the index knows:
    /// a change of transport is told through
    /// [`Switches`] once the index shows it).
    pub fn grpc_cluster(&self, r: &HubRef) -> Option<String> {
        match self.index().assignment(r) {
            Some(Assignment::Deliver { cluster, .. } | Assignment::Refused { cluster, .. }) => {
                Some(cluster.clone())
            }
            Some(Assignment::NotOurs { .. }) | None => None,
        }
    }

    /// The hub Application that holds `key` on `cluster` (see
    /// [`Index::winner`]).
    pub fn winner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.index().winner(cluster, key)
    }

    /// The hub Application that owns `key` on `cluster`, whichever
    /// transport delivers it (see [`Index::owner`]).
    pub fn owner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.index().owner(cluster, key)
    }

    /// What a key the hub does not want becomes, when the agent still has
    /// it (see [`Index::removal`]).
    pub fn removal(&self, cluster: &str, key: &ObjectKey, version: &str) -> Option<Item> {
        self.index().removal(cluster, key, version)
    }
}

pub(super) fn app_ref(r: &HubRef) -> ObjectRef<CachedApp> {
    ObjectRef::new(&r.name).within(&r.namespace)
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
