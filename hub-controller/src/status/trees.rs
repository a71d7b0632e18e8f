//! The hub copies' resource trees, in the hub's Argo CD Redis, where
//! argocd-server reads them (`argocd app resources`, the API's
//! `resource-tree`, the UI's tree and its live updates): for each pulled
//! Application, the tree [`argocd_pull_core::status::tree`] builds from the
//! status the hub copy already carries (its managed resources, with sync
//! and health, brought back by either transport).
//!
//! An agent with the `trees` capability reports the whole tree its
//! cluster's Argo CD cached (children with their health, such as
//! ReplicaSets and Pods) and the managed resources (the diff, `argocd app
//! manifests --source live`): [`Trees::reported`] keeps the last one of
//! each hub copy, in the form argocd-server reads, and writes it in place
//! of the tree from the status, with the managed resources under their own
//! key, for as long as the copy is delivered to that cluster over gRPC.
//! With several replicas, the tree of a copy delivered over gRPC is written
//! by the replica that writes for its cluster only (the one its agent
//! reports to, [`crate::transport::grpc::claims`]).
//!
//! Off unless `--argocd-redis` is set. Fed by the one set of watches (a
//! [`Consumer`]): a change of a hub copy marks it; one task writes the
//! marked trees (`SET` with the expiry argocd-server's own cache uses, then
//! `PUBLISH` on the channel argocd-server's open trees listen to), and
//! writes only a tree that differs from the one it last wrote. A hub copy
//! deleted, or whose status lists no resources, has its key deleted
//! (once; the change is published only when a key went). Every tree is
//! written again each half expiry, so a key outlives no hub copy by more
//! than the expiry, and a Redis restarted empty is filled again; a copy
//! without a tree costs nothing then. Every replica writes (the same tree from the same
//! status: the writes agree); a Redis that fails is retried with the jittered backoff of every component (1 s to 30 s)
//! and stops nothing else.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::Write as _;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use argocd_pull_core::status::tree;
use argocd_pull_runtime::backoff::Backoff;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio::sync::Notify;

use crate::route::HubRef;
use crate::watch::cached::CachedApp;
use crate::watch::caches::Caches;
use crate::watch::watches::{Consumer, Event};
use argocd_pull_runtime::redis::{self, Redis};

/// What the tree writer asks of the gRPC transport, which implements it:
/// the writer depends on this and not on the transport.
pub trait GrpcView: Send + Sync {
    /// The cluster the hub copy `r` is delivered to over gRPC, if it is.
    fn grpc_cluster(&self, r: &HubRef) -> Option<String>;
    /// Whether this replica writes for `cluster`.
    fn acts_for(&self, cluster: &str) -> bool;
    /// Whether the hub's record grants `key` on `cluster` to the hub copy
    /// of uid `hub_uid`.
    fn granted_to(
        &self,
        cluster: &str,
        key: &argocd_pull_proto::v1::ObjectKey,
        hub_uid: Option<&str>,
    ) -> bool;
    /// The live endpoint's URL, when it serves argocd-server.
    fn live_url(&self) -> Option<&str>;
}

/// How the trees reach argocd-server's Redis.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TreeArgs {
    /// The hub's Argo CD Redis (`host:port`, what argocd-server's
    /// `--redis` names): write each pulled Application's resource tree
    /// there, from its status, for argocd-server (docs/ui.md). Unset, no
    /// tree is written.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_REDIS")]
    pub argocd_redis: Option<String>,
    /// A file holding that Redis's password (the `auth` key of Argo CD's
    /// `argocd-redis` Secret); none when unset.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_REDIS_PASSWORD_FILE")]
    pub argocd_redis_password_file: Option<std::path::PathBuf>,
    /// argocd-server's `--redis-compress`: `gzip` (its default) or `none`.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_REDIS_COMPRESS", value_enum, default_value_t = Compress::Gzip)]
    pub argocd_redis_compress: Compress,
    /// How long a tree stays in Redis unless written again
    /// (argocd-server's `--app-state-cache-expiration`, 1h by default);
    /// every tree is written again each half of it.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_TREE_EXPIRY", default_value = "1h", value_parser = argocd_pull_runtime::parse_duration)]
    pub argocd_tree_expiry: Duration,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Compress {
    #[default]
    Gzip,
    None,
}

impl TreeArgs {
    /// The Redis to write to, with its password read; `None` when no
    /// `--argocd-redis` is set.
    pub fn redis(&self) -> anyhow::Result<Option<Redis>> {
        let Some(addr) = &self.argocd_redis else {
            return Ok(None);
        };
        Redis::with_password_file(addr.clone(), self.argocd_redis_password_file.as_deref())
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--argocd-redis-password-file {e}"))
    }
}

/// What was last written for one hub copy: the digest of its tree's JSON
/// (and of its managed resources'), or `None` for "no key".
type Last = Option<u64>;

/// The largest reported tree or managed-resources list kept, compressed:
/// a report over it is refused and the tree from the status stays.
pub const MAX_REPORTED_BYTES: usize = 256 * 1024;

/// The last tree an agent reported for one hub copy, as argocd-server
/// reads it (compressed when argocd-server's cache is).
struct Reported {
    cluster: String,
    /// The spoke Application it is of: its grant must name the hub copy.
    key: argocd_pull_proto::v1::ObjectKey,
    hub_uid: String,
    /// Whether its nodes keep their uids (the copy's destination opened
    /// live views when it came).
    uids: bool,
    tree: Vec<u8>,
    managed: Option<Vec<u8>>,
}

/// The tree writer.
pub struct Trees {
    redis: Redis,
    caches: Caches,
    argocd_namespace: String,
    gzip: bool,
    expiry: Duration,
    marked: Mutex<HashSet<ObjectRef<CachedApp>>>,
    wake: Notify,
    last: Mutex<HashMap<ObjectRef<CachedApp>, Last>>,
    reported: Mutex<HashMap<ObjectRef<CachedApp>, Reported>>,
    /// The gRPC transport: which copies it delivers, to which cluster, and
    /// whether this replica writes for that cluster.
    grpc: Option<Weak<dyn GrpcView>>,
}

impl Trees {
    /// The writer into `redis`; with the gRPC transport, `grpc` tells it
    /// which copies that transport delivers.
    pub fn new(
        redis: Redis,
        caches: Caches,
        argocd_namespace: &str,
        args: &TreeArgs,
        grpc: Option<Weak<dyn GrpcView>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            redis,
            caches,
            argocd_namespace: argocd_namespace.to_string(),
            gzip: args.argocd_redis_compress == Compress::Gzip,
            expiry: args.argocd_tree_expiry,
            marked: Mutex::default(),
            wake: Notify::new(),
            last: Mutex::default(),
            reported: Mutex::default(),
            grpc,
        })
    }

    /// The tree and managed resources the agent of `cluster` reported for
    /// its Application delivered for `key`, with the uid of the hub copy
    /// it was delivered for: kept and written unless the copy is not that
    /// one (any more), or what came is not a tree (the error says why).
    pub fn reported(
        &self,
        cluster: &str,
        spoke_key: &argocd_pull_proto::v1::ObjectKey,
        key: ObjectRef<CachedApp>,
        hub_uid: &str,
        tree_json: &[u8],
        managed_json: &[u8],
    ) -> Result<(), String> {
        let app = self
            .caches
            .apps
            .get(&key)
            .ok_or("its hub Application is gone")?;
        if app.identity().uid.as_deref() != Some(hub_uid) {
            return Err(format!(
                "it is for hub Application uid {hub_uid}, not for the current one"
            ));
        }
        let encode = |value: serde_json::Value, what: &str| {
            let json = serde_json::to_vec(&value).expect("a Value always serializes");
            let bytes = if self.gzip { gzip(&json) } else { json };
            if bytes.len() > MAX_REPORTED_BYTES {
                return Err(format!(
                    "its {what} is {} bytes, over the {MAX_REPORTED_BYTES} kept",
                    bytes.len()
                ));
            }
            Ok(bytes)
        };
        let entry = if tree_json.is_empty() {
            None
        } else {
            let uids = self.opens_live_views(&app, cluster);
            let tree = encode(tree::reported_tree(tree_json, uids)?, "tree")?;
            let managed = if managed_json.is_empty() {
                None
            } else {
                Some(encode(
                    tree::reported_managed_resources(managed_json)?,
                    "managed resources",
                )?)
            };
            Some(Reported {
                cluster: cluster.to_string(),
                key: spoke_key.clone(),
                hub_uid: hub_uid.to_string(),
                uids,
                tree,
                managed,
            })
        };
        {
            let mut reported = self.reported.lock().unwrap();
            match entry {
                Some(entry) => reported.insert(key.clone(), entry),
                None => reported.remove(&key),
            };
        }
        self.mark(key);
        Ok(())
    }

    /// Whether node uids of `app`'s tree open argocd-server's live views
    /// of `cluster` and nothing else: only for a copy aimed at this
    /// cluster's Secret on the live endpoint.
    fn opens_live_views(&self, app: &CachedApp, cluster: &str) -> bool {
        self.grpc
            .as_ref()
            .and_then(std::sync::Weak::upgrade)
            .is_some_and(|hub| {
                hub.live_url().is_some_and(|url| {
                    let server =
                        argocd_pull_core::render::cluster_secret::live_server(url, cluster);
                    argocd_pull_core::live::opens_live_views(
                        app.application().data.pointer("/spec/destination"),
                        cluster,
                        &server,
                    )
                })
            })
    }

    fn mark(&self, key: ObjectRef<CachedApp>) {
        self.marked.lock().unwrap().insert(key);
        self.wake.notify_one();
    }

    /// Every hub copy in the cache, to write its tree again (a key without
    /// one stays known as absent: nothing to renew).
    fn mark_all(&self) {
        self.last.lock().unwrap().retain(|_, last| last.is_none());
        let all: Vec<_> = self
            .caches
            .apps
            .state()
            .iter()
            .map(|a| ObjectRef::from_obj(a.as_ref()))
            .collect();
        self.marked.lock().unwrap().extend(all);
        self.wake.notify_one();
    }

    /// Writes marked trees until `shutdown` resolves.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut again = tokio::time::interval(self.expiry / 2);
        again.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: nothing is marked before the caches
        // list, and each listed copy marks itself.
        again.tick().await;
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = self.wake.notified() => {}
                _ = again.tick() => self.mark_all(),
            }
            let batch: Vec<_> = std::mem::take(&mut *self.marked.lock().unwrap())
                .into_iter()
                .collect();
            let mut left = batch.into_iter();
            while let Some(key) = left.next() {
                if let Err(e) = self.write(&key).await {
                    let wait = backoff.delay();
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot write resource trees to the hub's Argo CD Redis; argocd-server shows the status line meanwhile");
                    {
                        let mut marked = self.marked.lock().unwrap();
                        marked.insert(key);
                        marked.extend(left.by_ref());
                    }
                    self.wake.notify_one();
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                    break;
                }
                backoff.reset();
            }
        }
    }

    /// Writes the tree of one hub copy as the cache shows it now (or as
    /// its agent reported it), unless it is what was last written.
    async fn write(&self, key: &ObjectRef<CachedApp>) -> Result<(), redis::Error> {
        let namespace = key.namespace.as_deref().unwrap_or_default();
        let instance = tree::instance_name(namespace, &key.name, &self.argocd_namespace);
        let app = self.caches.apps.get(key);
        let hub = self.grpc.as_ref().and_then(Weak::upgrade);
        let hub_ref = HubRef {
            namespace: namespace.to_string(),
            name: key.name.clone(),
        };
        let cluster = hub.as_ref().and_then(|h| h.grpc_cluster(&hub_ref));
        if let (Some(hub), Some(cluster)) = (&hub, &cluster)
            && !hub.acts_for(cluster)
        {
            // The replica its agent reports to writes it.
            self.last.lock().unwrap().remove(key);
            return Ok(());
        }
        let (tree, managed) = self.tree_of(key, app.as_deref(), hub.as_deref(), cluster.as_deref());
        let now: Last = tree
            .as_deref()
            .map(|t| digest(t) ^ managed.as_deref().map_or(0, |m| digest(m).rotate_left(1)));
        if self.last.lock().unwrap().get(key) == Some(&now) {
            return Ok(());
        }
        let changed = self
            .store(&instance, tree.as_deref(), managed.as_deref())
            .await?;
        if changed {
            self.redis
                .publish(&tree::tree_channel(&instance), b"")
                .await?;
        }
        let mut last = self.last.lock().unwrap();
        if self.caches.apps.get(key).is_some() {
            last.insert(key.clone(), now);
        } else {
            last.remove(key);
            self.reported.lock().unwrap().remove(key);
        }
        Ok(())
    }

    /// The tree and managed resources `key` shows now: the ones its agent
    /// reported while the record still decides for them, else the tree
    /// from its status (no uid: it opens no live view) until its agent
    /// reports.
    fn tree_of(
        &self,
        key: &ObjectRef<CachedApp>,
        app: Option<&CachedApp>,
        hub: Option<&dyn GrpcView>,
        cluster: Option<&str>,
    ) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        let reported = {
            let mut reported = self.reported.lock().unwrap();
            // The record decides, now: the tree of a spoke key whose grant
            // names this hub copy, and uids only while its destination
            // still opens live views of that cluster alone.
            let current = reported.get(key).is_some_and(|r| {
                let uid = app.and_then(|a| a.identity().uid.as_deref());
                Some(r.cluster.as_str()) == cluster
                    && uid == Some(r.hub_uid.as_str())
                    && hub.is_some_and(|h| h.granted_to(&r.cluster, &r.key, uid))
                    && (!r.uids || app.is_some_and(|a| self.opens_live_views(a, &r.cluster)))
            });
            if current {
                reported
                    .get(key)
                    .map(|r| (r.tree.clone(), r.managed.clone()))
            } else {
                // Moved to another cluster or transport, deleted and
                // created again, its grant gone or made for another hub
                // copy, or aimed elsewhere since.
                reported.remove(key);
                None
            }
        };
        match reported {
            Some((tree, managed)) => (Some(tree), managed),
            None => {
                let json = app
                    .and_then(|app| tree::tree(app.status().as_ref()))
                    .map(|t| serde_json::to_vec(&t).expect("a Value always serializes"));
                (json.map(|j| if self.gzip { gzip(&j) } else { j }), None)
            }
        }
    }

    /// Writes `tree` and `managed` under `instance`'s keys, or deletes
    /// them; whether anything changed there.
    async fn store(
        &self,
        instance: &str,
        tree: Option<&[u8]>,
        managed: Option<&[u8]>,
    ) -> Result<bool, redis::Error> {
        let tree_key = tree::tree_key(instance, self.gzip);
        let managed_key = tree::managed_resources_key(instance, self.gzip);
        match tree {
            Some(value) => {
                self.redis.set(&tree_key, value, self.expiry).await?;
                match managed {
                    Some(value) => self.redis.set(&managed_key, value, self.expiry).await?,
                    None => {
                        self.redis.del(&managed_key).await?;
                    }
                }
                Ok(true)
            }
            // Open trees hear of a key that went, not of one never there.
            None => {
                let managed_went = self.redis.del(&managed_key).await?;
                Ok(self.redis.del(&tree_key).await? || managed_went)
            }
        }
    }
}

impl Consumer for Trees {
    fn event(&self, event: &Event) {
        let Event::App(event) = event else { return };
        match event {
            watcher::Event::Apply(app)
            | watcher::Event::InitApply(app)
            | watcher::Event::Delete(app) => self.mark(ObjectRef::from_obj(app)),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    fn synced(&self) {}
}

fn digest(bytes: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// `bytes` as gzip, as argocd-server's cache writes and reads values with
/// `--redis-compress gzip`.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("writing to memory");
    encoder.finish().expect("writing to memory")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    #[test]
    fn gzip_comes_back_whole() {
        let text = br#"{"nodes":[{"kind":"Service","name":"guestbook-ui"}]}"#;
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gzip(text)[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, text);
    }
}
