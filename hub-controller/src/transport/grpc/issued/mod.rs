//! A certificate speaks for cluster X only if it was issued on a request
//! made by X's own OCM identity (docs/security.md, "Agent identity").
//!
//! OCM's addon-manager approves and signs every CSR of our signer, with
//! the subject the request asks for; the API server records who filed it.
//! Every replica watches the CSRs of our signer and judges each signed one
//! ([`requester::judge`]); the leader records what was issued on the
//! cluster's own request in the [`record`] ConfigMaps, which outlive the
//! CSRs (deleted after about an hour) and hub restarts, and which every
//! replica watches. A connection's certificate is accepted when it is
//! recorded for its cluster, or seen issued on the cluster's own request,
//! or was issued before the hub recorded anything (the upgrade grace, at
//! most until it expires: OCM issues them for 24 h); otherwise refused
//! ([`record::decide`]). A CSR whose requester is not the cluster it names
//! is logged with its requester and gets a Warning Event, and its
//! certificate is refused naming both.
//!
//! With `--grpc-certificate-binding=off` (the default when the hub does not
//! keep OCM's signing CA: certificates then come from the operator's own
//! PKI) none of this runs and the client CA alone decides.

mod leader;
pub mod record;
pub mod requester;

pub use leader::lead;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};

use super::identity::{IdentityMap, Peer};
use record::{Accepted, Denied, Entry, Known, Presented};
use requester::{Issue, Judgement};

/// Which certificates the hub accepts for a cluster (flag
/// `--grpc-certificate-binding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Binding {
    /// `csr` when the hub keeps OCM's signing CA
    /// (`--grpc-manage-certificates`), `off` otherwise.
    Auto,
    /// Only certificates issued on a CSR filed by the cluster's own OCM
    /// identity.
    Csr,
    /// Any certificate the client CA signed.
    Off,
}

/// How often the leader prunes expired entries when nothing else happens.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// Refused CSRs remembered (for the refusal's message and the Event).
const MAX_REFUSED: usize = 4096;

/// What the hub knows of issued certificates, shared by the connections.
pub struct Issued {
    on: bool,
    namespace: String,
    identities: IdentityMap,
    state: Mutex<State>,
    loaded: watch::Sender<bool>,
    /// Something for the leader to write.
    dirty: Notify,
}

#[derive(Default)]
struct State {
    /// Per shard: when recording began (`None`: not created yet) and its
    /// entries.
    shards: HashMap<u32, Shard>,
    /// Shards whose watch has listed.
    shards_listed: HashSet<u32>,
    csrs_listed: bool,
    /// From the CSR watch, by fingerprint.
    issued: HashMap<String, Issue>,
    refused: HashMap<String, (Issue, String)>,
    /// CSRs refused that the leader has published an Event for.
    evented: HashSet<String>,
    /// Certificates let in under the grace, logged once each.
    graced: HashSet<String>,
}

#[derive(Clone, Debug, Default)]
struct Shard {
    since: Option<i64>,
    entries: HashMap<String, Entry>,
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("on", &self.on)
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Issued {
    /// The record kept in `namespace`; `on: false` accepts every
    /// certificate the client CA signed.
    pub fn new(on: bool, namespace: &str, identities: IdentityMap) -> Arc<Self> {
        Arc::new(Self {
            on,
            namespace: namespace.into(),
            identities,
            state: Mutex::default(),
            loaded: watch::channel(!on).0,
            dirty: Notify::new(),
        })
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Resolves once the CSRs and every shard have been read (at once
    /// when off).
    pub async fn wait_loaded(&self) {
        let mut rx = self.loaded.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("never poisoned")
    }

    /// Whether `peer`'s certificate may speak for `peer.cluster`.
    pub fn check(&self, peer: &Peer) -> Result<Accepted, Denied> {
        if !self.on {
            return Ok(Accepted::Grace { since: 0 });
        }
        let loaded = *self.loaded.borrow();
        let mut state = self.state();
        let shard = state.shards.get(&record::shard_of(&peer.cluster));
        let known = Known {
            recorded: shard.and_then(|s| s.entries.get(&peer.fingerprint)),
            issued: state.issued.get(&peer.fingerprint),
            refused: state
                .refused
                .get(&peer.fingerprint)
                .map(|(i, why)| (i, why.as_str())),
            since: shard.and_then(|s| s.since).filter(|_| loaded),
        };
        let decided = record::decide(
            &Presented {
                cluster: &peer.cluster,
                fingerprint: &peer.fingerprint,
                not_before: peer.not_before,
            },
            &known,
            now(),
        );
        if let Ok(Accepted::Grace { since }) = &decided
            && state.graced.insert(peer.fingerprint.clone())
        {
            tracing::warn!(
                cluster = %peer.cluster,
                certificate = %peer.fingerprint,
                not_before = peer.not_before,
                not_after = peer.not_after,
                recording_since = since,
                "accepted a certificate issued before this hub recorded issued certificates (the upgrade grace): it is accepted until it expires, its renewal must be issued on the cluster's own request"
            );
        }
        decided
    }

    /// Takes in one CSR of our signer (from the watch).
    fn judge(&self, csr: &CertificateSigningRequest) -> Judgement {
        let groups = csr.spec.groups.clone().unwrap_or_default();
        let name = csr.metadata.name.clone().unwrap_or_default();
        let label = csr
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(requester::CLUSTER_LABEL))
            .cloned();
        let certificate = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .map(|c| c.0.clone());
        requester::judge(
            &requester::Csr {
                name: &name,
                label_cluster: label.as_deref(),
                username: csr.spec.username.as_deref().unwrap_or_default(),
                groups: &groups,
                certificate: certificate.as_deref(),
            },
            &self.identities,
        )
    }

    fn take(&self, csr: &CertificateSigningRequest) {
        let now = now();
        match self.judge(csr) {
            Judgement::Pending => {}
            Judgement::Unreadable(e) => {
                tracing::warn!(csr = %csr.metadata.name.as_deref().unwrap_or_default(), error = %e, "cannot read the certificate issued on a CSR of the argocd-pull signer; it is never accepted")
            }
            Judgement::Issued(issue) => {
                if issue.not_after <= now {
                    return;
                }
                let mut state = self.state();
                if state.issued.contains_key(&issue.fingerprint) {
                    return;
                }
                tracing::info!(
                    cluster = issue.cluster.as_deref().unwrap_or_default(),
                    csr = %issue.csr,
                    requester = %issue.requester,
                    certificate = %issue.fingerprint,
                    "certificate issued on the cluster's own request"
                );
                let cluster = issue.cluster.clone();
                state.issued.insert(issue.fingerprint.clone(), issue);
                // A klusterlet may file CSRs for its own cluster in a loop
                // and OCM signs each: keep what the record keeps, the
                // cluster's latest few, so no cluster grows every replica.
                keep_latest(&mut state.issued, |i| i.cluster == cluster);
                drop(state);
                self.dirty.notify_one();
            }
            Judgement::Refused(issue, why) => {
                if issue.not_after <= now {
                    return;
                }
                let mut state = self.state();
                if state.refused.contains_key(&issue.fingerprint) {
                    return;
                }
                tracing::warn!(
                    claimed = issue.cluster.as_deref().unwrap_or_default(),
                    csr = %issue.csr,
                    requester = %issue.requester,
                    certificate = %issue.fingerprint,
                    %why,
                    "OCM issued a certificate of the argocd-pull signer that the hub never accepts"
                );
                state.issued.remove(&issue.fingerprint);
                if state.refused.len() >= MAX_REFUSED {
                    state.refused.retain(|_, (i, _)| i.not_after > now);
                    if state.refused.len() >= MAX_REFUSED {
                        // Still refused (not recorded), only without naming
                        // its requester.
                        return;
                    }
                }
                state
                    .refused
                    .insert(issue.fingerprint.clone(), (issue, why));
                drop(state);
                self.dirty.notify_one();
            }
        }
    }

    fn apply_shard(&self, index: u32, cm: Option<&ConfigMap>) {
        let shard = match cm {
            None => Shard::default(),
            Some(cm) => {
                let since = cm
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(record::SINCE_ANNOTATION))
                    .and_then(|s| s.parse().ok());
                let (entries, errors) = record::parse(cm.data.as_ref().unwrap_or(&BTreeMap::new()));
                for e in errors {
                    tracing::error!(configmap = %record::shard_name(index), "record of issued certificates: {e}");
                }
                if since.is_none() {
                    tracing::error!(configmap = %record::shard_name(index), annotation = record::SINCE_ANNOTATION, "record of issued certificates without the time it began; its clusters get no grace");
                }
                Shard {
                    since: since.or(Some(i64::MIN)),
                    entries,
                }
            }
        };
        let mut state = self.state();
        state.shards.insert(index, shard);
        state.shards_listed.insert(index);
        self.update_loaded(&state);
    }

    fn update_loaded(&self, state: &State) {
        let loaded = state.csrs_listed
            && (0..record::SHARDS).all(|i| {
                state.shards_listed.contains(&i)
                    && state.shards.get(&i).is_some_and(|s| s.since.is_some())
            });
        if loaded != *self.loaded.borrow() {
            self.loaded.send_replace(loaded);
            tracing::info!(loaded, "record of issued certificates");
        }
    }
}

/// Keeps `issued` from the CSRs of our signer and the record ConfigMaps
/// until `shutdown` (every replica).
pub async fn run(
    issued: Arc<Issued>,
    client: kube::Client,
    shutdown: impl std::future::Future<Output = ()>,
) {
    if !issued.on {
        tracing::info!(
            "client certificates are not bound to their CSR's requester (--grpc-certificate-binding=off): the client CA alone decides"
        );
        return;
    }
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!(
        "spec.signerName={}",
        argocd_pull_addon::SIGNER_NAME
    ));
    let csr_events = watcher::watcher(csrs, config)
        .default_backoff()
        .map(Change::Csr);
    let cms: Api<ConfigMap> = Api::namespaced(client, &issued.namespace);
    let shards = (0..record::SHARDS).map(|i| {
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", record::shard_name(i)));
        watcher::watcher(cms.clone(), config)
            .default_backoff()
            .map(move |e| Change::Shard(i, e))
            .boxed()
    });
    let events = futures::stream::select_all(std::iter::once(csr_events.boxed()).chain(shards))
        .take_until(shutdown);
    let mut events = std::pin::pin!(events);
    let mut listed: HashMap<u32, Option<ConfigMap>> = HashMap::new();
    while let Some(ev) = events.next().await {
        match ev {
            Change::Csr(Err(e)) => {
                tracing::error!(error = %e, "cannot watch the CSRs of the argocd-pull signer; retrying (new certificates are not accepted until it works)")
            }
            Change::Csr(Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr))) => {
                issued.take(&csr)
            }
            Change::Csr(Ok(watcher::Event::InitDone)) => {
                let mut state = issued.state();
                state.csrs_listed = true;
                issued.update_loaded(&state);
            }
            Change::Csr(Ok(_)) => {}
            Change::Shard(i, Err(e)) => {
                tracing::error!(configmap = %record::shard_name(i), error = %e, "cannot read the record of issued certificates; retrying")
            }
            Change::Shard(i, Ok(ev)) => match ev {
                watcher::Event::Init => {
                    listed.insert(i, None);
                }
                watcher::Event::InitApply(cm) => {
                    listed.insert(i, Some(cm));
                }
                watcher::Event::InitDone => {
                    issued.apply_shard(i, listed.remove(&i).flatten().as_ref())
                }
                watcher::Event::Apply(cm) => issued.apply_shard(i, Some(&cm)),
                watcher::Event::Delete(_) => {
                    tracing::warn!(configmap = %record::shard_name(i), "record of issued certificates deleted: the leader creates it again, and its clusters' certificates issued before are accepted until they expire");
                    issued.apply_shard(i, None);
                    issued.dirty.notify_one();
                }
            },
        }
    }
}

enum Change {
    Csr(Result<watcher::Event<CertificateSigningRequest>, watcher::Error>),
    Shard(u32, Result<watcher::Event<ConfigMap>, watcher::Error>),
}

/// Drops from `issued` all but the [`record::MAX_PER_CLUSTER`] certificates
/// of those `same` picks that expire last (the record's own rule).
fn keep_latest(issued: &mut HashMap<String, Issue>, same: impl Fn(&Issue) -> bool) {
    let mut ours: Vec<(i64, String)> = issued
        .values()
        .filter(|i| same(i))
        .map(|i| (i.not_after, i.fingerprint.clone()))
        .collect();
    if ours.len() <= record::MAX_PER_CLUSTER {
        return;
    }
    ours.sort_unstable_by(|a, b| b.cmp(a));
    for (_, fp) in ours.drain(record::MAX_PER_CLUSTER..) {
        issued.remove(&fp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_keeps_only_its_latest_certificates() {
        let issue = |cluster: &str, not_after: i64| Issue {
            csr: format!("csr-{cluster}-{not_after}"),
            requester: format!("system:open-cluster-management:{cluster}:x"),
            fingerprint: format!("{cluster}-{not_after}"),
            not_before: not_after - 86_400,
            not_after,
            cluster: Some(cluster.into()),
        };
        let mut issued: HashMap<String, Issue> = HashMap::new();
        issued.insert("other-1".into(), issue("other", 1));
        for t in 0..(record::MAX_PER_CLUSTER as i64 + 5) {
            let i = issue("c1", 100 + t);
            issued.insert(i.fingerprint.clone(), i);
            keep_latest(&mut issued, |i| i.cluster.as_deref() == Some("c1"));
        }
        let mut kept: Vec<i64> = issued
            .values()
            .filter(|i| i.cluster.as_deref() == Some("c1"))
            .map(|i| i.not_after)
            .collect();
        kept.sort();
        let first = 100 + 5;
        assert_eq!(
            kept,
            (first..first + record::MAX_PER_CLUSTER as i64).collect::<Vec<_>>()
        );
        assert!(issued.contains_key("other-1"), "another cluster's stays");
    }
}
