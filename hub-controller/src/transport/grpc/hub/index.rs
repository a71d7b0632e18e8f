//! Which hub Application goes where, by Application and by (cluster, key),
//! and what each (cluster, key) must be on its agent. Pure: fed with
//! assignments, it answers from memory; the hub applies its answers to the
//! per-cluster state.
//!
//! One owner per spoke Application: when several hub Applications name the
//! same (cluster, key), the owner is decided by [`crate::route::owner`]
//! (oldest creationTimestamp, then smallest uid) among those that would be
//! delivered there by either transport, the same on every replica whatever
//! order it heard them in. The others are refused (`SpokeConflict`) and
//! never see the owner's spec or status. An owner delivered by ManifestWork
//! is in the index too (`NotOurs` with `by_work`): the agent lets go of the
//! key for it, without deleting.

use std::collections::HashMap;
use std::sync::Arc;

use argocd_pull_proto::v1::ObjectKey;

use super::super::cluster::Item;
use crate::route::owner::{Seniority, owner_holding};
use crate::transport::grpc::assign::{Assignment, Desired, HubRef, uid_of_version};

type Slot = (String, ObjectKey);

/// The uid of the hub Application a cluster's agent holds a key for, as
/// recorded ([`crate::transport::grpc::holders`]).
pub type HeldBy = Arc<dyn Fn(&str, &ObjectKey) -> Option<String> + Send + Sync>;

#[derive(Default)]
pub struct Index {
    assign: HashMap<HubRef, Assignment>,
    by_slot: HashMap<Slot, Named>,
    /// Without it (tests, or before it is set) a key is decided by age
    /// alone.
    held_by: Option<HeldBy>,
}

/// The Applications that name one slot, sorted, the holder marked: nearly
/// always one, and a B-tree set takes a node of about 500 bytes even for
/// one; a second map from slot to holder took another copy of the slot's
/// strings.
#[derive(Debug, Default)]
struct Named(Vec<(HubRef, bool)>);

impl Named {
    fn find(&self, r: &HubRef) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.cmp(r))
    }

    fn holder(&self) -> Option<&HubRef> {
        self.0.iter().find(|(_, holds)| *holds).map(|(r, _)| r)
    }

    fn refs(&self) -> impl Iterator<Item = &HubRef> {
        self.0.iter().map(|(r, _)| r)
    }
}

/// What the agent of a cluster must have under one key.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The holder's desired Application.
    Deliver(Arc<Desired>),
    /// The holder is being deleted: delete the spoke copy it created.
    Delete { hub_uid: String },
    /// Only refused Applications name it: keep what the agent has until
    /// the refusal is fixed.
    Keep,
    /// It moved to the ManifestWork transport: let go without deleting.
    Release,
    /// Nothing names it any more.
    Remove,
}

fn slot_of(a: &Assignment) -> Option<Slot> {
    a.slot().map(|(c, k)| (c.to_string(), k.clone()))
}

fn delivers(a: Option<&Assignment>) -> Option<&Arc<Desired>> {
    match a {
        Some(Assignment::Deliver { desired, .. }) => Some(desired),
        _ => None,
    }
}

/// What `a` claims its spoke Application with, when it claims it: a
/// delivery by either transport.
fn seniority(a: Option<&Assignment>) -> Option<(i64, &str)> {
    match a? {
        Assignment::Deliver { desired, .. } => Some((desired.created, desired.hub_uid())),
        Assignment::NotOurs {
            by_work: Some(s), ..
        } => Some((s.created, s.uid.as_str())),
        _ => None,
    }
}

impl Index {
    /// From now on a claimant that the cluster's agent holds the key for
    /// keeps it ([`crate::route::owner::owner_holding`]).
    pub fn set_held_by(&mut self, held_by: HeldBy) {
        self.held_by = Some(held_by);
    }

    /// Decides the owner of (cluster, key) again (its recorded holder
    /// changed); returns every Application that names it when the owner
    /// changed.
    pub fn reelect(&mut self, cluster: &str, key: &ObjectKey) -> Vec<HubRef> {
        let slot = (cluster.to_string(), key.clone());
        let before = self.owner(cluster, key);
        self.elect(&slot);
        if self.owner(cluster, key) == before {
            return Vec::new();
        }
        self.by_slot
            .get(&slot)
            .map(|n| n.refs().cloned().collect())
            .unwrap_or_default()
    }

    pub fn assignment(&self, r: &HubRef) -> Option<&Assignment> {
        self.assign.get(r)
    }

    pub fn contains(&self, r: &HubRef) -> bool {
        self.assign.contains_key(r)
    }

    pub fn refs(&self) -> Vec<HubRef> {
        self.assign.keys().cloned().collect()
    }

    /// The hub Application that the gRPC transport delivers (cluster,
    /// key) for: the owner, when this transport delivers it.
    pub fn winner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.owner(cluster, key)
            .filter(|r| delivers(self.assign.get(r)).is_some())
    }

    /// The hub Application that owns (cluster, key), whichever transport
    /// delivers it.
    pub fn owner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
        self.by_slot
            .get(&(cluster.to_string(), key.clone()))
            .and_then(Named::holder)
            .cloned()
    }

    /// The Applications that name (cluster, key), with their assignment.
    fn at(&self, slot: &Slot) -> Vec<(&HubRef, &Assignment)> {
        self.by_slot
            .get(slot)
            .into_iter()
            .flat_map(Named::refs)
            .filter_map(|r| self.assign.get(r).map(|a| (r, a)))
            .collect()
    }

    /// The Applications refused on (cluster, key).
    pub fn refused_at(&self, cluster: &str, key: &ObjectKey) -> Vec<HubRef> {
        self.at(&(cluster.to_string(), key.clone()))
            .into_iter()
            .filter(|(_, a)| matches!(a, Assignment::Refused { .. }))
            .map(|(r, _)| r.clone())
            .collect()
    }

    pub fn has_slot(&self, cluster: &str, key: &ObjectKey) -> bool {
        self.by_slot
            .get(&(cluster.to_string(), key.clone()))
            .is_some_and(|s| !s.0.is_empty())
    }

    /// Records `a` for `r` (`None`: `r` is gone); returns the slots whose
    /// decision may have changed.
    pub fn set(&mut self, r: &HubRef, a: Option<Assignment>) -> Vec<(String, ObjectKey)> {
        let a = a.map(|a| self.same_content(r, a));
        let old = match a {
            Some(a) => self.assign.insert(r.clone(), a),
            None => self.assign.remove(r),
        };
        let old_slot = old.as_ref().and_then(slot_of);
        let new_slot = self.assign.get(r).and_then(slot_of);
        if old_slot != new_slot {
            if let Some(s) = &old_slot
                && let Some(named) = self.by_slot.get_mut(s)
            {
                if let Ok(i) = named.find(r) {
                    named.0.remove(i);
                }
                if named.0.is_empty() {
                    self.by_slot.remove(s);
                }
            }
            if let Some(s) = &new_slot {
                // Room for one: nearly every slot has one Application, and
                // a first push makes room for four (168 bytes more each).
                let named = self
                    .by_slot
                    .entry(s.clone())
                    .or_insert_with(|| Named(Vec::with_capacity(1)));
                if let Err(i) = named.find(r) {
                    named.0.insert(i, (r.clone(), false));
                }
            }
        }
        let slots: Vec<Slot> = old_slot.into_iter().chain(new_slot).collect();
        for s in &slots {
            self.elect(s);
        }
        slots
    }

    /// `a`, with the desired copy already held for `r` in place of its
    /// own when only the hub Application's resourceVersion differs (a
    /// status write): the per-cluster state keeps the first one it was
    /// given for an unchanged version, so without this every Application
    /// had two copies in memory after its first status write.
    fn same_content(&self, r: &HubRef, a: Assignment) -> Assignment {
        match (self.assign.get(r), a) {
            (
                Some(Assignment::Deliver { desired: old, .. }),
                Assignment::Deliver {
                    cluster,
                    key,
                    desired,
                    deleting,
                },
            ) if old.version() == desired.version()
                && old.meta.generation == desired.meta.generation =>
            {
                Assignment::Deliver {
                    cluster,
                    key,
                    desired: old.clone(),
                    deleting,
                }
            }
            (_, a) => a,
        }
    }

    /// Makes the owner ([`crate::route::owner`]) of `slot` its holder: the
    /// one the agent holds it for, if it claims it, else the oldest.
    fn elect(&mut self, slot: &Slot) {
        let assign = &self.assign;
        let Some(named) = self.by_slot.get_mut(slot) else {
            return;
        };
        // Nearly every slot has one Application: nothing to compare.
        if let [(r, holds)] = named.0.as_mut_slice() {
            *holds = seniority(assign.get(r)).is_some();
            return;
        }
        let held = self.held_by.as_ref().and_then(|f| f(&slot.0, &slot.1));
        let claims: Vec<(Seniority, bool, usize)> = named
            .0
            .iter()
            .enumerate()
            .filter_map(|(i, (r, _))| {
                let a = assign.get(r);
                let (created, uid) = seniority(a)?;
                let holds = held.is_some() && delivers(a).map(|d| d.hub_uid()) == held.as_deref();
                Some((
                    Seniority {
                        created,
                        uid: uid.to_string(),
                    },
                    holds,
                    i,
                ))
            })
            .collect();
        let next = owner_holding(claims.iter().map(|(s, holds, i)| (s, *holds, *i)));
        for (i, (_, holds)) in named.0.iter_mut().enumerate() {
            *holds = Some(i) == next;
        }
    }

    /// What the agent of `cluster` must have under `key`, and the other
    /// Applications that name it (they show the conflict).
    pub fn decide(&self, cluster: &str, key: &ObjectKey) -> (Decision, Vec<HubRef>) {
        let slot = (cluster.to_string(), key.clone());
        let at = self.at(&slot);
        let holder = self.by_slot.get(&slot).and_then(Named::holder);
        let others: Vec<HubRef> = at
            .iter()
            .map(|(r, _)| (*r).clone())
            .filter(|r| Some(r) != holder)
            .collect();
        let decision = match holder.and_then(|h| self.assign.get(h)) {
            Some(Assignment::Deliver {
                desired,
                deleting: true,
                ..
            }) => Decision::Delete {
                hub_uid: desired.hub_uid().to_string(),
            },
            Some(Assignment::Deliver { desired, .. }) => Decision::Deliver(desired.clone()),
            _ if at
                .iter()
                .any(|(_, a)| matches!(a, Assignment::Refused { .. })) =>
            {
                Decision::Keep
            }
            _ if !at.is_empty() => Decision::Release,
            _ => Decision::Remove,
        };
        (decision, others)
    }

    /// What a key the hub does not want becomes, when the agent still has
    /// it (a digest repair): released if a hub Application now delivers it
    /// by ManifestWork, left alone while a refusal or a delivery stands,
    /// deleted otherwise. `version` is the agent's, naming the hub uid.
    pub fn removal(&self, cluster: &str, key: &ObjectKey, version: &str) -> Option<Item> {
        let slot = (cluster.to_string(), key.clone());
        match self.decide(cluster, key).0 {
            Decision::Delete { hub_uid } => return Some(Item::Delete { hub_uid }),
            Decision::Deliver(_) | Decision::Keep => return None,
            Decision::Release | Decision::Remove => {}
        }
        let hub_uid = uid_of_version(version)?.to_string();
        Some(if self.at(&slot).is_empty() {
            Item::Delete { hub_uid }
        } else {
            Item::Release { hub_uid }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Reason;
    use argocd_pull_proto::v1::ObjectMeta;

    fn r(name: &str) -> HubRef {
        HubRef {
            namespace: "team".into(),
            name: name.into(),
        }
    }

    fn key() -> ObjectKey {
        ObjectKey {
            namespace: "argocd".into(),
            name: "guestbook".into(),
        }
    }

    fn deliver(name: &str, created: i64, deleting: bool) -> Assignment {
        Assignment::Deliver {
            cluster: "c1".into(),
            key: key(),
            deleting,
            desired: Arc::new(Desired {
                hub: r(name),
                json: crate::compact::CompactJson::new("{}"),
                meta: ObjectMeta {
                    uid: format!("uid-{name}"),
                    version: format!("uid-{name}.h"),
                    ..Default::default()
                },
                created,
                grant: crate::fixtures::grant(&format!("uid-{name}"), "default"),
            }),
        }
    }

    fn refused(name: &str) -> Assignment {
        let _ = name;
        Assignment::Refused {
            cluster: "c1".into(),
            key: key(),
            reason: Reason::NotAuthorized,
            message: "no".into(),
        }
    }

    fn not_ours() -> Assignment {
        Assignment::NotOurs {
            target: Some(("c1".into(), key())),
            by_work: None,
        }
    }

    fn delivered_for(index: &Index) -> Option<String> {
        match index.decide("c1", &key()).0 {
            Decision::Deliver(d) => Some(d.hub.name.clone()),
            _ => None,
        }
    }

    #[test]
    fn the_oldest_owns_the_spoke_application_whatever_the_order() {
        // Two replicas hear the same two Applications in opposite orders
        // (one of them after a restart): both name the same owner.
        let mut i = Index::default();
        i.set(&r("b"), Some(deliver("b", 20, false)));
        i.set(&r("a"), Some(deliver("a", 10, false)));
        let mut j = Index::default();
        j.set(&r("a"), Some(deliver("a", 10, false)));
        j.set(&r("b"), Some(deliver("b", 20, false)));
        for index in [&i, &j] {
            assert_eq!(index.winner("c1", &key()), Some(r("a")));
            assert_eq!(delivered_for(index).as_deref(), Some("a"));
            assert_eq!(
                index.decide("c1", &key()).1,
                vec![r("b")],
                "the younger shows the conflict"
            );
        }
        // The owner changing (a new spec) keeps it.
        i.set(&r("a"), Some(deliver("a", 10, false)));
        assert_eq!(i.winner("c1", &key()), Some(r("a")));
        // The owner gone: the other takes over.
        i.set(&r("a"), None);
        assert_eq!(delivered_for(&i).as_deref(), Some("b"));
        assert!(i.decide("c1", &key()).1.is_empty());
    }

    #[test]
    fn the_claimant_the_agent_holds_the_key_for_keeps_it_whatever_its_age() {
        let held = Arc::new(std::sync::Mutex::new(None::<String>));
        let mut i = Index::default();
        let lookup = held.clone();
        i.set_held_by(Arc::new(move |c, k| {
            assert_eq!((c, k), ("c1", &key()));
            lookup.lock().unwrap().clone()
        }));
        // The younger delivered first, and the agent applied it.
        i.set(&r("young"), Some(deliver("young", 20, false)));
        *held.lock().unwrap() = Some("uid-young".into());
        // An older one moved onto the key: refused, the holder keeps it.
        i.set(&r("old"), Some(deliver("old", 10, false)));
        assert_eq!(delivered_for(&i).as_deref(), Some("young"));
        assert_eq!(i.decide("c1", &key()).1, vec![r("old")]);
        // An older one by ManifestWork: the same.
        i.set(
            &r("work"),
            Some(Assignment::NotOurs {
                target: Some(("c1".into(), key())),
                by_work: Some(crate::route::owner::Seniority {
                    created: 5,
                    uid: "uid-work".into(),
                }),
            }),
        );
        assert_eq!(i.owner("c1", &key()), Some(r("young")));
        // The record names a hub Application that does not claim the key
        // (it moved away): age decides.
        *held.lock().unwrap() = Some("uid-gone".into());
        assert_eq!(
            i.reelect("c1", &key()),
            vec![r("old"), r("work"), r("young")],
            "the owner changed: everyone who names the key is told"
        );
        assert_eq!(i.owner("c1", &key()), Some(r("work")));
        assert!(
            i.reelect("c1", &key()).is_empty(),
            "nothing changed: nobody is told"
        );
    }

    #[test]
    fn an_owner_delivered_by_manifestwork_holds_against_the_grpc_transport() {
        let by_work = |created| Assignment::NotOurs {
            target: Some(("c1".into(), key())),
            by_work: Some(crate::route::owner::Seniority {
                created,
                uid: "uid-w".into(),
            }),
        };
        let mut i = Index::default();
        i.set(&r("grpc"), Some(deliver("grpc", 20, false)));
        i.set(&r("work"), Some(by_work(10)));
        // The older, by ManifestWork, owns it: the agent lets go (never
        // deletes) and the gRPC one is refused naming it.
        assert_eq!(i.owner("c1", &key()), Some(r("work")));
        assert_eq!(i.winner("c1", &key()), None);
        assert_eq!(i.decide("c1", &key()), (Decision::Release, vec![r("grpc")]));
        // Younger than the gRPC one: it is the one refused.
        i.set(&r("work"), Some(by_work(30)));
        assert_eq!(i.winner("c1", &key()), Some(r("grpc")));
        assert_eq!(i.decide("c1", &key()).1, vec![r("work")]);
    }

    #[test]
    fn decisions_for_every_kind_of_slot() {
        let mut i = Index::default();
        assert_eq!(i.decide("c1", &key()).0, Decision::Remove);
        i.set(&r("a"), Some(refused("a")));
        assert_eq!(i.decide("c1", &key()).0, Decision::Keep);
        assert_eq!(i.winner("c1", &key()), None);
        i.set(&r("a"), Some(not_ours()));
        assert_eq!(i.decide("c1", &key()).0, Decision::Release);
        i.set(&r("a"), Some(deliver("a", 1, true)));
        assert_eq!(
            i.decide("c1", &key()).0,
            Decision::Delete {
                hub_uid: "uid-a".into()
            }
        );
        let slots = i.set(&r("a"), None);
        assert_eq!(slots, vec![("c1".to_string(), key())]);
        assert_eq!(i.decide("c1", &key()).0, Decision::Remove);
        assert!(!i.has_slot("c1", &key()));
    }

    #[test]
    fn a_refused_newcomer_does_not_take_a_held_slot() {
        let mut i = Index::default();
        i.set(&r("holder"), Some(deliver("holder", 1, false)));
        i.set(&r("other"), Some(refused("other")));
        assert_eq!(delivered_for(&i).as_deref(), Some("holder"));
    }

    #[test]
    fn removal_of_what_the_agent_still_has() {
        let mut i = Index::default();
        // Nothing names it: delete what the agent has, by the hub uid in
        // its version.
        assert_eq!(
            i.removal("c1", &key(), "uid-x.h"),
            Some(Item::Delete {
                hub_uid: "uid-x".into()
            })
        );
        assert_eq!(i.removal("c1", &key(), "no-dot"), None);
        // Moved to ManifestWork: release, do not delete.
        i.set(&r("a"), Some(not_ours()));
        assert_eq!(
            i.removal("c1", &key(), "uid-a.h"),
            Some(Item::Release {
                hub_uid: "uid-a".into()
            })
        );
        // Refused or delivered: leave it alone.
        i.set(&r("a"), Some(refused("a")));
        assert_eq!(i.removal("c1", &key(), "uid-a.h"), None);
        i.set(&r("a"), Some(deliver("a", 1, false)));
        assert_eq!(i.removal("c1", &key(), "uid-a.h"), None);
        // Being deleted: delete the holder's copy.
        i.set(&r("a"), Some(deliver("a", 1, true)));
        assert_eq!(
            i.removal("c1", &key(), "uid-a.h"),
            Some(Item::Delete {
                hub_uid: "uid-a".into()
            })
        );
    }

    #[test]
    fn an_unchanged_content_keeps_the_first_copy() {
        let desired = |a: &Assignment| match a {
            Assignment::Deliver { desired, .. } => desired.clone(),
            _ => unreachable!(),
        };
        let mut i = Index::default();
        let first = deliver("a", 1, false);
        i.set(&r("a"), Some(first.clone()));
        // A status write: a new resourceVersion, the same content version.
        let mut echo = deliver("a", 1, false);
        if let Assignment::Deliver { desired, .. } = &mut echo {
            Arc::make_mut(desired).meta.resource_version = "2".into();
        }
        i.set(&r("a"), Some(echo));
        let held = desired(i.assignment(&r("a")).unwrap());
        assert!(Arc::ptr_eq(&held, &desired(&first)), "one copy, not two");
        // Being deleted keeps the copy but says so.
        i.set(&r("a"), Some(deliver("a", 1, true)));
        assert_eq!(
            i.decide("c1", &key()).0,
            Decision::Delete {
                hub_uid: "uid-a".into()
            }
        );
        // New content: the new copy.
        let mut changed = deliver("a", 1, false);
        if let Assignment::Deliver { desired, .. } = &mut changed {
            Arc::make_mut(desired).meta.version = "uid-a.h2".into();
        }
        i.set(&r("a"), Some(changed));
        assert_eq!(
            desired(i.assignment(&r("a")).unwrap()).version(),
            "uid-a.h2"
        );
    }

    #[test]
    fn several_applications_on_one_slot_stay_sorted() {
        let mut i = Index::default();
        for n in ["c", "a", "b"] {
            i.set(&r(n), Some(deliver(n, 1, false)));
        }
        // Equally old: the smallest uid owns it; the others conflict, by
        // namespace and name.
        assert_eq!(delivered_for(&i).as_deref(), Some("a"));
        assert_eq!(i.decide("c1", &key()).1, vec![r("b"), r("c")]);
        i.set(&r("a"), None);
        assert_eq!(delivered_for(&i).as_deref(), Some("b"));
        assert_eq!(i.decide("c1", &key()).1, vec![r("c")]);
        i.set(&r("b"), None);
        i.set(&r("c"), None);
        assert!(!i.has_slot("c1", &key()), "an empty slot is forgotten");
    }
}
