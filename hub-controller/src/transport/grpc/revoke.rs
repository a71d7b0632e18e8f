//! Cutting agents off: a certificate's validity checked on every new stream
//! (not only at the handshake of its connection), a deny list of client
//! certificates kept in a ConfigMap and watched live, and whole clusters
//! revoked by the hub's watches when they leave OCM or their addon is
//! disabled ([`Hub::revoke`]). A refused stream gets a status saying why, is
//! logged with the cluster and the certificate, and counted in
//! `argocd_pull_hub_grpc_refused_total`.
//!
//! The deny list: ConfigMap `--grpc-denied-certificates` (default
//! `argocd-pull-denied-certificates`) in the hub-controller's namespace; each
//! key is the SHA-256 of a client certificate (DER), 64 hex digits, and its
//! value a note for the log and the refusal. A session whose certificate is
//! listed is ended as soon as the watch delivers the change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tonic::Status;

use super::hub::Hub;
use super::identity::Peer;

/// How long a cluster whose addon was disabled stays connected at most, for
/// its agent to acknowledge letting go of its Applications.
pub const LEAVE_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

pub use argocd_pull_apis::keys::DENY_LIST;

/// Why a stream is refused, for the metric and for the agent.
#[derive(Debug)]
pub struct Refusal {
    pub reason: &'static str,
    pub status: Status,
}

impl Refusal {
    pub fn expired(not_after: i64) -> Self {
        Self {
            reason: "certificate-expired",
            status: Status::unauthenticated(format!(
                "the client certificate expired at {} (Unix time): reconnect with the renewed one",
                not_after
            )),
        }
    }

    pub fn denied(list: &DenyList, fingerprint: &str, note: &str) -> Self {
        let note = if note.is_empty() {
            String::new()
        } else {
            format!(": {note}")
        };
        Self {
            reason: "certificate-denied",
            status: Status::permission_denied(format!(
                "the client certificate (SHA-256 {fingerprint}) is on the hub's deny list (ConfigMap {}){note}",
                list.source()
            )),
        }
    }

    pub fn revoked(cluster: &str, why: &str) -> Self {
        Self {
            reason: "revoked",
            status: Status::permission_denied(format!(
                "cluster {cluster} may not connect to this hub: {why}"
            )),
        }
    }
}

/// Refuses a certificate that is no longer valid at `now` (Unix seconds).
pub fn check_validity(not_after: i64, now: i64) -> Result<(), Refusal> {
    if now >= not_after {
        return Err(Refusal::expired(not_after));
    }
    Ok(())
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64
}

/// The deny list in force: fingerprint -> note.
pub struct DenyList {
    namespace: String,
    name: String,
    entries: RwLock<HashMap<String, String>>,
    loaded: watch::Sender<bool>,
}

impl std::fmt::Debug for DenyList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyList")
            .field("source", &self.source())
            .finish()
    }
}

impl DenyList {
    /// The list kept in ConfigMap `namespace/name`; an empty `name` turns
    /// it off (nothing is ever denied).
    pub fn new(namespace: &str, name: &str) -> Arc<Self> {
        Arc::new(Self {
            namespace: namespace.into(),
            name: name.into(),
            entries: RwLock::default(),
            loaded: watch::channel(name.is_empty()).0,
        })
    }

    pub fn source(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The note of `fingerprint`, when it is denied.
    pub fn denied(&self, fingerprint: &str) -> Option<String> {
        self.entries
            .read()
            .expect("never poisoned")
            .get(fingerprint)
            .cloned()
    }

    /// Resolves once the ConfigMap has been read (or found missing).
    pub async fn wait_loaded(&self) {
        let mut rx = self.loaded.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }

    fn replace(&self, entries: HashMap<String, String>) -> usize {
        let n = entries.len();
        *self.entries.write().expect("never poisoned") = entries;
        self.loaded.send_replace(true);
        n
    }
}

/// The entries of the deny list's data, and what is wrong with the keys
/// that are not fingerprints (left out).
pub fn parse(data: &BTreeMap<String, String>) -> (HashMap<String, String>, Vec<String>) {
    let mut entries = HashMap::new();
    let mut errors = Vec::new();
    for (key, note) in data {
        let fingerprint = key.to_ascii_lowercase();
        if fingerprint.len() == 64 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
            entries.insert(fingerprint, note.trim().to_string());
        } else {
            errors.push(format!(
                "deny list entry {key:?} is not a SHA-256 fingerprint (64 hex digits of the certificate's DER, e.g. from `openssl x509 -in tls.crt -outform DER | sha256sum`); ignored"
            ));
        }
    }
    (entries, errors)
}

impl Hub {
    /// Whether a stream with `peer`'s certificate may go on: still valid,
    /// not on the deny list, its cluster not revoked.
    pub fn admit(&self, peer: &Peer) -> Result<(), Refusal> {
        check_validity(peer.not_after, now())?;
        if let Some(note) = self.config.deny_list.denied(&peer.fingerprint) {
            return Err(Refusal::denied(
                &self.config.deny_list,
                &peer.fingerprint,
                &note,
            ));
        }
        let cs = self.cluster(&peer.cluster);
        if let Some(why) = cs.revoked() {
            return Err(Refusal::revoked(&peer.cluster, &why));
        }
        // From the watches, not only from what this process saw happen: a
        // hub restarted after a cluster left OCM (or its addon was disabled)
        // refuses it too. While its agent still has releases to acknowledge
        // (the addon just disabled, see `revoke_once_released`) it may come
        // back for them.
        if self.caches_synced() {
            if !self.cluster_exists(&peer.cluster) {
                return Err(Refusal::revoked(
                    &peer.cluster,
                    "there is no ManagedCluster of that name on this hub",
                ));
            }
            if !self.addon_enabled(&peer.cluster) && cs.lag().1 == 0 {
                return Err(Refusal::revoked(
                    &peer.cluster,
                    "the argocd-pull addon is not enabled for it (no ManagedClusterAddOn argocd-pull in its namespace)",
                ));
            }
        }
        Ok(())
    }

    /// `cluster` may no longer connect, because `why` (e.g. "its
    /// ManagedCluster was deleted"): its agent's stream is ended now and
    /// every new one refused until [`Hub::allow`]. For the hub's watches:
    /// a ManagedCluster deleted, the cluster's argocd-pull
    /// ManagedClusterAddOn deleted.
    pub fn revoke(&self, cluster: &str, why: &str) {
        let connected = self.cluster(cluster).revoke(why);
        tracing::warn!(%cluster, %why, connected, "cluster revoked: its agent is disconnected and refused until the cluster is allowed again");
    }

    /// Revokes `cluster` once its agent has acknowledged everything queued
    /// for it (the releases of the Applications that move to ManifestWork
    /// when its addon is disabled: cut off before, the agent would keep
    /// them next to the work agent), or after [`LEAVE_GRACE`]; not if the
    /// addon is back by then.
    pub fn revoke_once_released(self: Arc<Self>, cluster: String, why: &'static str) {
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + LEAVE_GRACE;
            let cs = self.cluster(&cluster);
            while cs.lag().1 > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            if !self.addon_enabled(&cluster) {
                self.revoke(&cluster, why);
            }
        });
    }

    /// `cluster` may connect again (its ManagedCluster and addon exist).
    pub fn allow(&self, cluster: &str) {
        if self.cluster(cluster).allow() {
            tracing::info!(%cluster, "cluster allowed to connect again");
        }
    }
}

/// Keeps the deny list from its ConfigMap until `shutdown`; every change
/// ends the sessions of certificates it lists.
pub async fn run_deny_list(hub: Arc<Hub>, shutdown: impl std::future::Future<Output = ()>) {
    let list = hub.config.deny_list.clone();
    if list.name.is_empty() {
        tracing::info!("no deny list of client certificates (--grpc-denied-certificates is empty)");
        return;
    }
    let api: Api<ConfigMap> = Api::namespaced(hub.client.clone(), &list.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", list.name));
    let events = watcher::watcher(api, config)
        .default_backoff()
        .take_until(shutdown);
    let mut events = std::pin::pin!(events);
    let mut listed: Option<ConfigMap> = None;
    while let Some(ev) = events.next().await {
        match ev {
            Err(e) => {
                tracing::error!(configmap = %list.source(), error = %e, "cannot read the deny list of client certificates; retrying (agents are not welcomed before it was read once)")
            }
            Ok(watcher::Event::Init) => listed = None,
            Ok(watcher::Event::InitApply(cm)) => listed = Some(cm),
            Ok(watcher::Event::InitDone) => apply(&hub, listed.take()),
            Ok(watcher::Event::Apply(cm)) => apply(&hub, Some(cm)),
            Ok(watcher::Event::Delete(_)) => apply(&hub, None),
        }
    }
}

fn apply(hub: &Hub, cm: Option<ConfigMap>) {
    let list = &hub.config.deny_list;
    let data = cm.and_then(|c| c.data).unwrap_or_default();
    let (entries, errors) = parse(&data);
    for e in errors {
        tracing::error!(configmap = %list.source(), "{e}");
    }
    let n = list.replace(entries);
    hub.metrics.denied_certificates.set(n as i64);
    tracing::info!(configmap = %list.source(), certificates = n, "deny list of client certificates in force");
    for cs in hub.clusters() {
        if let Some(fingerprint) = cs.stop_if_denied(|fp| list.denied(fp)) {
            tracing::warn!(cluster = %cs.name, certificate = %fingerprint, "disconnecting an agent: its certificate is on the deny list");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_keys_and_anything_else_is_reported() {
        let fp = "AB".repeat(32);
        let data: BTreeMap<String, String> = [
            (fp.clone(), " stolen laptop, ticket 42\n".to_string()),
            ("cluster1".to_string(), String::new()),
            ("ab".repeat(31), String::new()),
            ("zz".repeat(32), String::new()),
        ]
        .into();
        let (entries, errors) = parse(&data);
        assert_eq!(
            entries,
            [(
                fp.to_ascii_lowercase(),
                "stolen laptop, ticket 42".to_string()
            )]
            .into()
        );
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].contains("not a SHA-256 fingerprint"),
            "{errors:?}"
        );
    }

    #[test]
    fn validity_is_checked_against_now() {
        assert!(check_validity(100, 99).is_ok());
        let r = check_validity(100, 100).unwrap_err();
        assert_eq!(r.reason, "certificate-expired");
        assert_eq!(r.status.code(), tonic::Code::Unauthenticated);
        assert!(r.status.message().contains("expired at 100"), "{r:?}");
    }

    #[tokio::test]
    async fn the_list_answers_once_loaded() {
        let list = DenyList::new("ns", DENY_LIST);
        assert!(
            !*list.loaded.borrow(),
            "not loaded before the ConfigMap was read"
        );
        list.replace([("f".repeat(64), "why".to_string())].into());
        list.wait_loaded().await;
        assert_eq!(list.denied(&"f".repeat(64)).as_deref(), Some("why"));
        assert_eq!(list.denied(&"e".repeat(64)), None);
        let r = Refusal::denied(&list, &"f".repeat(64), "why");
        assert_eq!(r.status.code(), tonic::Code::PermissionDenied);
        assert!(
            r.status
                .message()
                .contains("deny list (ConfigMap ns/argocd-pull-denied-certificates): why"),
            "{r:?}"
        );
        // Turned off: loaded at once, nothing denied.
        DenyList::new("ns", "").wait_loaded().await;
    }
}
