//! Which hub Application goes where, by Application and by (cluster, key),
//! and what each (cluster, key) must be on its agent. Pure: fed with
//! assignments, it answers from memory; the hub applies its answers to the
//! per-cluster state.
//!
//! One owner per spoke Application: when several hub Applications name the
//! same (cluster, key), the one that holds it keeps it for as long as it is
//! assigned to deliver it; a newcomer is refused (`SpokeConflict`) and
//! never sees the holder's spec or status. When nobody holds it (first
//! delivery, or after a restart) the oldest hub Application gets it, then
//! the first by namespace and name.

use std::collections::HashMap;
use std::sync::Arc;

use argocd_pull_proto::v1::ObjectKey;

use super::super::cluster::Item;
use crate::transport::grpc::assign::{Assignment, Desired, HubRef, uid_of_version};

type Slot = (String, ObjectKey);

#[derive(Default)]
pub struct Index {
    assign: HashMap<HubRef, Assignment>,
    by_slot: HashMap<Slot, Named>,
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

impl Index {
    pub fn assignment(&self, r: &HubRef) -> Option<&Assignment> {
        self.assign.get(r)
    }

    pub fn contains(&self, r: &HubRef) -> bool {
        self.assign.contains_key(r)
    }

    pub fn refs(&self) -> Vec<HubRef> {
        self.assign.keys().cloned().collect()
    }

    /// The hub Application that delivers (cluster, key).
    pub fn winner(&self, cluster: &str, key: &ObjectKey) -> Option<HubRef> {
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

    /// Keeps the holder of `slot` while it still delivers it; otherwise
    /// the oldest Application that delivers it becomes the holder.
    fn elect(&mut self, slot: &Slot) {
        let assign = &self.assign;
        let Some(named) = self.by_slot.get_mut(slot) else {
            return;
        };
        if named
            .holder()
            .is_some_and(|h| delivers(assign.get(h)).is_some())
        {
            return;
        }
        let next = named
            .0
            .iter()
            .enumerate()
            .filter_map(|(i, (r, _))| delivers(assign.get(r)).map(|d| (d.created, r, i)))
            .min()
            .map(|(_, _, i)| i);
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
        }
    }

    fn delivered_for(index: &Index) -> Option<String> {
        match index.decide("c1", &key()).0 {
            Decision::Deliver(d) => Some(d.hub.name.clone()),
            _ => None,
        }
    }

    #[test]
    fn the_first_holder_keeps_the_spoke_application() {
        let mut i = Index::default();
        // "b" is delivered first; "a" comes later, older and sorting first.
        i.set(&r("b"), Some(deliver("b", 20, false)));
        i.set(&r("a"), Some(deliver("a", 10, false)));
        assert_eq!(i.winner("c1", &key()), Some(r("b")));
        assert_eq!(delivered_for(&i).as_deref(), Some("b"));
        assert_eq!(
            i.decide("c1", &key()).1,
            vec![r("a")],
            "the newcomer shows the conflict"
        );
        // The holder changing (a new spec) keeps it.
        i.set(&r("b"), Some(deliver("b", 20, false)));
        assert_eq!(i.winner("c1", &key()), Some(r("b")));
        // The holder gone: the other takes over.
        i.set(&r("b"), None);
        assert_eq!(delivered_for(&i).as_deref(), Some("a"));
        assert!(i.decide("c1", &key()).1.is_empty());
    }

    #[test]
    fn with_no_holder_the_oldest_gets_it() {
        let mut i = Index::default();
        // As after a restart: both arrive from the first list, with no
        // holder known; the older wins whatever the order.
        i.set(&r("z-old"), Some(deliver("z-old", 5, false)));
        i.set(&r("a-new"), Some(deliver("a-new", 9, false)));
        assert_eq!(i.winner("c1", &key()), Some(r("z-old")));
        let mut j = Index::default();
        j.set(&r("a-new"), Some(deliver("a-new", 9, false)));
        assert_eq!(j.winner("c1", &key()), Some(r("a-new")), "alone, it holds");
        j.set(&r("z-old"), Some(deliver("z-old", 5, false)));
        assert_eq!(
            j.winner("c1", &key()),
            Some(r("a-new")),
            "a holder is never displaced"
        );
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
        // The first keeps it; the others conflict, by namespace and name.
        assert_eq!(delivered_for(&i).as_deref(), Some("c"));
        assert_eq!(i.decide("c1", &key()).1, vec![r("a"), r("b")]);
        // Gone: among the equally old, the first by name gets it.
        i.set(&r("c"), None);
        assert_eq!(delivered_for(&i).as_deref(), Some("a"));
        assert_eq!(i.decide("c1", &key()).1, vec![r("b")]);
        i.set(&r("a"), None);
        i.set(&r("b"), None);
        assert!(!i.has_slot("c1", &key()), "an empty slot is forgotten");
    }
}
