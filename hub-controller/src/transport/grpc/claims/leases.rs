//! One watch on both kinds of Lease (by label) keeps the view: claims by
//! cluster, presences by identity with when each last changed.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};

use super::{CLUSTER_ANNOTATION, Claims, LIVE_ADDRESS_ANNOTATION, ROLE_LABEL, version_of};

impl Claims {
    pub(super) async fn watch(self: Arc<Self>) {
        let config = watcher::Config::default().labels(ROLE_LABEL);
        let stream = watcher::watcher(self.api.clone(), config).default_backoff();
        futures::pin_mut!(stream);
        let mut listing: Option<(HashSet<String>, HashSet<String>)> = None;
        while let Some(ev) = stream.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(error = %e, "the Lease watch failed; retrying");
                    continue;
                }
            };
            use watcher::Event as E;
            match ev {
                E::Init => listing = Some(Default::default()),
                E::InitApply(l) => {
                    if let Some((claims, presences)) = &mut listing {
                        match self.apply(&l) {
                            Some(Kind::Claim(c)) => {
                                claims.insert(c);
                            }
                            Some(Kind::Presence(p)) => {
                                presences.insert(p);
                            }
                            None => {}
                        }
                    }
                }
                E::InitDone => {
                    if let Some((claims, presences)) = listing.take() {
                        let gone = self.view().listed(&claims, &presences);
                        for c in gone {
                            self.record(&c, None, None);
                        }
                    }
                    self.listed.store(true, Ordering::SeqCst);
                }
                E::Apply(l) => {
                    self.apply(&l);
                }
                E::Delete(l) => match kind_of(&l) {
                    Some(Kind::Claim(c)) => self.record(&c, None, Some(version_of(&l))),
                    Some(Kind::Presence(id)) => self.view().presence_gone(&id),
                    None => {}
                },
            }
        }
    }

    fn apply(&self, l: &Lease) -> Option<Kind> {
        let kind = kind_of(l)?;
        match &kind {
            Kind::Claim(c) => self.record(c, Some(l), None),
            Kind::Presence(id) => self.view().presence_seen(
                id,
                l.spec.clone().unwrap_or_default(),
                l.annotations().get(LIVE_ADDRESS_ANNOTATION).cloned(),
                Instant::now(),
                self.config.presence_duration,
            ),
        }
        Some(kind)
    }
}

enum Kind {
    Claim(String),
    Presence(String),
}

fn kind_of(l: &Lease) -> Option<Kind> {
    match l.labels().get(ROLE_LABEL).map(String::as_str) {
        Some("claim") => l
            .annotations()
            .get(CLUSTER_ANNOTATION)
            .map(|c| Kind::Claim(c.clone())),
        Some("presence") => l
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .map(Kind::Presence),
        _ => None,
    }
}
