//! Pure: who writes for a cluster when every replica serves gRPC.
//!
//! A cluster's writes (status, conditions, command stamps and completions,
//! finalizer release, mirrors) depend on what its agent reported, and only
//! the replica the agent is connected to hears that. So that replica
//! *claims* the cluster (a Lease named after it, holding the replica's
//! identity) and is the only one that writes for it; it lets go when the
//! agent's stream ends. A cluster nobody claims (no agent connected, or
//! its holder is dead) is written for by the leader, from the watches
//! alone: refusals, nothing observed.

/// What a replica whose agent session wants the cluster does next, from
/// the cluster's claim as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No claim: create it.
    Create,
    /// Free, or its holder is dead: take it (with the version read).
    Take,
    /// Ours already.
    Held,
    /// A live replica holds it: ask it to let go (it ends its stale
    /// session; the agent has only one stream, and it is here now), then
    /// wait.
    Ask { holder: String },
    /// A live replica holds it and has been asked: wait.
    Wait { holder: String },
}

/// The claim as read: its holder, whether that holder's presence is live,
/// and who asked for it.
pub fn step(claim: Option<Claim<'_>>, me: &str) -> Step {
    let Some(c) = claim else {
        return Step::Create;
    };
    match c.holder {
        None | Some("") => Step::Take,
        Some(h) if h == me => Step::Held,
        Some(_) if !c.holder_alive => Step::Take,
        Some(h) if c.wanted_by == Some(me) => Step::Wait { holder: h.into() },
        Some(h) => Step::Ask { holder: h.into() },
    }
}

/// A claim as one replica sees it.
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    pub holder: Option<&'a str>,
    pub holder_alive: bool,
    pub wanted_by: Option<&'a str>,
}

/// Whether `me` writes for a cluster whose claim is `claim`: its holder
/// does; the leader does for a cluster no live replica holds.
pub fn acts_for(claim: Option<Claim<'_>>, me: &str, leader: bool) -> bool {
    match claim {
        Some(Claim {
            holder: Some(h),
            holder_alive,
            ..
        }) if !h.is_empty() => h == me || (leader && !holder_alive),
        _ => leader,
    }
}

/// Whether the holder `me` must end its session for the cluster and let
/// go: another replica asked (its agent connected there, so the stream
/// here is stale).
pub fn must_let_go(claim: Claim<'_>, me: &str) -> bool {
    claim.holder == Some(me) && claim.wanted_by.is_some_and(|w| !w.is_empty() && w != me)
}

/// Claims that no live replica holds, and since when (on this replica's
/// clock). An agent that comes back takes such a claim over; one whose
/// cluster is gone never does, so the leader deletes a claim left without
/// a live holder for long enough.
#[derive(Debug, Default)]
pub struct Orphans {
    since: std::collections::HashMap<String, std::time::Instant>,
}

impl Orphans {
    /// Looks at every claim (`cluster`, whether a live replica holds it)
    /// at `at`; returns the clusters whose claim has had no live holder for
    /// longer than `long`. A claim no longer listed is forgotten.
    pub fn update<'a>(
        &mut self,
        claims: impl IntoIterator<Item = (&'a str, bool)>,
        at: std::time::Instant,
        long: std::time::Duration,
    ) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        let mut abandoned = Vec::new();
        for (cluster, held) in claims {
            seen.insert(cluster);
            if held {
                self.since.remove(cluster);
                continue;
            }
            let since = *self.since.entry(cluster.to_string()).or_insert(at);
            if at.duration_since(since) > long {
                abandoned.push(cluster.to_string());
            }
        }
        self.since.retain(|c, _| seen.contains(c.as_str()));
        abandoned.sort();
        abandoned
    }
}

/// A Lease name for a replica's identity (`pod_suffix`: lower case, `_`
/// is not allowed in names).
pub fn presence_name(identity: &str) -> String {
    let clean: String = identity
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "{PRESENCE_PREFIX}{}",
        clean.trim_matches(|c| c == '-' || c == '.')
    )
}

/// The claim Lease of a cluster (a cluster name is a DNS label).
pub fn claim_name(cluster: &str) -> String {
    format!("{CLAIM_PREFIX}{cluster}")
}

pub const PRESENCE_PREFIX: &str = "argocd-pull-replica-";
pub const CLAIM_PREFIX: &str = "argocd-pull-cluster-";

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(holder: Option<&'a str>, alive: bool, wanted: Option<&'a str>) -> Claim<'a> {
        Claim {
            holder,
            holder_alive: alive,
            wanted_by: wanted,
        }
    }

    #[test]
    fn a_session_takes_what_is_free_or_dead_and_asks_a_live_holder() {
        assert_eq!(step(None, "b"), Step::Create);
        assert_eq!(step(Some(claim(None, false, None)), "b"), Step::Take);
        assert_eq!(step(Some(claim(Some(""), true, None)), "b"), Step::Take);
        assert_eq!(step(Some(claim(Some("b"), true, None)), "b"), Step::Held);
        assert_eq!(step(Some(claim(Some("a"), false, None)), "b"), Step::Take);
        assert_eq!(
            step(Some(claim(Some("a"), true, None)), "b"),
            Step::Ask { holder: "a".into() }
        );
        // Someone else's request is replaced by ours: the newest stream wins.
        assert_eq!(
            step(Some(claim(Some("a"), true, Some("c"))), "b"),
            Step::Ask { holder: "a".into() }
        );
        assert_eq!(
            step(Some(claim(Some("a"), true, Some("b"))), "b"),
            Step::Wait { holder: "a".into() }
        );
    }

    #[test]
    fn the_holder_writes_and_the_leader_writes_for_the_unclaimed() {
        for leader in [false, true] {
            assert!(acts_for(Some(claim(Some("me"), true, None)), "me", leader));
            assert!(!acts_for(Some(claim(Some("a"), true, None)), "me", leader));
            assert_eq!(acts_for(None, "me", leader), leader);
            assert_eq!(
                acts_for(Some(claim(None, false, None)), "me", leader),
                leader
            );
            assert_eq!(
                acts_for(Some(claim(Some("a"), false, None)), "me", leader),
                leader
            );
        }
    }

    #[test]
    fn a_holder_lets_go_only_when_another_asks() {
        assert!(must_let_go(claim(Some("a"), true, Some("b")), "a"));
        assert!(!must_let_go(claim(Some("a"), true, Some("a")), "a"));
        assert!(!must_let_go(claim(Some("a"), true, None), "a"));
        assert!(!must_let_go(claim(Some("a"), true, Some("b")), "b"));
    }

    #[test]
    fn a_claim_without_a_live_holder_for_long_is_abandoned() {
        let long = std::time::Duration::from_secs(80);
        let t0 = std::time::Instant::now();
        let at = |s| t0 + std::time::Duration::from_secs(s);
        let mut o = Orphans::default();
        assert!(
            o.update([("a", false), ("b", true)], at(0), long)
                .is_empty()
        );
        assert!(
            o.update([("a", false), ("b", true)], at(80), long)
                .is_empty()
        );
        assert_eq!(o.update([("a", false), ("b", true)], at(81), long), ["a"]);
        // Held again (its agent came back): the clock starts over.
        assert!(
            o.update([("a", true), ("b", false)], at(82), long)
                .is_empty()
        );
        assert!(
            o.update([("a", false), ("b", false)], at(150), long)
                .is_empty()
        );
        assert_eq!(o.update([("a", false), ("b", false)], at(163), long), ["b"]);
        // A claim not listed any more (deleted) is forgotten: listed again
        // later, it is counted from the new sighting.
        assert_eq!(o.update([("b", false)], at(164), long), ["b"]);
        assert!(o.update([], at(165), long).is_empty());
        assert!(o.update([("a", false)], at(166), long).is_empty());
        assert!(o.update([("a", false)], at(246), long).is_empty());
        assert_eq!(o.update([("a", false)], at(247), long), ["a"]);
    }

    #[test]
    fn names_are_valid_lease_names() {
        assert_eq!(
            presence_name("argocd-pull-hub-controller-7f9c_1a2B3c4d"),
            "argocd-pull-replica-argocd-pull-hub-controller-7f9c-1a2b3c4d"
        );
        assert_eq!(claim_name("cluster1"), "argocd-pull-cluster-cluster1");
    }
}
