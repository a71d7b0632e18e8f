//! The hub's record of the certificates issued to each cluster, and the
//! decision on a connection's certificate (pure).
//!
//! The record lives in [`SHARDS`] ConfigMaps of fixed names in the
//! hub-controller's namespace (fixed names: the hub-controller may write
//! only those, never the deny list next to them). A cluster's entries are
//! in the shard its name hashes to; each entry is keyed by the
//! certificate's SHA-256 fingerprint. Each shard carries the time it was
//! created ([`SINCE_ANNOTATION`]): certificates issued before it are the
//! ones the hub could not have recorded (the upgrade grace).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::super::revoke::{Refusal, RefusalCode};
use super::requester::Issue;

/// Number of record ConfigMaps. Never change it: the hash of a cluster
/// name picks its shard.
pub const SHARDS: u32 = 16;
/// Name prefix of the record ConfigMaps (`<prefix>00` to `<prefix>15`).
pub const SHARD_PREFIX: &str = "argocd-pull-issued-certificates-";
/// Label on the record ConfigMaps.
pub const SHARD_LABEL: &str = "argocd-pull.io/issued-certificates";
/// When the shard was created (Unix seconds): the hub has recorded every
/// certificate issued since, for the clusters of that shard.
pub const SINCE_ANNOTATION: &str = "argocd-pull.io/recording-since";
/// Clock skew allowed between OCM's signer (which sets notBefore to the
/// time it signs) and the hub-controller: a certificate counts as issued
/// before recording began only when its notBefore is this much earlier.
pub const SKEW: i64 = 300;
/// A certificate younger than this that the hub has not seen issued yet
/// is refused as retriable (its CSR may still be on its way to the hub's
/// watch); older, it is refused for good.
pub const FRESH: i64 = 120;
/// Entries kept per cluster (the latest by expiry): a cluster filing CSRs
/// in a loop fills its own entries, never another's.
pub const MAX_PER_CLUSTER: usize = 8;

/// The shard of `cluster` (FNV-1a of its name).
pub fn shard_of(cluster: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in cluster.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % SHARDS
}

/// The name of shard `i`.
pub fn shard_name(i: u32) -> String {
    format!("{SHARD_PREFIX}{i:02}")
}

/// Shard index of a ConfigMap name, if it is one.
pub fn shard_index(name: &str) -> Option<u32> {
    let i: u32 = name.strip_prefix(SHARD_PREFIX)?.parse().ok()?;
    (i < SHARDS && shard_name(i) == name).then_some(i)
}

/// One recorded certificate (the value of its fingerprint's key, JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub cluster: String,
    /// Unix seconds.
    pub not_after: i64,
    /// The CSR it was issued on, and who filed it: for the audit.
    pub csr: String,
    pub requester: String,
}

impl Entry {
    pub fn of(cluster: &str, issue: &Issue) -> Self {
        Self {
            cluster: cluster.to_string(),
            not_after: issue.not_after,
            csr: issue.csr.clone(),
            requester: issue.requester.clone(),
        }
    }
}

fn is_fingerprint(key: &str) -> bool {
    key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The entries of a shard's data, and what is wrong with the rest (left
/// out: an entry the hub cannot read accepts nothing).
pub fn parse(data: &BTreeMap<String, String>) -> (HashMap<String, Entry>, Vec<String>) {
    let mut entries = HashMap::new();
    let mut errors = Vec::new();
    for (key, value) in data {
        if !is_fingerprint(key) {
            errors.push(format!(
                "key {key:?} is not a certificate's SHA-256 (64 lowercase hex digits); ignored"
            ));
            continue;
        }
        match serde_json::from_str::<Entry>(value) {
            Ok(e) => {
                entries.insert(key.clone(), e);
            }
            Err(e) => errors.push(format!("entry {key}: {e}; ignored")),
        }
    }
    (entries, errors)
}

/// The changes that bring a shard's `entries` to: `add` recorded, expired
/// ones (at `now`) dropped, at most [`MAX_PER_CLUSTER`] per cluster (the
/// latest to expire kept). `Some(entry)` writes a key, `None` removes it;
/// empty when nothing changes.
pub fn changes(
    entries: &HashMap<String, Entry>,
    add: &[(String, Entry)],
    now: i64,
) -> BTreeMap<String, Option<Entry>> {
    let mut next: HashMap<&str, &Entry> = entries
        .iter()
        .filter(|(_, e)| e.not_after > now)
        .map(|(k, e)| (k.as_str(), e))
        .collect();
    for (fp, e) in add {
        if e.not_after > now {
            next.insert(fp.as_str(), e);
        }
    }
    let mut by_cluster: HashMap<&str, Vec<(&str, &Entry)>> = HashMap::new();
    for (fp, e) in &next {
        by_cluster
            .entry(e.cluster.as_str())
            .or_default()
            .push((fp, e));
    }
    for list in by_cluster.values_mut() {
        if list.len() > MAX_PER_CLUSTER {
            list.sort_by_key(|(fp, e)| (std::cmp::Reverse(e.not_after), *fp));
            for (fp, _) in list.drain(MAX_PER_CLUSTER..) {
                next.remove(fp);
            }
        }
    }
    let mut out = BTreeMap::new();
    for fp in entries.keys() {
        if !next.contains_key(fp.as_str()) {
            out.insert(fp.clone(), None);
        }
    }
    for (fp, e) in next {
        if entries.get(fp) != Some(e) {
            out.insert(fp.to_string(), Some(e.clone()));
        }
    }
    out
}

/// The certificate a connection presents.
#[derive(Clone, Debug)]
pub struct Presented<'a> {
    /// The cluster its subject names.
    pub cluster: &'a str,
    pub fingerprint: &'a str,
    pub not_before: i64,
}

/// What the hub knows of a certificate.
#[derive(Clone, Debug, Default)]
pub struct Known<'a> {
    /// Its entry in the record.
    pub recorded: Option<&'a Entry>,
    /// Its CSR, as the hub's watch judged it: issued to `cluster` on its
    /// own request, or refused and why.
    pub issued: Option<&'a Issue>,
    pub refused: Option<(&'a Issue, &'a str)>,
    /// When the record of the cluster's shard began; `None` while the
    /// hub has not read it.
    pub since: Option<i64>,
}

/// Why a certificate is accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// In the record, or its CSR seen issued on the cluster's own request.
    Issued { csr: String, requester: String },
    /// Issued before the hub recorded anything (the upgrade grace): until
    /// it expires.
    Grace { since: i64 },
}

/// A refusal, with who asked for the certificate when the hub knows.
#[derive(Debug)]
pub struct Denied {
    pub refusal: Refusal,
    pub requester: String,
    pub csr: String,
}

/// Whether `cert` may speak for `cert.cluster`, at `now`.
pub fn decide(cert: &Presented<'_>, known: &Known<'_>, now: i64) -> Result<Accepted, Denied> {
    let cluster = cert.cluster;
    let fp = cert.fingerprint;
    if let Some((issue, why)) = known.refused {
        return Err(Denied {
            refusal: Refusal::new(
                "certificate-not-requested-by-cluster",
                RefusalCode::PermissionDenied,
                format!(
                    "the client certificate (SHA-256 {fp}) names cluster {cluster}, but it was issued on CSR {} and {why}: a certificate counts only when the cluster's own OCM identity asked for it",
                    issue.csr
                ),
            ),
            requester: issue.requester.clone(),
            csr: issue.csr.clone(),
        });
    }
    if let Some(e) = known.recorded.filter(|e| e.cluster == cluster) {
        return Ok(Accepted::Issued {
            csr: e.csr.clone(),
            requester: e.requester.clone(),
        });
    }
    if let Some(i) = known
        .issued
        .filter(|i| i.cluster.as_deref() == Some(cluster))
    {
        return Ok(Accepted::Issued {
            csr: i.csr.clone(),
            requester: i.requester.clone(),
        });
    }
    let Some(since) = known.since else {
        return Err(Denied {
            refusal: Refusal::new(
                "records-not-loaded",
                RefusalCode::Unavailable,
                "the hub has not read its record of issued certificates yet; try again".into(),
            ),
            requester: String::new(),
            csr: String::new(),
        });
    };
    if cert.not_before < since.saturating_sub(SKEW) {
        return Ok(Accepted::Grace { since });
    }
    let refusal = if now - cert.not_before < FRESH {
        Refusal::new(
            "certificate-not-recorded-yet",
            RefusalCode::Unavailable,
            format!(
                "the client certificate (SHA-256 {fp}) for cluster {cluster} was issued {}s ago and the hub has not seen its CSR yet; try again",
                (now - cert.not_before).max(0)
            ),
        )
    } else {
        Refusal::new(
            "certificate-not-recorded",
            RefusalCode::PermissionDenied,
            format!(
                "the client certificate (SHA-256 {fp}) for cluster {cluster} was not issued on a request by cluster {cluster}'s own OCM identity that this hub saw: only certificates OCM issues on the klusterlet's own CSR are accepted (delete the agent's certificate Secret on the cluster to have one issued now)"
            ),
        )
    };
    Err(Denied {
        refusal,
        requester: String::new(),
        csr: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(cluster: &str, not_after: i64) -> Entry {
        Entry {
            cluster: cluster.into(),
            not_after,
            csr: "csr-1".into(),
            requester: format!("system:open-cluster-management:{cluster}:a"),
        }
    }

    fn fp(c: char) -> String {
        c.to_string().repeat(64)
    }

    #[test]
    fn shards_are_stable_and_named() {
        // Fixed forever: a change would lose every record.
        assert_eq!(shard_of("cluster1"), shard_of("cluster1"));
        let spread: std::collections::HashSet<u32> =
            (0..200).map(|i| shard_of(&format!("cluster{i}"))).collect();
        assert_eq!(spread.len(), SHARDS as usize);
        assert_eq!(shard_name(3), "argocd-pull-issued-certificates-03");
        assert_eq!(shard_index("argocd-pull-issued-certificates-15"), Some(15));
        for other in [
            "argocd-pull-issued-certificates-16",
            "argocd-pull-issued-certificates-3",
            "argocd-pull-denied-certificates",
        ] {
            assert_eq!(shard_index(other), None, "{other}");
        }
    }

    #[test]
    fn entries_round_trip_and_junk_is_reported() {
        let e = entry("c1", 100);
        let data: BTreeMap<String, String> = [
            (fp('a'), serde_json::to_string(&e).unwrap()),
            (fp('b'), "not json".into()),
            ("cluster1".into(), "{}".into()),
            (fp('A'), serde_json::to_string(&e).unwrap()),
        ]
        .into();
        let (entries, errors) = parse(&data);
        assert_eq!(entries, [(fp('a'), e)].into());
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(data[&fp('a')].contains("\"notAfter\":100"), "{data:?}");
    }

    #[test]
    fn changes_add_prune_and_bound_per_cluster() {
        let now = 1_000;
        let entries: HashMap<String, Entry> = [
            (fp('a'), entry("c1", 2_000)),
            (fp('b'), entry("c1", 900)), // expired
            (fp('c'), entry("c2", 5_000)),
        ]
        .into();
        let add = vec![(fp('d'), entry("c1", 3_000)), (fp('e'), entry("c3", 10))];
        let got = changes(&entries, &add, now);
        assert_eq!(
            got,
            [(fp('b'), None), (fp('d'), Some(entry("c1", 3_000)))].into(),
            "the expired one goes, the new one comes, an expired addition is not written"
        );
        assert!(changes(&entries, &[], 0).is_empty(), "nothing to do");
        // A cluster with too many: the latest to expire stay, other
        // clusters are untouched.
        let add: Vec<(String, Entry)> = (0..MAX_PER_CLUSTER + 3)
            .map(|i| (format!("{i:064x}"), entry("c1", 10_000 + i as i64)))
            .collect();
        let got = changes(&entries, &add, now);
        let kept: Vec<&String> = got
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k)
            .collect();
        assert_eq!(kept.len(), MAX_PER_CLUSTER);
        assert_eq!(got.get(&fp('a')), Some(&None), "the oldest of c1 dropped");
        assert!(!got.contains_key(&fp('c')), "c2 untouched");
        assert!(!kept.contains(&&format!("{:064x}", 0)));
    }

    fn issue(cluster: Option<&str>, requester: &str) -> Issue {
        Issue {
            csr: "addon-cluster2-argocd-pull-xyz".into(),
            requester: requester.into(),
            fingerprint: fp('f'),
            not_before: 5_000,
            not_after: 90_000,
            cluster: cluster.map(str::to_string),
        }
    }

    #[test]
    fn decisions() {
        let now = 10_000;
        let cert = Presented {
            cluster: "cluster1",
            fingerprint: &fp('f'),
            not_before: 5_000,
        };
        let since = Some(1_000);
        // Recorded for the cluster: accepted, also long after its CSR went.
        let rec = entry("cluster1", 90_000);
        let known = Known {
            recorded: Some(&rec),
            since,
            ..Default::default()
        };
        assert!(matches!(
            decide(&cert, &known, now),
            Ok(Accepted::Issued { .. })
        ));
        // Recorded for another cluster: not this one's.
        let other = entry("cluster2", 90_000);
        let known = Known {
            recorded: Some(&other),
            since,
            ..Default::default()
        };
        let d = decide(&cert, &known, now).unwrap_err();
        assert_eq!(d.refusal.reason, "certificate-not-recorded");
        assert_eq!(d.refusal.code, RefusalCode::PermissionDenied);
        // Seen issued on its own request, before the leader recorded it.
        let own = issue(
            Some("cluster1"),
            "system:open-cluster-management:cluster1:a",
        );
        let known = Known {
            issued: Some(&own),
            since,
            ..Default::default()
        };
        assert!(decide(&cert, &known, now).is_ok());
        // Refused CSR: denied naming the requester, whatever else is known.
        let forged = issue(
            Some("cluster1"),
            "system:open-cluster-management:cluster2:b",
        );
        let why = "it was requested by cluster cluster2's klusterlet (system:open-cluster-management:cluster2:b), not by cluster cluster1's";
        let known = Known {
            refused: Some((&forged, why)),
            since: Some(i64::MAX),
            ..Default::default()
        };
        let d = decide(&cert, &known, now).unwrap_err();
        assert_eq!(d.refusal.reason, "certificate-not-requested-by-cluster");
        assert_eq!(d.refusal.code, RefusalCode::PermissionDenied);
        assert_eq!(d.requester, "system:open-cluster-management:cluster2:b");
        let msg = &d.refusal.message;
        assert!(
            msg.contains("cluster2's klusterlet") && msg.contains(&forged.csr),
            "{msg}"
        );
        // Unknown: the grace covers what was issued before recording began
        // (less the skew), nothing after.
        let unknown = |since: i64| Known {
            since: Some(since),
            ..Default::default()
        };
        assert_eq!(
            decide(&cert, &unknown(5_000 + SKEW + 1), now).unwrap(),
            Accepted::Grace {
                since: 5_000 + SKEW + 1
            }
        );
        let d = decide(&cert, &unknown(5_000 + SKEW), now).unwrap_err();
        assert_eq!(d.refusal.reason, "certificate-not-recorded");
        assert!(&d.refusal.message.contains("own OCM identity"));
        // Young and unknown: retriable.
        let d = decide(&cert, &unknown(1_000), 5_000 + FRESH - 1).unwrap_err();
        assert_eq!(d.refusal.reason, "certificate-not-recorded-yet");
        assert_eq!(d.refusal.code, RefusalCode::Unavailable);
        // The record not read yet: retriable.
        let d = decide(&cert, &Known::default(), now).unwrap_err();
        assert_eq!(d.refusal.reason, "records-not-loaded");
        assert_eq!(d.refusal.code, RefusalCode::Unavailable);
    }
}
