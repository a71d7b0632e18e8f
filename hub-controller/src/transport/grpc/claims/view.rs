//! This replica's view of the claims and presences, as the Lease watch
//! and its own writes feed it: pure, without locks or API calls, so that
//! what it answers (is a holder alive, which replicas died, which claims
//! are abandoned) is tested with plain values. [`super::Claims`] holds it
//! under a lock and does the I/O.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::ResourceExt;

use argocd_pull_runtime::lease::Observer;

use super::rule::{self, Claim};
use super::{WANTED_BY_ANNOTATION, version_of};

#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    wanted_by: Option<String>,
    version: u64,
}

/// Who is asking, for the answers that depend on it.
pub struct Me<'a> {
    pub identity: &'a str,
    /// This replica's writes are suspended (its presence not renewed in
    /// time): it is not alive to itself either.
    pub suspended: bool,
    /// A presence unchanged this long is dead.
    pub presence_duration: Duration,
}

/// What one look at the presences found ([`View::check`]).
#[derive(Debug, Default, PartialEq)]
pub struct Deaths {
    /// Replicas found dead now.
    pub newly_dead: Vec<String>,
    /// The clusters they held.
    pub clusters: Vec<String>,
    /// Presence Leases of replicas long dead, to delete.
    pub stale: Vec<String>,
    /// Claims without a live holder for long, with their version.
    pub abandoned: Vec<(String, u64)>,
}

#[derive(Default)]
pub struct View {
    /// Claims by cluster.
    claims: HashMap<String, Record>,
    /// Presences by identity: the Lease spec and when it last changed.
    presences: HashMap<String, (LeaseSpec, Observer)>,
    /// Where each replica's live endpoint is, as its presence says.
    live_addresses: HashMap<String, String>,
    /// Identities found dead, since when.
    dead: HashMap<String, Instant>,
    /// Claims without a live holder, since when.
    orphans: rule::Orphans,
}

impl View {
    /// Whether the replica `identity` is alive at `at`.
    fn alive(&mut self, me: &Me, identity: &str, at: Instant) -> bool {
        if identity == me.identity {
            return !me.suspended;
        }
        match self.presences.get_mut(identity) {
            Some((spec, observer)) => !observer.observe(spec, at, me.presence_duration),
            None => false,
        }
    }

    /// `cluster`'s claim as [`rule`] reads it.
    pub fn claim(&mut self, me: &Me, cluster: &str, at: Instant) -> Option<Claim<'_>> {
        let holder = self.claims.get(cluster)?.holder.clone();
        let alive = holder.as_deref().is_some_and(|h| self.alive(me, h, at));
        let r = self.claims.get(cluster)?;
        Some(Claim {
            holder: r.holder.as_deref(),
            holder_alive: alive,
            wanted_by: r.wanted_by.as_deref(),
        })
    }

    /// The replica other than `me` that holds `cluster`'s claim and is
    /// alive at `at`, with its live endpoint's address, if it has one.
    pub fn live_peer(&mut self, me: &Me, cluster: &str, at: Instant) -> Option<(String, String)> {
        let holder = self.claims.get(cluster)?.holder.clone()?;
        if holder == me.identity || !self.alive(me, &holder, at) {
            return None;
        }
        let address = self.live_addresses.get(&holder)?.clone();
        Some((holder, address))
    }

    /// Whether a claim of `cluster` is known.
    pub fn knows(&self, cluster: &str) -> bool {
        self.claims.contains_key(cluster)
    }

    /// The version of `cluster`'s claim if `identity` holds it.
    pub fn held_version(&self, identity: &str, cluster: &str) -> Option<u64> {
        self.claims
            .get(cluster)
            .filter(|r| r.holder.as_deref() == Some(identity))
            .map(|r| r.version)
    }

    /// The clusters `identity` holds.
    pub fn held_by(&self, identity: &str) -> Vec<String> {
        self.claims
            .iter()
            .filter(|(_, r)| r.holder.as_deref() == Some(identity))
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Records a claim as read or written (`None`: gone, as of
    /// `deleted_version` if known); newer versions only. Returns whether
    /// the record changed (its holder, who asked for it, or its version).
    pub fn record(
        &mut self,
        cluster: &str,
        lease: Option<&Lease>,
        deleted_version: Option<u64>,
    ) -> bool {
        let before = self.claims.get(cluster).cloned();
        match lease {
            Some(l) => {
                let new = Record {
                    holder: l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
                    wanted_by: l.annotations().get(WANTED_BY_ANNOTATION).cloned(),
                    version: version_of(l),
                };
                if before.as_ref().is_some_and(|b| b.version > new.version) {
                    return false;
                }
                self.claims.insert(cluster.to_string(), new);
            }
            None => {
                if before
                    .as_ref()
                    .is_some_and(|b| deleted_version.is_some_and(|d| b.version > d))
                {
                    return false;
                }
                self.claims.remove(cluster);
            }
        }
        before.as_ref() != self.claims.get(cluster)
    }

    /// A presence Lease as the watch saw it at `at`, with the live address
    /// it names.
    pub fn presence_seen(
        &mut self,
        id: &str,
        spec: LeaseSpec,
        live_address: Option<String>,
        at: Instant,
        duration: Duration,
    ) {
        match live_address {
            Some(a) => self.live_addresses.insert(id.to_string(), a),
            None => self.live_addresses.remove(id),
        };
        let entry = self
            .presences
            .entry(id.to_string())
            .or_insert_with(|| (spec.clone(), Observer::default()));
        entry.1.observe(&spec, at, duration);
        entry.0 = spec;
    }

    /// A presence Lease was deleted.
    pub fn presence_gone(&mut self, id: &str) {
        self.presences.remove(id);
        self.live_addresses.remove(id);
        self.dead.remove(id);
    }

    /// A full list of the Leases: keeps only the presences listed, and
    /// returns the clusters whose claim was not listed (to record gone).
    pub fn listed(&mut self, claims: &HashSet<String>, presences: &HashSet<String>) -> Vec<String> {
        self.presences.retain(|id, _| presences.contains(id));
        self.live_addresses.retain(|id, _| presences.contains(id));
        self.dead.retain(|id, _| presences.contains(id));
        self.claims
            .keys()
            .filter(|c| !claims.contains(*c))
            .cloned()
            .collect()
    }

    /// When the first presence of another replica now alive would expire
    /// if not renewed.
    pub fn next_death(&self, me: &str) -> Option<Instant> {
        self.presences
            .iter()
            .filter(|(id, _)| *id != me && !self.dead.contains_key(*id))
            .filter_map(|(_, (_, observer))| observer.expires_at())
            .min()
    }

    /// Looks at every presence and claim at `at`: the replicas that died
    /// since the last look and the clusters they held, the presences dead
    /// for ten durations, and the claims without a live holder for longer
    /// than `abandoned_after`.
    pub fn check(&mut self, me: &Me, at: Instant, abandoned_after: Duration) -> Deaths {
        let mut deaths = Deaths::default();
        let long = me.presence_duration * 10;
        let ids: Vec<String> = self.presences.keys().cloned().collect();
        for id in ids {
            if self.alive(me, &id, at) {
                self.dead.remove(&id);
                continue;
            }
            match self.dead.get(&id) {
                None => {
                    self.dead.insert(id.clone(), at);
                    deaths.newly_dead.push(id);
                }
                Some(since) if at.duration_since(*since) > long => {
                    deaths.stale.push(rule::presence_name(&id))
                }
                Some(_) => {}
            }
        }
        deaths.clusters = self
            .claims
            .iter()
            .filter(|(_, r)| {
                r.holder
                    .as_ref()
                    .is_some_and(|h| deaths.newly_dead.contains(h))
            })
            .map(|(c, _)| c.clone())
            .collect();
        // Claims whose holder has been gone as long: their agent never
        // came back (its cluster was deleted, or moved to ManifestWork).
        let holders: Vec<(String, Option<String>)> = self
            .claims
            .iter()
            .map(|(c, r)| (c.clone(), r.holder.clone()))
            .collect();
        let live: Vec<bool> = holders
            .iter()
            .map(|(_, h)| {
                // Its own claims are never abandoned: its agents are here,
                // even while its writes are suspended.
                h.as_deref()
                    .is_some_and(|h| h == me.identity || self.alive(me, h, at))
            })
            .collect();
        let orphans = self.orphans.update(
            holders.iter().zip(live).map(|((c, _), l)| (c.as_str(), l)),
            at,
            abandoned_after,
        );
        deaths.abandoned = orphans
            .into_iter()
            .filter_map(|c| self.claims.get(&c).map(|r| (c, r.version)))
            .collect();
        deaths
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;

    const SECOND: Duration = Duration::from_secs(1);

    fn me(suspended: bool) -> Me<'static> {
        Me {
            identity: "a",
            suspended,
            presence_duration: 8 * SECOND,
        }
    }

    fn claim(holder: &str, version: u64, wanted_by: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(version.to_string()),
                annotations: wanted_by
                    .map(|w| [(WANTED_BY_ANNOTATION.to_string(), w.to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                ..Default::default()
            }),
        }
    }

    fn presence(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(8),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn a_record_older_than_the_one_held_changes_nothing() {
        let mut v = View::default();
        assert!(v.record("c1", Some(&claim("b", 5, None)), None));
        assert!(!v.record("c1", Some(&claim("a", 4, None)), None), "older");
        assert_eq!(v.held_version("b", "c1"), Some(5));
        assert!(v.record("c1", Some(&claim("b", 6, None)), None), "newer");
        assert!(!v.record("c1", Some(&claim("b", 6, None)), None), "again");
        assert!(
            v.record("c1", Some(&claim("b", 7, Some("a"))), None),
            "asked for"
        );
        // A delete seen as of an older version is stale: the claim stays.
        assert!(!v.record("c1", None, Some(6)));
        assert!(v.knows("c1"));
        assert!(v.record("c1", None, Some(7)));
        assert!(!v.knows("c1"));
        assert!(!v.record("c1", None, None), "already gone");
    }

    #[test]
    fn a_holder_is_alive_while_its_presence_changes_and_this_replica_while_not_suspended() {
        let t0 = Instant::now();
        let mut v = View::default();
        v.record("c1", Some(&claim("b", 1, None)), None);
        v.record("c2", Some(&claim("a", 2, None)), None);
        v.presence_seen("b", presence("b", 100), None, t0, 8 * SECOND);
        let alive =
            |v: &mut View, c, at, suspended| v.claim(&me(suspended), c, at).unwrap().holder_alive;
        assert!(alive(&mut v, "c1", t0 + 8 * SECOND, false));
        assert!(!alive(&mut v, "c1", t0 + 9 * SECOND, false), "not renewed");
        v.presence_seen("b", presence("b", 109), None, t0 + 9 * SECOND, 8 * SECOND);
        assert!(alive(&mut v, "c1", t0 + 10 * SECOND, false), "renewed");
        assert!(alive(&mut v, "c2", t0, false));
        assert!(!alive(&mut v, "c2", t0, true), "suspended");
        v.presence_gone("b");
        assert!(!alive(&mut v, "c1", t0 + 10 * SECOND, false));
        assert_eq!(v.held_by("a"), ["c2"]);
    }

    #[test]
    fn a_replica_is_found_dead_once_then_stale_and_its_claims_abandoned() {
        let t0 = Instant::now();
        let mut v = View::default();
        v.record("c1", Some(&claim("b", 1, None)), None);
        v.record("c2", Some(&claim("a", 2, None)), None);
        v.presence_seen("b", presence("b", 100), None, t0, 8 * SECOND);
        v.presence_seen("a", presence("a", 100), None, t0, 8 * SECOND);
        let check = |v: &mut View, secs: u32| v.check(&me(false), t0 + SECOND * secs, 80 * SECOND);
        assert_eq!(check(&mut v, 8), Deaths::default());
        assert_eq!(
            v.next_death("a"),
            Some(t0 + 8 * SECOND + Duration::from_millis(1))
        );
        let first = check(&mut v, 9);
        assert_eq!(first.newly_dead, ["b"]);
        assert_eq!(first.clusters, ["c1"]);
        assert!(first.stale.is_empty() && first.abandoned.is_empty());
        assert_eq!(v.next_death("a"), None, "the dead do not die again");
        assert_eq!(check(&mut v, 10), Deaths::default(), "told once");
        // Ten durations after it died its presence is stale; 80 s after
        // the first look without a live holder its claim is abandoned.
        // This replica's own claim never is, whatever its presence says.
        let late = check(&mut v, 90);
        assert_eq!(late.stale, [rule::presence_name("b")]);
        assert_eq!(late.abandoned, [("c1".to_string(), 1)]);
        // A full list without b's presence forgets it; c1's claim, not
        // listed, is returned to be recorded gone.
        let listed = v.listed(&["c2".to_string()].into(), &["a".to_string()].into());
        assert_eq!(listed, ["c1"]);
        assert_eq!(check(&mut v, 91).stale, Vec::<String>::new());
    }

    #[test]
    fn a_live_read_goes_to_the_live_holder_that_says_where_it_listens() {
        let t0 = Instant::now();
        let mut v = View::default();
        v.record("c1", Some(&claim("b", 1, None)), None);
        v.record("c2", Some(&claim("a", 2, None)), None);
        v.record("c3", Some(&claim("c", 3, None)), None);
        v.presence_seen(
            "b",
            presence("b", 100),
            Some("10.0.0.2:8444".into()),
            t0,
            8 * SECOND,
        );
        v.presence_seen("c", presence("c", 100), None, t0, 8 * SECOND);
        let peer = |v: &mut View, c, secs| v.live_peer(&me(false), c, t0 + SECOND * secs);
        assert_eq!(
            peer(&mut v, "c1", 1),
            Some(("b".to_string(), "10.0.0.2:8444".to_string()))
        );
        assert_eq!(peer(&mut v, "c2", 1), None, "this replica's own");
        assert_eq!(peer(&mut v, "c3", 1), None, "a holder with no address");
        assert_eq!(peer(&mut v, "c9", 1), None, "nobody's");
        assert_eq!(peer(&mut v, "c1", 9), None, "a holder not renewed");
        // A presence renewed without the address no longer has one.
        v.presence_seen("b", presence("b", 109), None, t0 + 9 * SECOND, 8 * SECOND);
        assert_eq!(peer(&mut v, "c1", 10), None);
        v.presence_seen(
            "b",
            presence("b", 110),
            Some("10.0.0.3:8444".into()),
            t0 + 10 * SECOND,
            8 * SECOND,
        );
        assert_eq!(peer(&mut v, "c1", 11).unwrap().1, "10.0.0.3:8444");
        v.presence_gone("b");
        assert_eq!(peer(&mut v, "c1", 11), None, "gone");
    }
}
