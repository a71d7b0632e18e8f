//! The hub copies' resource trees, in the hub's Argo CD Redis, where
//! argocd-server reads them (`argocd app resources`, the API's
//! `resource-tree`, the UI's tree and its live updates): for each pulled
//! Application, the tree [`argocd_pull_core::status::tree`] builds from the
//! status the hub copy already carries (its managed resources, with sync
//! and health, brought back by either transport).
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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_pull_core::status::tree;
use argocd_pull_runtime::backoff::Backoff;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio::sync::Notify;

use argocd_pull_runtime::redis::{self, Redis};
use crate::watch::cached::CachedApp;
use crate::watch::caches::Caches;
use crate::watch::watches::{Consumer, Event};

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
        let password = match &self.argocd_redis_password_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| {
                        anyhow::anyhow!("--argocd-redis-password-file {}: {e}", path.display())
                    })?
                    .trim_end_matches(['\r', '\n'])
                    .to_string(),
            ),
            None => None,
        };
        Ok(Some(Redis::new(addr.clone(), password)))
    }
}

/// What was last written for one hub copy: the digest of its tree's JSON,
/// or `None` for "no key".
type Last = Option<u64>;

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
}

impl Trees {
    pub fn new(redis: Redis, caches: Caches, argocd_namespace: &str, args: &TreeArgs) -> Arc<Self> {
        Arc::new(Self {
            redis,
            caches,
            argocd_namespace: argocd_namespace.to_string(),
            gzip: args.argocd_redis_compress == Compress::Gzip,
            expiry: args.argocd_tree_expiry,
            marked: Mutex::default(),
            wake: Notify::new(),
            last: Mutex::default(),
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

    /// Writes the tree of one hub copy as the cache shows it now, unless
    /// it is what was last written.
    async fn write(&self, key: &ObjectRef<CachedApp>) -> Result<(), redis::Error> {
        let namespace = key.namespace.as_deref().unwrap_or_default();
        let instance = tree::instance_name(namespace, &key.name, &self.argocd_namespace);
        let tree = self
            .caches
            .apps
            .get(key)
            .and_then(|app| tree::tree(app.status().as_ref()));
        let json = tree.map(|t| serde_json::to_vec(&t).expect("a Value always serializes"));
        let now: Last = json.as_deref().map(digest);
        if self.last.lock().unwrap().get(key) == Some(&now) {
            return Ok(());
        }
        let redis_key = tree::tree_key(&instance, self.gzip);
        let changed = match &json {
            Some(json) => {
                let value = if self.gzip { gzip(json) } else { json.clone() };
                self.redis.set(&redis_key, &value, self.expiry).await?;
                true
            }
            // Open trees hear of a key that went, not of one never there.
            None => self.redis.del(&redis_key).await?,
        };
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
        }
        Ok(())
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
