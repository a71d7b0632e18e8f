//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go
//! does it, so that several replicas can run and only one acts.
//!
//! A lease held by someone else is taken over only after it has not changed
//! for its whole duration, measured on this process's own clock from the
//! moment the change was seen: clocks of different machines are never
//! compared. Every write carries the resourceVersion that was read, so two
//! candidates can never both win.
//!
//! Every call to the API server has a timeout of its own, shorter than the
//! renew deadline: a call that hangs (a frozen connection) must not keep a
//! leader acting past the moment a standby may take over. The leader
//! reports the lease lost at the latest `renew_deadline` after the start of
//! its last successful renewal, which is before the lease `duration` a
//! standby waits.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};

use crate::shutdown::Shutdown;
use crate::task::AbortOnDrop;

/// Which Lease to use and how fast to move.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This candidate's name in `holderIdentity`; unique per process.
    pub identity: String,
    /// How long a lease stays valid without renewal.
    pub duration: Duration,
    /// The leader gives up when it could not renew for this long (must be
    /// shorter than `duration`, so that it stops before anyone takes over).
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The longest one call to the API server may take: half the renew
    /// deadline, so that a hung call leaves time for another attempt.
    pub fn call_timeout(&self) -> Duration {
        self.renew_deadline / 2
    }

    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retries.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a candidate should do about the lease it just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// No lease yet: create it, holding it.
    Create,
    /// Free or expired: take it over.
    Take,
    /// Ours: renew it.
    Renew,
    /// Someone else holds it and it is still valid.
    Wait { holder: String },
}

/// Decides from the lease's holder and whether it has gone unchanged for
/// its whole duration ([`Observer`] measures that).
pub fn decide(holder: Option<&str>, me: &str, expired: bool) -> Next {
    match holder {
        _ if expired => Next::Take,
        None | Some("") => Next::Take,
        Some(h) if h == me => Next::Renew,
        Some(h) => Next::Wait { holder: h.into() },
    }
}

/// Remembers when the lease record last changed, on the local clock.
#[derive(Debug, Default)]
pub struct Observer {
    /// The record, when it was first seen, and the duration it carried.
    last: Option<(Record, Instant, Duration)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew: Option<String>,
    transitions: Option<i32>,
}

impl Observer {
    /// Records `spec` as seen at `now`; returns whether it has gone
    /// unchanged for longer than its lease duration (or `fallback`).
    pub fn observe(&mut self, spec: &LeaseSpec, now: Instant, fallback: Duration) -> bool {
        let record = Record {
            holder: spec.holder_identity.clone(),
            renew: spec.renew_time.as_ref().map(|t| t.0.to_string()),
            transitions: spec.lease_transitions,
        };
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(fallback);
        let since = match &self.last {
            Some((r, at, _)) if *r == record => *at,
            _ => now,
        };
        self.last = Some((record, since, duration));
        now.duration_since(since) > duration
    }

    /// The first instant at which [`Self::observe`] would find the record
    /// last seen expired, if it does not change before; `None` before any.
    pub fn expires_at(&self) -> Option<Instant> {
        self.last
            .as_ref()
            .map(|(_, since, duration)| *since + *duration + Duration::from_millis(1))
    }
}

/// A held lease. Dropping it does not release the lease; call
/// [`Leadership::release`] on a graceful stop.
pub struct Leadership {
    lost: watch::Receiver<bool>,
    renewer: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    config: LeaseConfig,
}

impl Leadership {
    /// Resolves when the lease is lost (not renewed in time, or taken).
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.lost.clone();
        async move {
            let _ = rx.wait_for(|lost| *lost).await;
        }
    }

    /// Stops renewing and hands the lease back, so that another replica
    /// takes over at once instead of after the lease duration.
    pub async fn release(self) {
        self.renewer.abort();
        if *self.lost.borrow() {
            return;
        }
        let timeout = self.config.call_timeout();
        match tokio::time::timeout(timeout, self.release_once()).await {
            Ok(()) => {}
            Err(_) => tracing::warn!(?timeout, "could not release the leader lease in time"),
        }
    }

    async fn release_once(&self) {
        match self.api.get(&self.config.name).await {
            Ok(mut lease) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                if spec.holder_identity.as_deref() != Some(&self.config.identity) {
                    return;
                }
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(MicroTime(Timestamp::now()));
                match self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => tracing::info!(lease = %self.config.name, "leader lease released"),
                    Err(e) => tracing::warn!(error = %e, "could not release the leader lease"),
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not release the leader lease"),
        }
    }
}

/// Waits until this candidate holds the lease; `None` if `shutdown` came
/// first. The lease is then renewed in the background.
///
/// A candidate reads the lease every `retry_period`, and also watches it:
/// the watch dates each renewal when it happens (a poll would see it up to
/// a period late, and so take over up to a period late), the candidate
/// tries again at the very moment the lease it saw expires (not at its
/// next poll), and a released or deleted lease is tried at once.
pub async fn acquire(
    client: kube::Client,
    config: LeaseConfig,
    shutdown: Shutdown,
) -> Option<Leadership> {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let observer = Arc::new(Mutex::new(Observer::default()));
    let freed = Arc::new(Notify::new());
    let watching = watch_lease(&api, &config, observer.clone(), freed.clone());
    let mut last_holder = String::new();
    let acquired = loop {
        let started = Instant::now();
        let attempt = tokio::select! {
            a = tokio::time::timeout(config.call_timeout(), try_acquire_or_renew(&api, &config, &observer)) => a,
            _ = shutdown.clone().wait() => return None,
        };
        match attempt {
            Err(_) => {
                tracing::warn!(lease = %config.name, timeout = ?config.call_timeout(), "the API server did not answer about the leader lease in time; retrying")
            }
            Ok(Ok(Next::Wait { holder })) => {
                if holder != last_holder {
                    tracing::info!(lease = %config.name, %holder, "another replica leads; standing by");
                    last_holder = holder;
                }
            }
            Ok(Ok(_)) => {
                tracing::info!(lease = %config.name, identity = %config.identity, "became the leader");
                break started;
            }
            // Another candidate wrote first (both created it, or both took
            // it over): it leads; read again.
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                tracing::debug!(lease = %config.name, "another candidate wrote the leader lease first");
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %config.name, namespace = %config.namespace, error = %e,
                "cannot read or write the leader lease; check the namespace exists and the RBAC allows leases")
            }
        }
        // An expiry already past (the attempt failed, or lost a race)
        // waits for the next poll: never a tight loop against the server.
        let now = Instant::now();
        let next_poll = now + config.retry_period;
        let wake = match lock(&observer).expires_at() {
            Some(e) if e > now => e.min(next_poll),
            _ => next_poll,
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = freed.notified() => {}
            _ = shutdown.clone().wait() => return None,
        }
        if shutdown.is_down() {
            return None;
        }
    };
    drop(watching);
    let (tx, lost) = watch::channel(false);
    let renewer = tokio::spawn(renew(api.clone(), config.clone(), observer, acquired, tx));
    Some(Leadership {
        lost,
        renewer,
        api,
        config,
    })
}

/// Watches the lease named in `config` while a candidate waits: every
/// change is recorded in `observer` as it happens; a lease released (no
/// holder) or deleted wakes `freed`. Stops when dropped.
fn watch_lease(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observer: Arc<Mutex<Observer>>,
    freed: Arc<Notify>,
) -> AbortOnDrop<()> {
    let params = watcher::Config::default().fields(&format!("metadata.name={}", config.name));
    let stream = watcher(api.clone(), params).default_backoff();
    let fallback = config.duration;
    let name = config.name.clone();
    AbortOnDrop(tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                    let spec = l.spec.unwrap_or_default();
                    lock(&observer).observe(&spec, Instant::now(), fallback);
                    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
                        freed.notify_one();
                    }
                }
                Ok(watcher::Event::Delete(_)) => freed.notify_one(),
                Ok(_) => {}
                // The polls go on meanwhile; the watch retries with backoff.
                Err(e) => {
                    tracing::debug!(lease = %name, error = %e, "watch of the leader lease failed; retrying")
                }
            }
        }
    }))
}

fn lock(observer: &Mutex<Observer>) -> std::sync::MutexGuard<'_, Observer> {
    observer.lock().unwrap_or_else(|e| e.into_inner())
}

/// Renews until the lease is taken or cannot be renewed within the renew
/// deadline, counted from the start of the last successful renewal
/// (`renewed`); then reports it lost. No call may outlive the deadline.
async fn renew(
    api: Api<Lease>,
    config: LeaseConfig,
    observer: Arc<Mutex<Observer>>,
    mut renewed: Instant,
    lost: watch::Sender<bool>,
) {
    let left = |renewed: Instant| config.renew_deadline.saturating_sub(renewed.elapsed());
    loop {
        tokio::time::sleep(config.retry_period.min(left(renewed))).await;
        let remaining = left(renewed);
        if remaining.is_zero() {
            tracing::error!(lease = %config.name, deadline = ?config.renew_deadline, "could not renew the leader lease in time");
            break;
        }
        let started = Instant::now();
        let attempt = tokio::time::timeout(
            config.call_timeout().min(remaining),
            try_acquire_or_renew(&api, &config, &observer),
        )
        .await;
        match attempt {
            Ok(Ok(Next::Wait { holder })) => {
                tracing::error!(lease = %config.name, %holder, "leader lease taken by another replica");
                break;
            }
            Ok(Ok(_)) => renewed = started,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not renew the leader lease; retrying");
            }
            Err(_) => {
                tracing::warn!(lease = %config.name, "the API server did not answer the lease renewal in time; retrying");
            }
        }
    }
    let _ = lost.send(true);
}

/// One round: read the lease and create, take or renew it when that is the
/// decision. Returns the decision that was carried out.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observer: &Mutex<Observer>,
) -> Result<Next, kube::Error> {
    let now = Timestamp::now();
    let seconds = i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        api.create(&PostParams::default(), &lease).await?;
        return Ok(Next::Create);
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let expired = lock(observer).observe(spec, Instant::now(), config.duration);
    let next = decide(spec.holder_identity.as_deref(), &config.identity, expired);
    match &next {
        Next::Wait { .. } => return Ok(next),
        Next::Take => {
            spec.holder_identity = Some(config.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        Next::Renew | Next::Create => {}
    }
    spec.lease_duration_seconds = Some(seconds);
    spec.renew_time = Some(MicroTime(now));
    // The resourceVersion read above makes a concurrent write fail (409).
    api.replace(&config.name, &PostParams::default(), &lease)
        .await?;
    Ok(next)
}

/// A unique identity for this process: [`pod_name`] plus a random suffix
/// so two processes never share one.
pub fn identity() -> String {
    let base = pod_name();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{base}_{:08x}", nanos ^ std::process::id().rotate_left(16))
}

/// The pod name when set (`POD_NAME`), else the host name (a pod's host
/// name is its name).
pub fn pod_name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "argocd-pull".into())
}

#[cfg(test)]
mod tests;
