//! Where the hub keeps its record of what it authorized and delivered to
//! each cluster ([`argocd_pull_core::authorized`], re-exported here): one
//! Lease per cluster, `argocd-pull-authorized-<cluster>` (label
//! [`LABEL`], the record as JSON in annotation [`ANNOTATION`]), in the
//! hub-controller's own namespace.
//!
//! Why there: no tenant writes in that namespace (tenants write their hub
//! Applications, spec and status alike, since the Application CRD has no
//! status subresource), and no cluster does (a klusterlet writes its
//! cluster's namespace: its works, its ManagedCluster's status; an agent
//! writes only through the hub-controller, which never copies a report
//! into this record). The leader writes it, from the decisions every
//! replica makes alike; every replica watches it; it outlives restarts,
//! which is what lets a copy kept on a cluster after a refusal keep the
//! project it was delivered with, and nothing else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

pub use argocd_pull_core::authorized::*;

/// Label on the record Leases.
pub const LABEL: &str = "argocd-pull.io/authorized-record";
/// The record, as JSON ([`encode`]).
pub const ANNOTATION: &str = "argocd-pull.io/authorized";
/// The cluster a record Lease is for.
pub const CLUSTER_ANNOTATION: &str = "argocd-pull.io/cluster";

/// The Lease that holds `cluster`'s record.
pub fn lease_name(cluster: &str) -> String {
    format!("argocd-pull-authorized-{cluster}")
}

/// The record's JSON in Lease `l` (empty when none).
fn lease_json(l: &Lease) -> String {
    l.annotations().get(ANNOTATION).cloned().unwrap_or_default()
}

/// Called with a cluster whose record changed.
type OnChange = Box<dyn Fn(&str) + Send + Sync>;

/// The records of every cluster, as the watch last saw them.
pub struct Records {
    api: Api<Lease>,
    /// Cluster -> its record and the Lease's resourceVersion.
    view: Mutex<HashMap<String, (Arc<ClusterRecord>, String)>>,
    on_change: OnceLock<OnChange>,
    listed: tokio::sync::watch::Sender<bool>,
}

impl Records {
    /// The records in `namespace` (the hub-controller's own).
    pub fn new(client: kube::Client, namespace: &str) -> Arc<Self> {
        Arc::new(Self {
            api: Api::namespaced(client, namespace),
            view: Mutex::default(),
            on_change: OnceLock::new(),
            listed: tokio::sync::watch::channel(false).0,
        })
    }

    fn view(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<ClusterRecord>, String)>> {
        self.view.lock().expect("never poisoned")
    }

    /// Resolves once the watch has had its first full list, or after
    /// `timeout`.
    pub async fn wait_listed(&self, timeout: std::time::Duration) {
        let mut rx = self.listed.subscribe();
        if tokio::time::timeout(timeout, rx.wait_for(|l| *l))
            .await
            .is_err()
        {
            tracing::warn!(
                ?timeout,
                "the record of what the hub authorized is not listed yet; copies kept after a refusal get no project until it is"
            );
        }
    }

    /// `cluster`'s record and its Lease's resourceVersion (empty: none).
    pub fn record(&self, cluster: &str) -> (Arc<ClusterRecord>, String) {
        self.view().get(cluster).cloned().unwrap_or_default()
    }

    /// The clusters that have a record.
    pub fn clusters(&self) -> Vec<String> {
        self.view().keys().cloned().collect()
    }

    /// Calls `f` whenever a cluster's record changes (set once).
    pub fn on_change(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.on_change.set(Box::new(f));
    }

    /// Keeps the view, until the process ends.
    pub async fn watch(self: Arc<Self>) {
        let config = watcher::Config::default().labels(LABEL);
        let stream = watcher::watcher(self.api.clone(), config).default_backoff();
        futures::pin_mut!(stream);
        let mut listed: Option<Vec<String>> = None;
        while let Some(ev) = stream.next().await {
            use watcher::Event as E;
            match ev {
                Err(e) => {
                    tracing::warn!(error = %e, "the authorized record's Lease watch failed; retrying")
                }
                Ok(E::Init) => listed = Some(Vec::new()),
                Ok(E::InitApply(l)) => {
                    if let (Some(c), Some(seen)) = (self.take_in(&l), &mut listed) {
                        seen.push(c);
                    }
                }
                Ok(E::InitDone) => {
                    let seen = listed.take().unwrap_or_default();
                    let gone: Vec<String> = self
                        .clusters()
                        .into_iter()
                        .filter(|c| !seen.contains(c))
                        .collect();
                    for c in gone {
                        self.set(&c, None);
                    }
                    self.listed.send_replace(true);
                }
                Ok(E::Apply(l)) => {
                    self.take_in(&l);
                }
                Ok(E::Delete(l)) => {
                    if let Some(c) = l.annotations().get(CLUSTER_ANNOTATION) {
                        self.set(c, None);
                    }
                }
            }
        }
    }

    /// Takes in a Lease of the watch; returns its cluster.
    fn take_in(&self, l: &Lease) -> Option<String> {
        let cluster = l.annotations().get(CLUSTER_ANNOTATION)?.clone();
        let record = decode(&lease_json(l));
        self.set(
            &cluster,
            Some((record, l.resource_version().unwrap_or_default())),
        );
        Some(cluster)
    }

    fn set(&self, cluster: &str, next: Option<(ClusterRecord, String)>) {
        let changed = {
            let mut view = self.view();
            let old = view.get(cluster).map(|(r, _)| r.clone());
            let changed = old.as_deref() != next.as_ref().map(|(r, _)| r);
            match next {
                Some((r, version)) => view.insert(cluster.to_string(), (Arc::new(r), version)),
                None => view.remove(cluster),
            };
            changed
        };
        if changed && let Some(f) = self.on_change.get() {
            f(cluster);
        }
    }

    /// Writes `cluster`'s record over the version `version` of its Lease
    /// (another writer in between makes it fail with a conflict: the next
    /// pass writes again), or as a new Lease when `version` is empty; an
    /// empty record deletes the Lease.
    pub async fn write(
        &self,
        cluster: &str,
        record: &ClusterRecord,
        version: &str,
    ) -> Result<(), kube::Error> {
        let name = lease_name(cluster);
        if record.is_empty() {
            match self.api.delete(&name, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
            self.set(cluster, None);
            return Ok(());
        }
        let (json, left_out) = encode(record);
        if left_out > 0 {
            tracing::warn!(
                cluster,
                left_out,
                "the authorized record of the cluster is full: these grants are not kept across a restart"
            );
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: (!version.is_empty()).then(|| version.to_string()),
                labels: Some([(LABEL.to_string(), "true".to_string())].into()),
                annotations: Some(
                    [
                        (CLUSTER_ANNOTATION.to_string(), cluster.to_string()),
                        (ANNOTATION.to_string(), json),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec::default()),
        };
        let written = if version.is_empty() {
            self.api.create(&PostParams::default(), &lease).await?
        } else {
            self.api
                .replace(&name, &PostParams::default(), &lease)
                .await?
        };
        // As the watch will show it: what did not fit is not there.
        let kept = if left_out > 0 {
            decode(&lease_json(&written))
        } else {
            record.clone()
        };
        self.set(
            cluster,
            Some((kept, written.resource_version().unwrap_or_default())),
        );
        Ok(())
    }
}
