//! Anti-entropy: digests of a set of objects, and the repairs when two
//! copies of a set differ.
//!
//! argocd-agent resyncs only when a process starts; a lost message after a
//! plain reconnect stays lost. Here the owner of a set (the hub for desired
//! Applications, the agent for observed ones) sends a digest after every
//! handshake and periodically; the replica compares it with its own. Entries
//! are spread over [`BUCKETS`] buckets by a hash of their key, so a
//! mismatch narrows to the buckets that differ and only their entries
//! travel back in a `ResyncRequest`. The owner then [`diff`]s and repairs.
//!
//! The digest is deterministic: the same entries give the same bytes on
//! every machine and in every release speaking protocol 1 (the tests pin
//! it), whatever order the entries were collected in.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use sha2::{Digest as _, Sha256};

use crate::{
    limits::MAX_MESSAGE_BYTES,
    v1::{self as pb, DigestEntry, DigestSet, ObjectKey, ResyncRequest},
};

/// Buckets per digest in protocol 1.
pub const BUCKETS: u32 = 64;

/// A SHA-256 hash.
pub type Hash = [u8; 32];

/// A set: the version of each object, by key.
pub type Entries = BTreeMap<ObjectKey, String>;

/// Domain separation, so a digest is never mistaken for another SHA-256.
const TOTAL_PREFIX: &[u8] = b"argocd-pull.v1 digest";

/// The summary of a set the owner sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetDigest {
    pub count: u64,
    pub total: Hash,
    /// [`BUCKETS`] digests, bucket 0 first.
    pub buckets: Vec<Hash>,
}

/// A digest or resync request that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {message}: {reason}")]
pub struct DigestError {
    message: &'static str,
    reason: String,
}

impl DigestError {
    fn digest(reason: String) -> Self {
        Self {
            message: "Digest",
            reason,
        }
    }

    fn resync(reason: String) -> Self {
        Self {
            message: "ResyncRequest",
            reason,
        }
    }
}

impl From<DigestError> for tonic::Status {
    fn from(e: DigestError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// What the owner of a set does about one key after comparing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Repair {
    /// The replica lacks the key or has another version: send the owner's
    /// latest value again (through the outbox, like any change).
    Send(ObjectKey),
    /// The replica has a key the owner does not: the hub sends an
    /// ApplicationDelete, the agent a StatusReport with `gone`.
    Remove(ObjectKey),
}

/// Hashes one length-prefixed field, so that field boundaries are part of
/// the digest (`("ab", "c")` and `("a", "bc")` differ).
fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

/// The bucket of a key.
pub fn bucket_of(key: &ObjectKey) -> u32 {
    let mut h = Sha256::new();
    field(&mut h, key.namespace.as_bytes());
    field(&mut h, key.name.as_bytes());
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % BUCKETS
}

fn total(count: u64, buckets: &[Hash]) -> Hash {
    let mut h = Sha256::new();
    h.update(TOTAL_PREFIX);
    h.update(count.to_be_bytes());
    for b in buckets {
        h.update(b);
    }
    h.finalize().into()
}

impl SetDigest {
    /// The digest of `entries`. Protocol 1 defines it as follows, with
    /// `field(b)` = the length of `b` as 8 bytes big-endian, then `b`:
    /// - bucket of a key: the first 4 bytes, big-endian, of
    ///   `SHA-256(field(namespace) field(name))`, modulo [`BUCKETS`];
    /// - bucket digest: `SHA-256` over `field(namespace) field(name)
    ///   field(version)` of the bucket's entries in (namespace, name) order,
    ///   compared as bytes;
    /// - total: `SHA-256("argocd-pull.v1 digest" count-as-8-bytes-big-endian
    ///   bucket-digest-0 .. bucket-digest-63)`.
    pub fn of(entries: &Entries) -> Self {
        let mut hashers: Vec<Sha256> = (0..BUCKETS).map(|_| Sha256::new()).collect();
        // A BTreeMap iterates in key order, so each bucket sees its entries
        // in the same order everywhere.
        for (key, version) in entries {
            let h = &mut hashers[bucket_of(key) as usize];
            field(h, key.namespace.as_bytes());
            field(h, key.name.as_bytes());
            field(h, version.as_bytes());
        }
        let buckets: Vec<Hash> = hashers.into_iter().map(|h| h.finalize().into()).collect();
        let count = entries.len() as u64;
        Self {
            count,
            total: total(count, &buckets),
            buckets,
        }
    }

    /// The buckets where `self` and `other` differ, in order.
    pub fn differing_buckets(&self, other: &SetDigest) -> Vec<u32> {
        (0..BUCKETS)
            .filter(|&b| self.buckets.get(b as usize) != other.buckets.get(b as usize))
            .collect()
    }

    pub fn to_proto(&self, set: DigestSet) -> pb::Digest {
        pb::Digest {
            set: set as i32,
            count: self.count,
            total: self.total.to_vec(),
            bucket_digests: self.buckets.iter().map(|b| b.to_vec()).collect(),
        }
    }

    /// Reads and checks a received digest.
    pub fn from_proto(d: &pb::Digest) -> Result<(DigestSet, Self), DigestError> {
        let set = digest_set(d.set).map_err(DigestError::digest)?;
        if d.bucket_digests.len() != BUCKETS as usize {
            return Err(DigestError::digest(format!(
                "{} bucket digests, protocol 1 has {BUCKETS}",
                d.bucket_digests.len()
            )));
        }
        let hash = |bytes: &[u8], what: &str| -> Result<Hash, DigestError> {
            bytes.try_into().map_err(|_| {
                DigestError::digest(format!("{what} is {} bytes, not 32", bytes.len()))
            })
        };
        let buckets = d
            .bucket_digests
            .iter()
            .enumerate()
            .map(|(i, b)| hash(b, &format!("bucket digest {i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let digest = Self {
            count: d.count,
            total: hash(&d.total, "total")?,
            buckets,
        };
        if digest.total != total(digest.count, &digest.buckets) {
            return Err(DigestError::digest(
                "total does not match the count and bucket digests".into(),
            ));
        }
        Ok((set, digest))
    }
}

fn digest_set(raw: i32) -> Result<DigestSet, String> {
    match DigestSet::try_from(raw) {
        Ok(DigestSet::Unspecified) => Err("set is unspecified".into()),
        Ok(set) => Ok(set),
        Err(_) => Err(format!("set {raw} is not a known set")),
    }
}

/// What the owner must do so the replica matches it, in key order.
pub fn diff(owner: &Entries, replica: &Entries) -> Vec<Repair> {
    let mut repairs: Vec<Repair> = owner
        .iter()
        .filter(|(key, version)| replica.get(*key) != Some(*version))
        .map(|(key, _)| Repair::Send(key.clone()))
        .collect();
    repairs.extend(
        replica
            .keys()
            .filter(|key| !owner.contains_key(*key))
            .map(|key| Repair::Remove(key.clone())),
    );
    repairs.sort_by(|a, b| repair_key(a).cmp(repair_key(b)));
    repairs
}

fn repair_key(r: &Repair) -> &ObjectKey {
    match r {
        Repair::Send(k) | Repair::Remove(k) => k,
    }
}

/// The replica's side: the requests listing its entries in `buckets`, each
/// request holding whole buckets and staying well under the message limit.
pub fn resync_requests(set: DigestSet, replica: &Entries, buckets: &[u32]) -> Vec<ResyncRequest> {
    let wanted: BTreeSet<u32> = buckets.iter().copied().filter(|b| *b < BUCKETS).collect();
    let mut by_bucket: BTreeMap<u32, Vec<DigestEntry>> =
        wanted.iter().map(|b| (*b, Vec::new())).collect();
    for (key, version) in replica {
        if let Some(list) = by_bucket.get_mut(&bucket_of(key)) {
            list.push(DigestEntry {
                key: Some(key.clone()),
                version: version.clone(),
            });
        }
    }

    let budget = MAX_MESSAGE_BYTES / 2;
    let mut requests = Vec::new();
    let mut current = ResyncRequest {
        set: set as i32,
        buckets: Vec::new(),
        entries: Vec::new(),
    };
    for (bucket, entries) in by_bucket {
        let size: usize = entries.iter().map(|e| e.encoded_len() + 4).sum();
        if !current.buckets.is_empty() && current.encoded_len() + size > budget {
            requests.push(std::mem::replace(
                &mut current,
                ResyncRequest {
                    set: set as i32,
                    buckets: Vec::new(),
                    entries: Vec::new(),
                },
            ));
        }
        current.buckets.push(bucket);
        current.entries.extend(entries);
    }
    if !current.buckets.is_empty() {
        requests.push(current);
    }
    requests
}

/// The owner's side: checks a received request and returns the repairs for
/// the buckets it covers.
pub fn repairs_for(owner: &Entries, request: &ResyncRequest) -> Result<Vec<Repair>, DigestError> {
    digest_set(request.set).map_err(DigestError::resync)?;
    let mut buckets = BTreeSet::new();
    for &b in &request.buckets {
        if b >= BUCKETS {
            return Err(DigestError::resync(format!(
                "bucket {b} does not exist, protocol 1 has {BUCKETS}"
            )));
        }
        buckets.insert(b);
    }
    let mut replica = Entries::new();
    for entry in &request.entries {
        let Some(key) = &entry.key else {
            return Err(DigestError::resync("an entry has no key".into()));
        };
        if !buckets.contains(&bucket_of(key)) {
            return Err(DigestError::resync(format!(
                "entry {}/{} is in bucket {}, which the request does not list",
                key.namespace,
                key.name,
                bucket_of(key)
            )));
        }
        if replica.insert(key.clone(), entry.version.clone()).is_some() {
            return Err(DigestError::resync(format!(
                "entry {}/{} is listed twice",
                key.namespace, key.name
            )));
        }
    }
    let owner_part: Entries = owner
        .iter()
        .filter(|(key, _)| buckets.contains(&bucket_of(key)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(diff(&owner_part, &replica))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn entries(list: &[(&str, &str, &str)]) -> Entries {
        list.iter()
            .map(|(ns, name, v)| (key(ns, name), v.to_string()))
            .collect()
    }

    /// `n` Applications `ns/app-<i>`, each at version 1.
    fn apps(n: usize) -> Entries {
        (0..n)
            .map(|i| (key("ns", &format!("app-{i}")), "1".to_string()))
            .collect()
    }

    fn hex(h: &Hash) -> String {
        h.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn digest_is_pinned() {
        // The exact bytes are part of protocol 1: a change here breaks
        // every mixed-version fleet. Change it only with a new protocol
        // version. The values were computed by an independent Python
        // implementation of the algorithm documented on `SetDigest::of`.
        assert_eq!(bucket_of(&key("argocd", "guestbook")), 15);
        assert_eq!(
            hex(&SetDigest::of(&Entries::new()).total),
            "e99ca77a66aa318b1b0ff769f4082d08d97c027d7bcdea4bcfcfa51e01fc6850"
        );
        assert_eq!(
            hex(&SetDigest::of(&entries(&[("argocd", "guestbook", "v1")])).total),
            "88376f81ff25b9959b7e3e20388807212fd7a658db13de8a2db5cfd146c1c0ed"
        );
    }

    #[test]
    fn digest_depends_on_content_not_order() {
        let a = entries(&[("ns", "a", "1"), ("ns", "b", "2"), ("other", "a", "3")]);
        let mut b = Entries::new();
        for (k, v) in a.iter().rev() {
            b.insert(k.clone(), v.clone());
        }
        assert_eq!(SetDigest::of(&a), SetDigest::of(&b));

        let cases: &[(&str, Entries)] = &[
            (
                "a version changed",
                entries(&[("ns", "a", "9"), ("ns", "b", "2"), ("other", "a", "3")]),
            ),
            (
                "an entry missing",
                entries(&[("ns", "a", "1"), ("ns", "b", "2")]),
            ),
            (
                "an entry added",
                entries(&[
                    ("ns", "a", "1"),
                    ("ns", "b", "2"),
                    ("other", "a", "3"),
                    ("x", "y", "z"),
                ]),
            ),
            (
                "a field boundary moved",
                entries(&[("ns", "a", "1"), ("ns", "b", "2"), ("othe", "ra", "3")]),
            ),
        ];
        for (what, other) in cases {
            let (da, db) = (SetDigest::of(&a), SetDigest::of(other));
            assert_ne!(da.total, db.total, "{what}");
            assert!(!da.differing_buckets(&db).is_empty(), "{what}");
        }
    }

    #[test]
    fn one_change_touches_one_bucket() {
        let many = apps(500);
        let mut changed = many.clone();
        changed.insert(key("ns", "app-42"), "2".into());
        let differing = SetDigest::of(&many).differing_buckets(&SetDigest::of(&changed));
        assert_eq!(differing, vec![bucket_of(&key("ns", "app-42"))]);
    }

    #[test]
    fn diff_table() {
        let cases: &[(&str, Entries, Entries, Vec<Repair>)] = &[
            (
                "equal",
                entries(&[("a", "x", "1")]),
                entries(&[("a", "x", "1")]),
                vec![],
            ),
            (
                "replica lacks one",
                entries(&[("a", "x", "1"), ("a", "y", "1")]),
                entries(&[("a", "x", "1")]),
                vec![Repair::Send(key("a", "y"))],
            ),
            (
                "replica is stale",
                entries(&[("a", "x", "2")]),
                entries(&[("a", "x", "1")]),
                vec![Repair::Send(key("a", "x"))],
            ),
            (
                "replica has an extra one",
                entries(&[("a", "x", "1")]),
                entries(&[("a", "x", "1"), ("b", "z", "1")]),
                vec![Repair::Remove(key("b", "z"))],
            ),
            (
                "everything at once, in key order",
                entries(&[("a", "x", "2"), ("c", "y", "1")]),
                entries(&[("a", "x", "1"), ("b", "z", "1")]),
                vec![
                    Repair::Send(key("a", "x")),
                    Repair::Remove(key("b", "z")),
                    Repair::Send(key("c", "y")),
                ],
            ),
            (
                "empty replica",
                entries(&[("a", "x", "1")]),
                Entries::new(),
                vec![Repair::Send(key("a", "x"))],
            ),
        ];
        for (what, owner, replica, want) in cases {
            assert_eq!(&diff(owner, replica), want, "{what}");
        }
    }

    #[test]
    fn round_trip_repairs_only_what_differs() {
        let owner = apps(300);
        let mut replica = owner.clone();
        replica.insert(key("ns", "app-7"), "0".into());
        replica.remove(&key("ns", "app-8"));
        replica.insert(key("ns", "stray"), "1".into());

        // Owner sends its digest; the replica reads it and asks for the
        // buckets that differ.
        let sent = SetDigest::of(&owner).to_proto(DigestSet::Desired);
        let (set, theirs) = SetDigest::from_proto(&sent).unwrap();
        assert_eq!(set, DigestSet::Desired);
        let buckets = SetDigest::of(&replica).differing_buckets(&theirs);
        assert!(buckets.len() <= 3);
        let requests = resync_requests(set, &replica, &buckets);
        assert_eq!(requests.len(), 1);

        let mut repairs = repairs_for(&owner, &requests[0]).unwrap();
        repairs.sort();
        assert_eq!(
            repairs,
            vec![
                Repair::Send(key("ns", "app-7")),
                Repair::Send(key("ns", "app-8")),
                Repair::Remove(key("ns", "stray")),
            ]
        );
    }

    #[test]
    fn full_resync_of_a_large_set_splits_by_bucket() {
        let replica: Entries = (0..20_000)
            .map(|i| {
                (
                    key("a-long-namespace", &format!("application-{i:08}")),
                    "x".repeat(200),
                )
            })
            .collect();
        let all: Vec<u32> = (0..BUCKETS).collect();
        let requests = resync_requests(DigestSet::Observed, &replica, &all);
        assert!(requests.len() > 1);
        let mut seen = BTreeSet::new();
        let mut total = 0;
        for r in &requests {
            assert!(r.encoded_len() <= MAX_MESSAGE_BYTES);
            for b in &r.buckets {
                assert!(seen.insert(*b), "bucket {b} in two requests");
            }
            total += r.entries.len();
            // Each request is valid on its own.
            repairs_for(&replica, r).unwrap();
        }
        assert_eq!(seen.len(), BUCKETS as usize);
        assert_eq!(total, replica.len());
    }

    #[test]
    fn malformed_digests_and_requests() {
        let good = SetDigest::of(&entries(&[("a", "x", "1")])).to_proto(DigestSet::Observed);
        let mut short = good.clone();
        short.bucket_digests.pop();
        let mut bad_len = good.clone();
        bad_len.bucket_digests[3] = vec![0; 31];
        let mut bad_total = good.clone();
        bad_total.count += 1;
        let mut no_set = good.clone();
        no_set.set = 0;
        let cases = [
            (
                short,
                "malformed Digest: 63 bucket digests, protocol 1 has 64",
            ),
            (
                bad_len,
                "malformed Digest: bucket digest 3 is 31 bytes, not 32",
            ),
            (
                bad_total,
                "malformed Digest: total does not match the count and bucket digests",
            ),
            (no_set, "malformed Digest: set is unspecified"),
        ];
        for (d, want) in cases {
            assert_eq!(SetDigest::from_proto(&d).unwrap_err().to_string(), want);
        }

        let k = key("a", "x");
        let other_bucket = (bucket_of(&k) + 1) % BUCKETS;
        let entry = DigestEntry {
            key: Some(k.clone()),
            version: "1".into(),
        };
        let request = |buckets: Vec<u32>, entries: Vec<DigestEntry>| ResyncRequest {
            set: DigestSet::Desired as i32,
            buckets,
            entries,
        };
        let cases = [
            (
                request(vec![BUCKETS], vec![]),
                "malformed ResyncRequest: bucket 64 does not exist, protocol 1 has 64".to_string(),
            ),
            (
                request(vec![other_bucket], vec![entry.clone()]),
                format!(
                    "malformed ResyncRequest: entry a/x is in bucket {}, which the request does not list",
                    bucket_of(&k)
                ),
            ),
            (
                request(vec![bucket_of(&k)], vec![entry.clone(), entry.clone()]),
                "malformed ResyncRequest: entry a/x is listed twice".to_string(),
            ),
            (
                request(
                    vec![bucket_of(&k)],
                    vec![DigestEntry {
                        key: None,
                        version: "1".into(),
                    }],
                ),
                "malformed ResyncRequest: an entry has no key".to_string(),
            ),
        ];
        for (r, want) in cases {
            assert_eq!(
                repairs_for(&Entries::new(), &r).unwrap_err().to_string(),
                want
            );
        }
    }
}
