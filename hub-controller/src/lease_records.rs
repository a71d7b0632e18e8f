//! Records the hub keeps per cluster in Leases of its own namespace, where
//! no tenant and no cluster writes: one Lease per cluster, labelled
//! [`Kind::LABEL`], the record as JSON in annotation [`Kind::ANNOTATION`],
//! the cluster in [`CLUSTER_ANNOTATION`]. Every replica watches them all
//! and keeps a view; a writer writes over the resourceVersion it read (a
//! writer in between makes it fail with a conflict) and sees its write in
//! the view at once. What each record holds, and who writes it, is its
//! kind's: [`crate::authorized`], [`crate::transport::grpc::holders`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

/// The cluster a record Lease is for.
pub const CLUSTER_ANNOTATION: &str = "argocd-pull.io/cluster";

/// One kind of record.
pub trait Kind: Send + Sync + 'static {
    type Record: Clone + Default + PartialEq + Send + Sync + 'static;
    /// Label on its Leases.
    const LABEL: &'static str;
    /// Annotation holding the record's JSON.
    const ANNOTATION: &'static str;
    /// What the record is, for log lines.
    const WHAT: &'static str;
    /// What happens while the first list is not there yet, for the log line
    /// of a replica that stops waiting for it.
    const UNLISTED: &'static str;
    /// The Lease that holds `cluster`'s record.
    fn lease_name(cluster: &str) -> String;
    /// The record as its annotation's JSON, and how many entries were left
    /// out to keep it within a Lease.
    fn encode(record: &Self::Record) -> (String, usize);
    /// The record in an annotation's JSON (what cannot be read is left out).
    fn decode(json: &str) -> Self::Record;
}

/// Cluster -> its record and its Lease's resourceVersion.
type View<R> = HashMap<String, (Arc<R>, String)>;

/// Called with a cluster, its record before and after, when it changed.
type OnChange<R> = Box<dyn Fn(&str, &R, &R) + Send + Sync>;

/// The records of one kind, of every cluster, as the watch last saw them.
pub struct LeaseRecords<K: Kind> {
    api: Api<Lease>,
    view: Mutex<View<K::Record>>,
    on_change: OnceLock<OnChange<K::Record>>,
    /// The watch has had its first full list.
    listed: tokio::sync::watch::Sender<bool>,
}

impl<K: Kind> LeaseRecords<K> {
    /// The records in `namespace` (the hub-controller's own).
    pub fn new(client: kube::Client, namespace: &str) -> Arc<Self> {
        Arc::new(Self {
            api: Api::namespaced(client, namespace),
            view: Mutex::default(),
            on_change: OnceLock::new(),
            listed: tokio::sync::watch::channel(false).0,
        })
    }

    fn view(&self) -> MutexGuard<'_, View<K::Record>> {
        self.view.lock().expect("never poisoned")
    }

    /// Resolves once the watch has had its first full list, or after
    /// `timeout` (the records are then taken in as they come).
    pub async fn wait_listed(&self, timeout: std::time::Duration) {
        let mut rx = self.listed.subscribe();
        if tokio::time::timeout(timeout, rx.wait_for(|l| *l))
            .await
            .is_err()
        {
            tracing::warn!(?timeout, "{} is not listed yet; {}", K::WHAT, K::UNLISTED);
        }
    }

    /// `cluster`'s record and its Lease's resourceVersion (empty: none).
    pub fn record(&self, cluster: &str) -> (Arc<K::Record>, String) {
        self.view().get(cluster).cloned().unwrap_or_default()
    }

    /// The clusters that have a record.
    pub fn clusters(&self) -> Vec<String> {
        self.view().keys().cloned().collect()
    }

    /// Calls `f` whenever a cluster's record changes (set once).
    pub fn on_change(&self, f: impl Fn(&str, &K::Record, &K::Record) + Send + Sync + 'static) {
        let _ = self.on_change.set(Box::new(f));
    }

    /// Keeps the view, until the process ends.
    pub async fn watch(self: Arc<Self>) {
        let config = watcher::Config::default().labels(K::LABEL);
        let stream = watcher::watcher(self.api.clone(), config).default_backoff();
        futures::pin_mut!(stream);
        let mut listed: Option<Vec<String>> = None;
        while let Some(ev) = stream.next().await {
            use watcher::Event as E;
            match ev {
                Err(e) => tracing::warn!(error = %e, "the watch of {} failed; retrying", K::WHAT),
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
        let record = K::decode(&lease_json::<K>(l));
        self.set(
            &cluster,
            Some((record, l.resource_version().unwrap_or_default())),
        );
        Some(cluster)
    }

    /// Puts `cluster`'s record in the view and tells of a change.
    fn set(&self, cluster: &str, next: Option<(K::Record, String)>) {
        let (old, new) = {
            let mut view = self.view();
            let old = view
                .get(cluster)
                .map(|(r, _)| r.clone())
                .unwrap_or_default();
            let new = match next {
                Some((r, version)) => {
                    let r = Arc::new(r);
                    view.insert(cluster.to_string(), (r.clone(), version));
                    r
                }
                None => {
                    view.remove(cluster);
                    Arc::default()
                }
            };
            (old, new)
        };
        if old != new
            && let Some(f) = self.on_change.get()
        {
            f(cluster, &old, &new);
        }
    }

    /// Writes `cluster`'s record over the version `version` of its Lease,
    /// or as a new Lease when `version` is empty; the view has it at once,
    /// as the watch will show it (what did not fit is not there), so that
    /// the next write starts from it.
    pub async fn write(
        &self,
        cluster: &str,
        record: &K::Record,
        version: &str,
    ) -> Result<(), kube::Error> {
        let name = K::lease_name(cluster);
        let (json, left_out) = K::encode(record);
        if left_out > 0 {
            tracing::warn!(
                cluster,
                left_out,
                "{} of the cluster is full: these entries are not kept across a restart",
                K::WHAT
            );
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                resource_version: (!version.is_empty()).then(|| version.to_string()),
                labels: Some([(K::LABEL.to_string(), "true".to_string())].into()),
                annotations: Some(
                    [
                        (CLUSTER_ANNOTATION.to_string(), cluster.to_string()),
                        (K::ANNOTATION.to_string(), json),
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
        let kept = match left_out {
            0 => record.clone(),
            _ => K::decode(&lease_json::<K>(&written)),
        };
        self.set(
            cluster,
            Some((kept, written.resource_version().unwrap_or_default())),
        );
        Ok(())
    }

    /// Deletes `cluster`'s record (nothing there is fine).
    pub async fn delete(&self, cluster: &str) -> Result<(), kube::Error> {
        match self
            .api
            .delete(&K::lease_name(cluster), &Default::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
        self.set(cluster, None);
        Ok(())
    }
}

/// The record's JSON in Lease `l` (empty when none).
fn lease_json<K: Kind>(l: &Lease) -> String {
    l.annotations()
        .get(K::ANNOTATION)
        .cloned()
        .unwrap_or_default()
}
