//! Property tests of the wire contract's decoding and shared logic: many
//! generated inputs, from a fixed seed so that every run (and every
//! failure) is the same. A failure prints the case number; rerun with
//! `PROPERTY_SEED=<seed>` to explore other seeds.
//!
//! What they hold: arbitrary bytes never make decoding or validation
//! panic; what validation accepts names objects the API server would
//! accept; content hashes ignore key order; a merge diff turns one value
//! into the other; digests, resyncs and repairs converge; the coalescing
//! outbox never loses the latest value nor exceeds its window; negotiation
//! never agrees on something outside both sides' offers.

use std::collections::{BTreeMap, BTreeSet};

use argocd_pull_proto::coalesce::Outbox;
use argocd_pull_proto::digest::{Entries, Repair, SetDigest, repairs_for, resync_requests};
use argocd_pull_proto::v1::{
    self, AgentMessage, AgentMode, ApplicationDelete, ApplicationUpsert, DigestSet, Gone, Hello,
    HubMessage, ObjectAck, ObjectKey, ObjectMeta, ObservedApplication, StatusReport, agent_message,
    hub_message, status_report,
};
use argocd_pull_proto::{content, limits, owner, validate, version};
use prost::Message;
use serde_json::Value;

const CASES: usize = 2_000;

#[path = "support/property.rs"]
mod property;
use property::{Rng, apply_merge_patch, k8s_name, k8s_namespace};

/// The wire contract's own generators.
trait WireRng {
    fn key(&mut self) -> Option<ObjectKey>;
    fn seq(&mut self) -> u64;
    fn outcome(&mut self) -> i32;
    fn uid(&mut self, long_one_in: usize, max: usize) -> String;
    fn object_ack(&mut self) -> ObjectAck;
}

impl WireRng for Rng {
    fn key(&mut self) -> Option<ObjectKey> {
        if self.chance(30) {
            return None;
        }
        Some(ObjectKey {
            namespace: self.name(63),
            name: self.name(253),
        })
    }

    /// Sequence numbers start at 1; 0 now and then.
    fn seq(&mut self) -> u64 {
        if self.chance(10) {
            0
        } else {
            1 + self.u64() % 1000
        }
    }

    /// Any outcome, and one past either end of the known ones.
    fn outcome(&mut self) -> i32 {
        self.below(6) as i32 - 1
    }

    /// Up to `max` characters, and one time in `long_one_in` longer than
    /// any uid the protocol accepts.
    fn uid(&mut self, long_one_in: usize, max: usize) -> String {
        if self.chance(long_one_in) {
            "u".repeat(200)
        } else {
            self.text(max)
        }
    }

    fn object_ack(&mut self) -> ObjectAck {
        ObjectAck {
            key: self.key(),
            seq: self.seq(),
            outcome: self.outcome(),
            message: self.text(20),
        }
    }
}

fn check_key(key: &Option<ObjectKey>) {
    let key = key.as_ref().expect("an accepted message has a key");
    assert!(k8s_namespace(&key.namespace), "accepted namespace {key:?}");
    assert!(k8s_name(&key.name), "accepted name {key:?}");
}

fn meta(r: &mut Rng) -> Option<ObjectMeta> {
    (!r.chance(20)).then(|| ObjectMeta {
        uid: r.text(40),
        resource_version: r.text(10),
        generation: r.u64() as i64,
        version: if r.chance(10) {
            String::new()
        } else {
            r.text(16)
        },
    })
}

fn hub_message(r: &mut Rng) -> HubMessage {
    use hub_message::Kind;
    let kind = match r.below(6) {
        0 => Some(Kind::Upsert(ApplicationUpsert {
            key: r.key(),
            seq: r.seq(),
            meta: meta(r),
            application_json: r.bytes(64),
            trace_parent: r.text(55),
        })),
        1 => Some(Kind::Delete(ApplicationDelete {
            key: r.key(),
            seq: r.seq(),
            hub_uid: r.uid(20, 40),
            release: r.chance(2),
        })),
        2 => Some(Kind::ObjectAck(r.object_ack())),
        3 => Some(Kind::Operation(v1::OperationRequest {
            operation_id: if r.chance(10) {
                "o".repeat(300)
            } else {
                r.text(30)
            },
            key: r.key(),
            kind: match r.below(4) {
                0 => None,
                1 => Some(v1::operation_request::Kind::Sync(v1::SyncOperation {
                    operation_json: r.bytes(20),
                })),
                2 => Some(v1::operation_request::Kind::Refresh(v1::RefreshRequest {
                    kind: r.below(5) as i32 - 1,
                })),
                _ => Some(v1::operation_request::Kind::Terminate(
                    v1::TerminateOperation {},
                )),
            },
            hub_uid: r.uid(10, 10),
        })),
        4 => Some(Kind::Digest(v1::Digest {
            set: r.below(4) as i32,
            count: r.u64() % 100,
            total: r.bytes(40),
            bucket_digests: (0..r.below(70)).map(|_| r.bytes(34)).collect(),
        })),
        _ => None,
    };
    HubMessage { kind }
}

fn agent_message(r: &mut Rng) -> AgentMessage {
    use agent_message::Kind;
    let kind = match r.below(4) {
        0 => Some(Kind::Status(StatusReport {
            key: r.key(),
            seq: r.seq(),
            state: match r.below(3) {
                0 => None,
                1 => Some(status_report::State::Gone(Gone { uid: r.text(40) })),
                _ => Some(status_report::State::Observed(ObservedApplication {
                    meta: meta(r),
                    status_json: r.bytes(32),
                    application_json: r.bytes(32),
                    last_operation_id: r.text(20),
                    hub_uid: r.uid(20, 40),
                })),
            },
            trace_parent: r.text(55),
        })),
        1 => Some(Kind::ObjectAck(r.object_ack())),
        2 => Some(Kind::OperationAck(v1::OperationAck {
            operation_id: r.text(30),
            key: r.key(),
            outcome: r.outcome(),
            message: r.text(20),
            settled: r.below(2) == 1,
            settled_started_at: r.text(70),
        })),
        _ => None,
    };
    AgentMessage { kind }
}

#[test]
fn arbitrary_bytes_never_make_decoding_or_validation_panic() {
    let mut r = Rng::new();
    let mut decoded = 0;
    for _ in 0..CASES * 5 {
        let mut bytes = r.bytes(96);
        // Valid messages mutated are more interesting than pure noise.
        if r.chance(2) {
            bytes = hub_message(&mut r).encode_to_vec();
            for _ in 0..r.below(3) {
                if !bytes.is_empty() {
                    let i = r.below(bytes.len());
                    bytes[i] ^= 1 << r.below(8);
                }
            }
            bytes.truncate(bytes.len() - r.below(bytes.len().min(4) + 1));
        }
        if let Ok(m) = HubMessage::decode(bytes.as_slice()) {
            decoded += 1;
            let _ = validate::hub_message(&m);
            assert_eq!(HubMessage::decode(m.encode_to_vec().as_slice()).unwrap(), m);
        }
        if let Ok(m) = AgentMessage::decode(bytes.as_slice()) {
            let _ = validate::agent_message(&m);
            let _ = validate::first_agent_message(&m);
            if let Some(agent_message::Kind::Hello(h)) = &m.kind {
                let _ = version::negotiate(&version::HubOffer::default(), h);
            }
        }
        let _ = owner::parse_conflict(&String::from_utf8_lossy(&bytes));
    }
    assert!(
        decoded > CASES / 2,
        "only {decoded} inputs decoded: the generator is too noisy"
    );
}

#[test]
fn what_validation_accepts_the_api_server_would_accept() {
    let mut r = Rng::new();
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..CASES * 5 {
        let m = hub_message(&mut r);
        match validate::hub_message(&m) {
            Err(_) => refused += 1,
            Ok(()) => {
                accepted += 1;
                use hub_message::Kind;
                match m.kind.as_ref().expect("accepted") {
                    Kind::Upsert(u) => {
                        check_key(&u.key);
                        assert!(u.seq > 0, "case {case}");
                        assert!(!u.meta.as_ref().unwrap().version.is_empty());
                    }
                    Kind::Delete(d) => {
                        check_key(&d.key);
                        assert!(d.seq > 0 && !d.hub_uid.is_empty() && d.hub_uid.len() <= 128);
                    }
                    Kind::ObjectAck(a) => check_key(&a.key),
                    Kind::Operation(o) => {
                        check_key(&o.key);
                        assert!(!o.operation_id.is_empty() && o.operation_id.len() <= 253);
                    }
                    Kind::Digest(d) => {
                        assert_eq!(d.bucket_digests.len(), 64, "case {case}");
                    }
                    _ => {}
                }
            }
        }
        let m = agent_message(&mut r);
        if validate::agent_message(&m).is_ok() {
            use agent_message::Kind;
            match m.kind.as_ref().expect("accepted") {
                Kind::Status(s) => {
                    check_key(&s.key);
                    if let Some(status_report::State::Observed(o)) = &s.state {
                        assert!(o.hub_uid.len() <= 128, "case {case}");
                    }
                }
                Kind::ObjectAck(a) => check_key(&a.key),
                Kind::OperationAck(a) => check_key(&a.key),
                _ => {}
            }
        }
    }
    // Both sides of the line were explored.
    assert!(
        accepted > CASES / 10 && refused > CASES / 10,
        "{accepted} accepted, {refused} refused"
    );
    // The largest message the limits allow is within the message limit.
    assert!(limits::check_message(limits::MAX_OBJECT_JSON_BYTES * 2 + 4096).is_ok());
}

/// Shuffles the keys of every object (serde_json keeps insertion order).
fn reorder(r: &mut Rng, v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut items: Vec<(String, Value)> =
                m.iter().map(|(k, v)| (k.clone(), reorder(r, v))).collect();
            for i in (1..items.len()).rev() {
                items.swap(i, r.below(i + 1));
            }
            Value::Object(items.into_iter().collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| reorder(r, v)).collect()),
        other => other.clone(),
    }
}

fn without_nulls_in_objects(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls_in_objects(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls_in_objects).collect()),
        other => other.clone(),
    }
}

#[test]
fn content_hashes_ignore_key_order_and_merge_diffs_reach_their_target() {
    let mut r = Rng::new();
    for case in 0..CASES {
        let v = r.json(4);
        let shuffled = reorder(&mut r, &v);
        assert_eq!(content::hash(&v), content::hash(&shuffled), "case {case}");
        let canonical = content::canonical(&v);
        let back: Value = serde_json::from_slice(&canonical).expect("canonical is JSON");
        assert_eq!(back, v, "case {case}");
        assert_eq!(content::hash(&v).len(), content::HASH_HEX_LEN);

        // A merge patch cannot say "set to null" inside an object: targets
        // as the Kubernetes objects they stand for have no such fields.
        let from = r.json(3);
        let to = without_nulls_in_objects(&r.json(3));
        match content::merge_diff(&from, &to) {
            None => assert_eq!(from, to, "case {case}"),
            Some(p) => assert_eq!(apply_merge_patch(&from, &p), to, "case {case}: {p}"),
        }
    }
}

fn entries(r: &mut Rng, n: usize) -> Entries {
    (0..n)
        .map(|i| {
            (
                ObjectKey {
                    namespace: format!("ns{}", r.below(4)),
                    name: format!("app-{i}-{}", r.below(1000)),
                },
                r.text(6),
            )
        })
        .collect()
}

#[test]
fn digests_and_resyncs_converge() {
    let mut r = Rng::new();
    for case in 0..CASES / 4 {
        let n = r.below(60);
        let owner = entries(&mut r, n);
        // The replica: the owner's set, some entries stale, missing or extra.
        let mut replica = owner.clone();
        let keys: Vec<ObjectKey> = replica.keys().cloned().collect();
        for k in keys {
            match r.below(8) {
                0 => {
                    replica.remove(&k);
                }
                1 => {
                    replica.insert(k, "stale".into());
                }
                _ => {}
            }
        }
        let extra = r.below(3);
        replica.extend(entries(&mut r, extra));

        let ours = SetDigest::of(&owner);
        let wire = ours.to_proto(DigestSet::Desired);
        let (set, theirs) = SetDigest::from_proto(&wire).expect("own digest decodes");
        assert_eq!((set, &theirs), (DigestSet::Desired, &ours), "case {case}");
        let buckets = SetDigest::of(&replica).differing_buckets(&theirs);
        assert_eq!(buckets.is_empty(), owner == replica, "case {case}");

        // The replica lists its entries where buckets differ; the owner's
        // repairs make it equal.
        let mut repaired = replica.clone();
        for request in resync_requests(DigestSet::Desired, &replica, &buckets) {
            assert!(
                request.encoded_len() < limits::MAX_MESSAGE_BYTES,
                "case {case}"
            );
            for repair in repairs_for(&owner, &request).expect("own request is valid") {
                match repair {
                    Repair::Send(k) => {
                        repaired.insert(k.clone(), owner[&k].clone());
                    }
                    Repair::Remove(k) => {
                        repaired.remove(&k);
                    }
                }
            }
        }
        assert_eq!(repaired, owner, "case {case}");
    }
}

#[test]
fn the_outbox_keeps_the_latest_value_within_its_window() {
    let mut r = Rng::new();
    for case in 0..CASES / 4 {
        let window = 1 + r.below(4);
        let mut outbox: Outbox<u8, u32> = Outbox::new(window);
        let mut latest: BTreeMap<u8, u32> = BTreeMap::new();
        let mut delivered: BTreeMap<u8, u32> = BTreeMap::new();
        let mut flying: BTreeMap<u8, (u64, u32)> = BTreeMap::new();
        let mut last_seq = 0;
        let mut counter = 0;
        for _ in 0..r.below(200) {
            match r.below(5) {
                0 | 1 => {
                    let k = r.below(6) as u8;
                    counter += 1;
                    latest.insert(k, counter);
                    outbox.upsert(k, counter);
                }
                2 => {
                    if let Some(m) = outbox.next_ready() {
                        assert!(m.seq > last_seq, "case {case}: seq went back");
                        last_seq = m.seq;
                        assert!(
                            flying.insert(m.key, (m.seq, m.value)).is_none(),
                            "case {case}: two in flight for one key"
                        );
                    }
                }
                3 => {
                    if let Some((&k, &(seq, v))) = flying.iter().nth(r.below(flying.len().max(1))) {
                        if r.chance(3) {
                            assert!(outbox.nack(&k, seq));
                        } else {
                            assert!(outbox.ack(&k, seq));
                            delivered.insert(k, v);
                        }
                        flying.remove(&k);
                        // A stale acknowledgement never matches.
                        assert!(!outbox.ack(&k, seq), "case {case}");
                    }
                }
                _ => {
                    if r.chance(4) {
                        outbox.requeue_in_flight();
                        flying.clear();
                    }
                }
            }
            assert!(outbox.in_flight() <= window, "case {case}");
            assert_eq!(outbox.in_flight(), flying.len(), "case {case}");
        }
        // Drain: every key ends with its latest value delivered.
        outbox.requeue_in_flight();
        while let Some(m) = outbox.next_ready() {
            assert!(outbox.ack(&m.key, m.seq));
            delivered.insert(m.key, m.value);
        }
        assert!(outbox.is_empty(), "case {case}");
        for (k, v) in &latest {
            assert_eq!(delivered.get(k), Some(v), "case {case}: key {k}");
        }
    }
}

#[test]
fn negotiation_never_agrees_outside_both_offers() {
    let mut r = Rng::new();
    let caps = [
        "terminate-operation",
        "owner-check",
        "x",
        "Bad Cap",
        "",
        "future.thing",
    ];
    for case in 0..CASES {
        let hello = Hello {
            min_protocol_version: r.below(4) as u32,
            max_protocol_version: r.below(4) as u32,
            capabilities: (0..r.below(5)).map(|_| r.pick(&caps).to_string()).collect(),
            mode: r.below(4) as i32,
            agent_version: r.text(10),
            heartbeat_interval_seconds: if r.chance(2) { 0 } else { r.below(40) as u32 },
        };
        let hub = version::HubOffer {
            modes: if r.chance(3) {
                vec![AgentMode::Managed]
            } else {
                vec![AgentMode::Managed, AgentMode::Autonomous]
            },
            ..Default::default()
        };
        let Ok(n) = version::negotiate(&hub, &hello) else {
            continue;
        };
        // An agent only ever shortens the hub's interval, down to its floor.
        let asked = std::time::Duration::from_secs(hello.heartbeat_interval_seconds.into());
        assert!(
            n.heartbeat <= hub.heartbeat
                && n.heartbeat >= hub.heartbeat_min
                && (asked.is_zero()
                    || asked < hub.heartbeat_min
                    || asked > hub.heartbeat
                    || n.heartbeat == asked)
                && (!asked.is_zero() || n.heartbeat == hub.heartbeat),
            "case {case}: heartbeat {:?} from {hello:?}",
            n.heartbeat
        );
        assert!(
            hub.range.contains(n.version)
                && hello.min_protocol_version <= n.version
                && n.version <= hello.max_protocol_version,
            "case {case}: {n:?} from {hello:?}"
        );
        let offered: BTreeSet<String> = hello.capabilities.iter().cloned().collect();
        assert!(n.capabilities.is_subset(&offered), "case {case}");
        assert!(n.capabilities.is_subset(&hub.capabilities), "case {case}");
        assert!(hub.modes.contains(&n.mode), "case {case}");
        let welcome = v1::Welcome {
            protocol_version: n.version,
            capabilities: n.capabilities.iter().cloned().collect(),
            heartbeat_interval_seconds: 10,
            max_message_bytes: limits::MAX_MESSAGE_BYTES as u32,
            ..Default::default()
        };
        assert_eq!(
            version::accept_welcome(&hello, &welcome).map(|a| a.version),
            Ok(n.version),
            "case {case}"
        );
    }
}
