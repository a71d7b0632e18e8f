//! This replica's presence Lease: renewed every `renew_every`; behind by
//! `renew_deadline`, this replica writes for no cluster until it renews and
//! has read its claims back. Also who else died (their clusters are looked
//! at again) and, on the leader, the Leases of replicas long dead and the
//! claims no live replica has held for as long.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use super::view::Deaths;
use super::{
    CLUSTER_ANNOTATION, Claims, ClaimsConfig, LIVE_ADDRESS_ANNOTATION, ROLE_LABEL, delete_at, now,
    rule,
};

impl Claims {
    /// Keeps this replica's presence and the view until `shutdown`
    /// ([`Self::retire`] then deletes the presence).
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let watching = tokio::spawn(self.clone().watch());
        tokio::pin!(shutdown);
        let mut presence = Presence::new(self.api.clone(), &self.config);
        let mut last_renewal = Instant::now();
        loop {
            let started = Instant::now();
            // A slow API server still counts until the deadline: a renewal
            // abandoned early is one more suspension, and more load.
            let patience = self
                .config
                .renew_deadline
                .saturating_sub(last_renewal.elapsed())
                .max(self.config.renew_deadline / 2);
            match tokio::time::timeout(patience, presence.renew()).await {
                Ok(Ok(())) => {
                    last_renewal = started;
                    if *self.suspended.borrow() {
                        self.resume().await;
                    }
                    if !*self.synced.borrow() && self.listed.load(Ordering::SeqCst) {
                        self.synced.send_replace(true);
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew this replica's presence"),
                Err(_) => tracing::warn!(
                    "the API server did not answer about this replica's presence in time"
                ),
            }
            if last_renewal.elapsed() > self.config.renew_deadline && !*self.suspended.borrow() {
                tracing::error!(deadline = ?self.config.renew_deadline, "could not renew this replica's presence in time: others may take its clusters, so it writes for none until it renews");
                self.suspended.send_replace(true);
            }
            self.check_dead().await;
            // Until the next renewal, look again the moment a presence
            // seen alive would expire: its clusters are taken over then,
            // not up to a renewal period later.
            let next_renewal = Instant::now() + self.config.renew_every;
            loop {
                let wake = self
                    .next_death()
                    .map_or(next_renewal, |d| d.min(next_renewal));
                tokio::select! {
                    _ = &mut shutdown => {
                        watching.abort();
                        return;
                    }
                    _ = tokio::time::sleep_until(wake.into()) => {}
                }
                if Instant::now() >= next_renewal {
                    break;
                }
                self.check_dead().await;
            }
        }
    }

    /// When the first presence now alive would expire if not renewed.
    fn next_death(&self) -> Option<Instant> {
        self.view().next_death(&self.config.identity)
    }

    /// The presence is renewed again after writes were suspended: reads
    /// back every claim this replica held (another may have taken it
    /// meanwhile, and the watch may lag), then writes again for those it
    /// still holds.
    async fn resume(&self) {
        let held = self.view().held_by(&self.config.identity);
        // One list, not a read per claim: under the slow API server that
        // suspended the writes, a thousand reads would slow it further.
        let params = ListParams::default().labels(&format!("{ROLE_LABEL}=claim"));
        let listed = match self.api.list(&params).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the claims back; still not writing");
                return;
            }
        };
        let by_cluster: HashMap<&str, &Lease> = listed
            .items
            .iter()
            .filter_map(|l| Some((l.annotations().get(CLUSTER_ANNOTATION)?.as_str(), l)))
            .collect();
        for cluster in &held {
            self.record(cluster, by_cluster.get(cluster.as_str()).copied(), None);
        }
        self.suspended.send_replace(false);
        tracing::info!(
            claims = held.len(),
            "this replica's presence is renewed again: writing for the clusters it still holds"
        );
        for cluster in held {
            let _ = self.changed.send(cluster);
        }
        self.notify.notify_waiters();
    }

    /// Deletes this replica's presence once it has stopped writing: the
    /// clusters it still holds are taken over at once, not after the
    /// presence's duration.
    pub async fn retire(&self) {
        let presence = Presence::new(self.api.clone(), &self.config);
        presence.delete(self.config.renew_deadline / 2).await;
    }

    /// Deletes `cluster`'s claim, as of `version` (a replica that took it
    /// since changed the version: then nothing is deleted).
    async fn delete_abandoned(&self, cluster: &str, version: u64) {
        match self
            .api
            .delete(&rule::claim_name(cluster), &delete_at(version))
            .await
        {
            Ok(_) => {
                tracing::info!(%cluster, "deleted a claim no live replica has held for long");
                self.record(cluster, None, Some(version));
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => tracing::warn!(%cluster, error = %e, "cannot delete an abandoned claim"),
        }
    }

    /// Replicas that died since the last check: their clusters are now
    /// acted for by the leader (or taken by their agents' new replicas).
    /// The leader also deletes Leases of replicas long dead.
    async fn check_dead(&self) {
        let Deaths {
            newly_dead,
            clusters,
            stale,
            abandoned,
        } = {
            let me = self.me();
            self.view()
                .check(&me, Instant::now(), self.config.abandoned_after)
        };
        for id in &newly_dead {
            tracing::warn!(replica = %id, "a replica stopped renewing its presence: its clusters are taken over");
        }
        for c in clusters {
            let _ = self.changed.send(c);
        }
        if !newly_dead.is_empty() {
            self.notify.notify_waiters();
        }
        if self.leader.load(Ordering::SeqCst) {
            for name in stale {
                let _ = self.api.delete(&name, &DeleteParams::default()).await;
            }
            for (cluster, version) in abandoned {
                self.delete_abandoned(&cluster, version).await;
            }
        }
    }
}

/// This replica's presence Lease, as last written.
struct Presence {
    api: Api<Lease>,
    identity: String,
    live_address: Option<String>,
    duration: Duration,
    lease: Option<Lease>,
}

impl Presence {
    fn new(api: Api<Lease>, config: &ClaimsConfig) -> Self {
        Self {
            api,
            identity: config.identity.clone(),
            live_address: config.live_address.clone(),
            duration: config.presence_duration,
            lease: None,
        }
    }

    /// Deletes the presence, waiting `within` at most.
    async fn delete(&self, within: Duration) {
        let name = rule::presence_name(&self.identity);
        let params = DeleteParams::default();
        let call = self.api.delete(&name, &params);
        match tokio::time::timeout(within, call).await {
            Ok(Ok(_)) => {
                tracing::info!("this replica's presence is deleted: its clusters go to the others")
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "could not delete this replica's presence"),
            Err(_) => tracing::warn!("could not delete this replica's presence in time"),
        }
    }

    /// Writes the presence with a new renew time (created if there is
    /// none); on a conflict it is read again, for the next renewal.
    async fn renew(&mut self) -> Result<(), kube::Error> {
        let name = rule::presence_name(&self.identity);
        let presence = &mut self.lease;
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            renew_time: Some(now()),
            ..Default::default()
        };
        let written = match presence.take() {
            Some(mut l) => {
                l.spec = Some(spec);
                let annotations = l.annotations_mut();
                match &self.live_address {
                    Some(a) => annotations.insert(LIVE_ADDRESS_ANNOTATION.into(), a.clone()),
                    None => annotations.remove(LIVE_ADDRESS_ANNOTATION),
                };
                match self.api.replace(&name, &PostParams::default(), &l).await {
                    Ok(l) => l,
                    Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                        // Read again next time.
                        *presence = self.api.get_opt(&name).await?;
                        return Err(kube::Error::Api(s));
                    }
                    Err(e) => {
                        *presence = Some(l);
                        return Err(e);
                    }
                }
            }
            None => {
                let l = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some([(ROLE_LABEL.to_string(), "presence".to_string())].into()),
                        annotations: self
                            .live_address
                            .clone()
                            .map(|a| [(LIVE_ADDRESS_ANNOTATION.to_string(), a)].into()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                match self.api.create(&PostParams::default(), &l).await {
                    Ok(l) => l,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        *presence = self.api.get_opt(&name).await?;
                        return Err(kube::Error::Api(s));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        *presence = Some(written);
        Ok(())
    }
}
