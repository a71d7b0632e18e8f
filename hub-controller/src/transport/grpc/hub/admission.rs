//! The hub's side of [`super::super::revoke`]: whether a stream may go on
//! ([`Hub::admit`]), clusters revoked and allowed again by the hub's
//! watches, and the deny list kept from its ConfigMap.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::super::identity::Peer;
use super::super::revoke::{LEAVE_GRACE, Refusal, check_validity, parse};
use super::Hub;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64
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
    let (namespace, name) = list.configmap();
    if name.is_empty() {
        tracing::info!("no deny list of client certificates (--grpc-denied-certificates is empty)");
        return;
    }
    let api: Api<ConfigMap> = Api::namespaced(hub.client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
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
