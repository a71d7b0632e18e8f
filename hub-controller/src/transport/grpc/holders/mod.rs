//! The hub's record of what each cluster's agent holds over gRPC: for each
//! spoke Application, the hub Application the agent applied it for, as the
//! agent last reported. It is what lets every replica, and the ManifestWork
//! transport on the leader, tell a key already held over gRPC from one
//! merely claimed ([`crate::route::owner::owner_holding`]): without it, an
//! older hub Application moved onto a key held over gRPC became its owner,
//! and its work was applied over the agent's copy.
//!
//! One Lease per cluster (`argocd-pull-holders-<cluster>`, label
//! [`record::LABEL`]) in the hub-controller's namespace, where no tenant
//! writes. The replica that acts for the cluster writes it from its agent's
//! reports ([`Hub::keep_holders`](super::Hub::keep_holders)), only when
//! what the agent holds changed (a delivery or a delete, never a status);
//! every replica watches them all. It is kept across restarts and
//! disconnects: what a cluster holds does not change because the hub
//! stopped hearing from it.
//!
//! - [`record`]: the record, its JSON and how reports change it (pure);
//! - this file: the view, the watch and the write.

pub mod record;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use argocd_pull_proto::v1::ObjectKey;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use super::claims::CLUSTER_ANNOTATION;
use record::Record;

/// Called with a cluster and the keys whose recorded holder changed.
type OnChange = Box<dyn Fn(&str, &[ObjectKey]) + Send + Sync>;

/// The records of every cluster, as the watch last saw them.
pub struct Holders {
    api: Api<Lease>,
    /// Cluster -> its record and the Lease's resourceVersion.
    view: Mutex<HashMap<String, (Arc<Record>, String)>>,
    on_change: OnceLock<OnChange>,
    /// The watch has had its first full list.
    listed: tokio::sync::watch::Sender<bool>,
}

impl Holders {
    /// The records in `namespace` (the hub-controller's own).
    pub fn new(client: kube::Client, namespace: &str) -> Arc<Self> {
        Arc::new(Self {
            api: Api::namespaced(client, namespace),
            view: Mutex::default(),
            on_change: OnceLock::new(),
            listed: tokio::sync::watch::channel(false).0,
        })
    }

    /// Resolves once the watch has had its first full list, or after
    /// `timeout` (the records are then taken in as they come).
    pub async fn wait_listed(&self, timeout: std::time::Duration) {
        let mut rx = self.listed.subscribe();
        if tokio::time::timeout(timeout, rx.wait_for(|l| *l))
            .await
            .is_err()
        {
            tracing::warn!(
                ?timeout,
                "the record of what agents hold is not listed yet; keys are decided by age until it is"
            );
        }
    }

    /// The uid of the hub Application `cluster`'s agent holds `key` for,
    /// as recorded.
    pub fn held_by(&self, cluster: &str, key: &ObjectKey) -> Option<String> {
        self.view
            .lock()
            .expect("never poisoned")
            .get(cluster)
            .and_then(|(r, _)| r.get(key).cloned())
    }

    /// `cluster`'s record and its Lease's resourceVersion (empty: none yet).
    pub fn record(&self, cluster: &str) -> (Arc<Record>, String) {
        self.view
            .lock()
            .expect("never poisoned")
            .get(cluster)
            .cloned()
            .unwrap_or_default()
    }

    /// Calls `f` whenever a recorded holder changes (set once).
    pub fn on_change(&self, f: impl Fn(&str, &[ObjectKey]) + Send + Sync + 'static) {
        let _ = self.on_change.set(Box::new(f));
    }

    /// Keeps the view, until the process ends.
    pub async fn watch(self: Arc<Self>) {
        let config = watcher::Config::default().labels(record::LABEL);
        let stream = watcher::watcher(self.api.clone(), config).default_backoff();
        futures::pin_mut!(stream);
        let mut listed: Option<Vec<String>> = None;
        while let Some(ev) = stream.next().await {
            use watcher::Event as E;
            match ev {
                Err(e) => tracing::warn!(error = %e, "the holders' Lease watch failed; retrying"),
                Ok(E::Init) => listed = Some(Vec::new()),
                Ok(E::InitApply(l)) => {
                    if let (Some(c), Some(seen)) = (self.apply(&l), &mut listed) {
                        seen.push(c);
                    }
                }
                Ok(E::InitDone) => {
                    let seen = listed.take().unwrap_or_default();
                    let gone: Vec<String> = self
                        .view
                        .lock()
                        .expect("never poisoned")
                        .keys()
                        .filter(|c| !seen.contains(c))
                        .cloned()
                        .collect();
                    for c in gone {
                        self.set(&c, None);
                    }
                    self.listed.send_replace(true);
                }
                Ok(E::Apply(l)) => {
                    self.apply(&l);
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
    fn apply(&self, l: &Lease) -> Option<String> {
        let cluster = l.annotations().get(CLUSTER_ANNOTATION)?.clone();
        let record = record::decode(
            l.annotations()
                .get(record::ANNOTATION)
                .map_or("", String::as_str),
        );
        self.set(
            &cluster,
            Some((record, l.resource_version().unwrap_or_default())),
        );
        Some(cluster)
    }

    /// Puts `cluster`'s record in the view and tells of the holders that
    /// changed.
    fn set(&self, cluster: &str, next: Option<(Record, String)>) {
        let changed = {
            let mut view = self.view.lock().expect("never poisoned");
            let empty = Record::new();
            let old = view.get(cluster).map(|(r, _)| r.clone());
            let old = old.as_deref().unwrap_or(&empty);
            let changed = record::changed(old, next.as_ref().map_or(&empty, |(r, _)| r));
            match next {
                Some((r, version)) => {
                    view.insert(cluster.to_string(), (Arc::new(r), version));
                }
                None => {
                    view.remove(cluster);
                }
            }
            changed
        };
        if !changed.is_empty()
            && let Some(f) = self.on_change.get()
        {
            f(cluster, &changed);
        }
    }

    /// Deletes `cluster`'s record (nothing there is fine).
    pub async fn delete(&self, cluster: &str) -> Result<(), kube::Error> {
        match self
            .api
            .delete(&record::lease_name(cluster), &Default::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes `cluster`'s record: over the version `version` of its Lease
    /// (a replica that wrote in between makes it fail with a conflict: the
    /// caller merges again with what the watch then shows), or as a new
    /// Lease when `version` is empty.
    pub async fn write(
        &self,
        cluster: &str,
        record: Record,
        version: &str,
    ) -> Result<(), kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(record::lease_name(cluster)),
                resource_version: (!version.is_empty()).then(|| version.to_string()),
                labels: Some([(record::LABEL.to_string(), "true".to_string())].into()),
                annotations: Some(
                    [
                        (CLUSTER_ANNOTATION.to_string(), cluster.to_string()),
                        (record::ANNOTATION.to_string(), record::encode(&record)),
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
                .replace(&record::lease_name(cluster), &PostParams::default(), &lease)
                .await?
        };
        // The view has it at once: the next write merges with it, not
        // with what the watch has not shown yet.
        self.set(
            cluster,
            Some((record, written.resource_version().unwrap_or_default())),
        );
        Ok(())
    }
}
