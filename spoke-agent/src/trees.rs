//! Capability `trees`: the resource tree and managed resources of each
//! Application the agent applied, read from this cluster's Argo CD Redis
//! (where its application-controller caches them for its own UI) and
//! reported to the hub, which writes them for the hub's argocd-server
//! (docs/ui.md).
//!
//! The application-controller publishes on `app|managed-resources|<app>|...`
//! each time it caches an Application's tree; the reporter subscribes to
//! those channels and reads the trees of the Applications named: at once
//! after a quiet spell, then at most every 500 ms while changes keep
//! coming, and each once more 500 ms later (the controller publishes
//! before it writes the live states). It queues a report for each one that
//! changed since it was last sent. After each Welcome that negotiated `trees` it reports every
//! Application again. Secrets' values are replaced before anything leaves
//! the cluster ([`tree::redact_managed_resources`]). A Redis that fails is
//! retried with the agent's usual backoff and stops nothing else.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_core::status::tree;
use argocd_pull_proto::limits::MAX_OBJECT_JSON_BYTES;
use argocd_pull_proto::v1::{ObjectKey, ResourceTreeReport};
use argocd_pull_runtime::backoff::Backoff;
use argocd_pull_runtime::redis::{self, Redis};
use argocd_pull_runtime::shutdown::Shutdown;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::cache::Cache;
use crate::state::AgentState;

/// How often, at most, the trees named since are read and reported.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// The channels the application-controller publishes on.
const PATTERN: &str = "app|managed-resources|*";

/// The largest value read from Redis (compressed): a tree of tens of
/// thousands of nodes.
const MAX_VALUE: usize = 8 * 1024 * 1024;

/// `--argocd-redis` and where its password comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    pub addr: String,
    pub password: Password,
}

/// Where the Redis password comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Password {
    /// None (a test's Redis).
    None,
    /// `--argocd-redis-password-file`.
    File(PathBuf),
    /// The `auth` key of this Secret in the Argo CD namespace
    /// (`--argocd-redis-secret`): none when it does not exist.
    Secret(String),
}

impl RedisConfig {
    /// The Redis, with its password read (a Secret through `client`, in
    /// `namespace`).
    pub async fn open(&self, client: &kube::Client, namespace: &str) -> Result<Redis, String> {
        let redis = match &self.password {
            Password::None => Redis::new(self.addr.clone(), None),
            Password::File(file) => Redis::with_password_file(self.addr.clone(), Some(file))
                .map_err(|e| format!("--argocd-redis-password-file {e}"))?,
            Password::Secret(name) => {
                let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
                    kube::Api::namespaced(client.clone(), namespace);
                let secret = secrets.get_opt(name).await.map_err(|e| {
                    format!("cannot read the Redis password from Secret {namespace}/{name}: {e}")
                })?;
                let password = secret
                    .and_then(|s| s.data?.remove("auth"))
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned());
                if password.is_none() {
                    tracing::info!(secret = %format!("{namespace}/{name}"), "no Redis password (no such Secret, or no auth key); connecting without");
                }
                Redis::new(self.addr.clone(), password)
            }
        };
        Ok(redis.with_max_reply(MAX_VALUE))
    }
}

/// Reads the trees and queues the reports.
pub struct Reporter {
    redis: Redis,
    argocd_namespace: String,
    cache: Cache,
    state: Arc<AgentState>,
}

impl Reporter {
    pub fn new(
        redis: Redis,
        argocd_namespace: &str,
        store: Store<Application>,
        state: Arc<AgentState>,
    ) -> Self {
        Self {
            redis,
            argocd_namespace: argocd_namespace.to_string(),
            cache: Cache::new(store),
            state,
        }
    }

    /// Until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) {
        tracing::info!(
            redis = self.redis.addr(),
            "reporting resource trees from this cluster's Argo CD Redis"
        );
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        // What was last queued per Application (a digest of both payloads).
        let mut sent: HashMap<ObjectKey, u64> = HashMap::new();
        loop {
            let result = tokio::select! {
                () = shutdown.clone().wait() => return,
                r = self.follow(&mut sent, &mut backoff) => r,
            };
            if let Err(e) = result {
                let wait = backoff.delay();
                tracing::warn!(error = %e, retry_in = ?wait, "cannot read resource trees from this cluster's Argo CD Redis; the hub shows statuses only meanwhile");
                tokio::select! {
                    () = shutdown.clone().wait() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }

    /// Subscribes, then reports what is named, until Redis fails.
    async fn follow(
        &self,
        sent: &mut HashMap<ObjectKey, u64>,
        backoff: &mut Backoff,
    ) -> Result<(), redis::Error> {
        let mut subscription = self.redis.psubscribe(PATTERN).await?;
        // Whatever changed while not subscribed: everything again.
        sent.clear();
        let mut named: HashSet<ObjectKey> = self.all();
        // Reads go at once after a quiet spell, then at most every
        // INTERVAL while changes keep coming (what came meanwhile waits
        // for the next). Each Application named is read once more an
        // INTERVAL later: the application-controller publishes when it
        // writes the tree, and writes the managed resources (the live
        // states) just after (`setAppManagedResources`), so the first read
        // may see the new tree with the old live states, and nothing is
        // published again.
        let mut last_read = tokio::time::Instant::now() - INTERVAL;
        let mut again: HashSet<ObjectKey> = HashSet::new();
        loop {
            let read_at = (last_read + INTERVAL).max(tokio::time::Instant::now());
            tokio::select! {
                message = subscription.next() => {
                    let (channel, _) = message?;
                    if let Some(key) = self.key_of_channel(&channel) {
                        named.insert(key);
                    }
                }
                () = self.state.trees_wanted.notified() => {
                    sent.clear();
                    named = self.all();
                }
                () = tokio::time::sleep_until(read_at), if !named.is_empty() || !again.is_empty() => {
                    let now = std::mem::take(&mut named);
                    for key in now.union(&again) {
                        self.report(key, sent).await?;
                    }
                    again = now;
                    last_read = tokio::time::Instant::now();
                    backoff.reset();
                }
            }
        }
    }

    /// Every Application this agent applied for the hub.
    fn all(&self) -> HashSet<ObjectKey> {
        self.cache
            .all()
            .iter()
            .filter(|a| a.annotations().contains_key(keys::HUB_UID))
            .map(|a| ObjectKey {
                namespace: a.namespace().unwrap_or_default(),
                name: a.name_any(),
            })
            .collect()
    }

    /// The Application a channel names: `app|managed-resources|<instance>|<version>`.
    fn key_of_channel(&self, channel: &str) -> Option<ObjectKey> {
        let instance = channel
            .strip_prefix("app|managed-resources|")?
            .rsplit_once('|')?
            .0;
        Some(match instance.split_once('_') {
            Some((namespace, name)) => ObjectKey {
                namespace: namespace.into(),
                name: name.into(),
            },
            None => ObjectKey {
                namespace: self.argocd_namespace.clone(),
                name: instance.into(),
            },
        })
    }

    /// Reads the tree of `key` and queues it unless it is what was sent
    /// last. Only an Application the hub delivered (with its hub uid) is
    /// reported; nothing is sent while no stream negotiated `trees`.
    async fn report(
        &self,
        key: &ObjectKey,
        sent: &mut HashMap<ObjectKey, u64>,
    ) -> Result<(), redis::Error> {
        let app = self.cache.get(key);
        let Some(hub_uid) = app
            .as_ref()
            .and_then(|a| a.annotations().get(keys::HUB_UID).cloned())
        else {
            sent.remove(key);
            return Ok(());
        };
        let instance = tree::instance_name(&key.namespace, &key.name, &self.argocd_namespace);
        let tree_json = self
            .read(&instance, tree::tree_key)
            .await?
            .unwrap_or_default();
        let managed = self
            .read(&instance, tree::managed_resources_key)
            .await?
            .unwrap_or_default();
        let managed = if managed.is_empty() {
            Vec::new()
        } else {
            match tree::redact_managed_resources(&managed) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(namespace = %key.namespace, name = %key.name, error = %e, "not reporting managed resources");
                    Vec::new()
                }
            }
        };
        // Within the limit of one payload: the managed resources (live and
        // desired state of each) go first, then the tree.
        let managed = if managed.len() > MAX_OBJECT_JSON_BYTES {
            Vec::new()
        } else {
            managed
        };
        if tree_json.len() > MAX_OBJECT_JSON_BYTES {
            tracing::warn!(namespace = %key.namespace, name = %key.name, bytes = tree_json.len(), "the resource tree is over the limit of one message; not reported");
            return Ok(());
        }
        let digest = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&hub_uid, &tree_json, &managed).hash(&mut h);
            h.finish()
        };
        if sent.get(key) == Some(&digest) {
            return Ok(());
        }
        let queued = self.state.tree_report(ResourceTreeReport {
            key: Some(key.clone()),
            hub_uid,
            tree_json,
            managed_resources_json: managed,
        });
        if queued {
            sent.insert(key.clone(), digest);
        }
        Ok(())
    }

    /// The JSON under `key_of(instance, gzip)`: gzip first (Argo CD's
    /// default `--redis-compress`), then plain.
    async fn read(
        &self,
        instance: &str,
        key_of: fn(&str, bool) -> String,
    ) -> Result<Option<Vec<u8>>, redis::Error> {
        if let Some(gz) = self.redis.get(&key_of(instance, true)).await? {
            let mut json = Vec::new();
            let read = flate2::read::GzDecoder::new(&gz[..])
                .take(MAX_OBJECT_JSON_BYTES as u64 + 1)
                .read_to_end(&mut json);
            return Ok(read.ok().map(|_| json));
        }
        self.redis.get(&key_of(instance, false)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_names_an_application_by_its_instance_name() {
        let (_, writer) = {
            let w = kube::runtime::reflector::store::Writer::<Application>::new(
                argocd_pull_apis::argocd::application_resource(),
            );
            (0, w)
        };
        let reporter = Reporter::new(
            Redis::new("127.0.0.1:1", None),
            "argocd",
            writer.as_reader(),
            Arc::default(),
        );
        let key = |ns: &str, name: &str| ObjectKey {
            namespace: ns.into(),
            name: name.into(),
        };
        assert_eq!(
            reporter.key_of_channel("app|managed-resources|guestbook|1.8.3"),
            Some(key("argocd", "guestbook"))
        );
        assert_eq!(
            reporter.key_of_channel("app|managed-resources|team-a_guestbook|1.8.3"),
            Some(key("team-a", "guestbook"))
        );
        assert_eq!(
            reporter.key_of_channel("app|resources-tree|guestbook|1.8.3"),
            None
        );
        assert_eq!(
            reporter.key_of_channel("app|managed-resources|guestbook"),
            None
        );
    }
}
