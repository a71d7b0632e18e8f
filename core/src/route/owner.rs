//! Pure: which hub Application owns a spoke Application when several name
//! the same (cluster, spoke namespace, name).
//!
//! The rule is the same on every replica and for both transports: among
//! the hub Applications that would otherwise be delivered there, the one
//! with the oldest `creationTimestamp` owns it, the smallest uid among
//! equally old ones. It depends on nothing but the two fields the API
//! server sets and never changes, so no replica's event order, restart or
//! transport can make two replicas (or the ManifestWork and the gRPC side
//! of one) name different owners. Every other claimant is refused with
//! `SpokeConflict` naming the owner.
//!
//! Age alone would let an older hub Application take over a running spoke
//! Application: when a claim begins is the tenant's choice (it sets the
//! annotations). So a claimant that already *holds* the key (its
//! ManifestWork delivers it, or the cluster's agent reported applying it
//! for that claimant over gRPC: facts of the cluster, which no tenant
//! writes) keeps it whatever its age ([`owner_holding`]).

use std::cmp::Ordering;

/// What the rule reads of a claimant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Seniority {
    /// Its `creationTimestamp`, in seconds since the epoch.
    pub created: i64,
    pub uid: String,
}

impl Seniority {
    pub fn of(meta: &kube::core::ObjectMeta) -> Self {
        Self {
            created: meta
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }

    /// Whether `self` goes before `other`: it owns what both claim.
    pub fn precedes(&self, other: &Seniority) -> bool {
        self.cmp(other) == Ordering::Less
    }
}

impl Ord for Seniority {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.created, self.uid.as_str()).cmp(&(other.created, other.uid.as_str()))
    }
}

impl PartialOrd for Seniority {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The owner among `claimants` (each with what it is known by), if any.
pub fn owner<'a, T>(claimants: impl IntoIterator<Item = (&'a Seniority, T)>) -> Option<T> {
    claimants
        .into_iter()
        .min_by(|(a, _), (b, _)| a.cmp(b))
        .map(|(_, t)| t)
}

/// The owner among `claimants`, each with whether it holds the key now:
/// the oldest of those that hold it, or, when none does, the oldest of all.
pub fn owner_holding<'a, T>(
    claimants: impl IntoIterator<Item = (&'a Seniority, bool, T)>,
) -> Option<T> {
    claimants
        .into_iter()
        .min_by(|(a, a_holds, _), (b, b_holds, _)| b_holds.cmp(a_holds).then(a.cmp(b)))
        .map(|(_, _, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(created: i64, uid: &str) -> Seniority {
        Seniority {
            created,
            uid: uid.into(),
        }
    }

    #[test]
    fn the_oldest_then_the_smallest_uid_owns_whatever_the_order() {
        let a = s(10, "b-uid");
        let b = s(10, "a-uid");
        let c = s(5, "z-uid");
        let all = [(&a, "a"), (&b, "b"), (&c, "c")];
        assert_eq!(owner(all), Some("c"));
        let mut reversed = all;
        reversed.reverse();
        assert_eq!(owner(reversed), Some("c"));
        assert_eq!(owner([(&a, "a"), (&b, "b")]), Some("b"), "uid breaks a tie");
        assert_eq!(owner([(&b, "b"), (&a, "a")]), Some("b"));
        assert_eq!(owner::<&str>([]), None);
        assert!(c.precedes(&a) && b.precedes(&a) && !a.precedes(&a));
    }

    #[test]
    fn a_holder_keeps_the_key_whatever_its_age() {
        let old = s(5, "z-uid");
        let young = s(10, "a-uid");
        let younger = s(20, "b-uid");
        assert_eq!(
            owner_holding([(&old, false, "old"), (&young, true, "young")]),
            Some("young"),
            "an older claimant takes nothing from a holder"
        );
        assert_eq!(
            owner_holding([(&young, true, "young"), (&old, false, "old")]),
            Some("young")
        );
        assert_eq!(
            owner_holding([
                (&younger, true, "younger"),
                (&old, false, "old"),
                (&young, true, "young")
            ]),
            Some("young"),
            "among holders, the oldest"
        );
        assert_eq!(
            owner_holding([(&young, false, "young"), (&old, false, "old")]),
            Some("old"),
            "no holder: the oldest"
        );
        assert_eq!(owner_holding::<&str>([]), None);
    }
}
