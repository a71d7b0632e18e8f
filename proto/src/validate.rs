//! Structural checks of received messages.
//!
//! A message that breaks the contract (no body, no key, a zero seq, an
//! unknown enum value) ends the stream with `INVALID_ARGUMENT` and a message
//! naming the field, so a broken peer is found at once instead of being
//! retried forever. Problems of one object's content (its JSON, its size, its
//! mode) are not checked here: they are answered per object with a REJECTED
//! acknowledgement.

use crate::{
    digest::SetDigest,
    limits::{MAX_LIVE_CHUNK_BYTES, MAX_OBJECT_JSON_BYTES},
    v1::{
        AckOutcome, AgentMessage, HubMessage, ObjectKey, RefreshKind, agent_message, hub_message,
        operation_request, status_report,
    },
};

pub mod terminal;

/// The longest namespace and name Kubernetes allows.
const MAX_NAMESPACE_LEN: usize = 63;
const MAX_NAME_LEN: usize = 253;
/// The longest operation id accepted.
pub const MAX_OPERATION_ID_LEN: usize = 253;

/// A message that breaks the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {0}")]
pub struct Malformed(String);

impl From<Malformed> for tonic::Status {
    fn from(e: Malformed) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

fn malformed(what: &str, reason: impl std::fmt::Display) -> Malformed {
    Malformed(format!("{what}: {reason}"))
}

/// The first message of a stream must be a Hello.
pub fn first_agent_message(m: &AgentMessage) -> Result<&crate::v1::Hello, Malformed> {
    match &m.kind {
        Some(agent_message::Kind::Hello(h)) => Ok(h),
        _ => Err(Malformed(
            "stream: the first message must be a Hello".to_string(),
        )),
    }
}

/// Checks a message received by the hub (after the handshake).
pub fn agent_message(m: &AgentMessage) -> Result<(), Malformed> {
    use agent_message::Kind;
    match &m.kind {
        None => Err(Malformed(
            "AgentMessage: no body (unknown to this protocol version)".into(),
        )),
        Some(Kind::Hello(_)) => Err(Malformed("AgentMessage: Hello after the handshake".into())),
        Some(Kind::Status(s)) => {
            const W: &str = "StatusReport";
            key(W, s.key.as_ref())?;
            seq(W, s.seq)?;
            match &s.state {
                None => Err(malformed(W, "no state (observed or gone)")),
                Some(status_report::State::Observed(o)) => {
                    let Some(meta) = &o.meta else {
                        return Err(malformed(W, "observed.meta is missing"));
                    };
                    if meta.version.is_empty() {
                        return Err(malformed(W, "observed.meta.version is empty"));
                    }
                    uid(W, "observed.hub_uid", &o.hub_uid)
                }
                Some(status_report::State::Gone(_)) => Ok(()),
            }
        }
        Some(Kind::ObjectAck(a)) => object_ack(a),
        Some(Kind::OperationAck(a)) => operation_ack(a),
        Some(Kind::Digest(d)) => digest(d),
        Some(Kind::ResyncRequest(r)) => resync_request(r),
        Some(Kind::Heartbeat(_)) => Ok(()),
        Some(Kind::ProjectSetAck(a)) => project_set_ack(a),
        Some(Kind::Tree(t)) => tree(t),
        Some(Kind::LiveResponse(r)) => live_response(r),
        Some(Kind::TerminalOpened(o)) => terminal::opened(o),
        Some(Kind::TerminalData(d)) => terminal::data(d, terminal::FROM_AGENT),
        Some(Kind::TerminalCredit(c)) => terminal::credit(c),
        Some(Kind::TerminalClose(c)) => terminal::close(c),
    }
}

/// An agent's LiveResponse: an id, and a chunk within the limit of one
/// chunk.
fn live_response(r: &crate::v1::LiveResponse) -> Result<(), Malformed> {
    const W: &str = "LiveResponse";
    if r.id == 0 {
        return Err(malformed(W, "id is 0"));
    }
    if r.body.len() > MAX_LIVE_CHUNK_BYTES {
        return Err(malformed(
            W,
            format!("body is over {MAX_LIVE_CHUNK_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// A hub's LiveRequest: an id. Its path is a reader's, not the hub's: it is
/// checked ([`crate::limits::check_live_path`]) and refused for that read
/// alone, never by ending the stream.
fn live_request(r: &crate::v1::LiveRequest) -> Result<(), Malformed> {
    if r.id == 0 {
        return Err(malformed("LiveRequest", "id is 0"));
    }
    Ok(())
}

/// An agent's ResourceTreeReport: a key, the hub uid it is for, and each
/// JSON payload within the limit of one object.
fn tree(t: &crate::v1::ResourceTreeReport) -> Result<(), Malformed> {
    const W: &str = "ResourceTreeReport";
    key(W, t.key.as_ref())?;
    if t.hub_uid.is_empty() {
        return Err(malformed(W, "hub_uid is empty"));
    }
    uid(W, "hub_uid", &t.hub_uid)?;
    for (field, json) in [
        ("tree_json", &t.tree_json),
        ("managed_resources_json", &t.managed_resources_json),
    ] {
        if json.len() > MAX_OBJECT_JSON_BYTES {
            return Err(malformed(
                W,
                format!("{field} is over {MAX_OBJECT_JSON_BYTES} bytes"),
            ));
        }
    }
    Ok(())
}

/// An ObjectAck, either way: a key, a seq, and a known outcome that is
/// not DUPLICATE.
fn object_ack(a: &crate::v1::ObjectAck) -> Result<(), Malformed> {
    const W: &str = "ObjectAck";
    key(W, a.key.as_ref())?;
    seq(W, a.seq)?;
    not_duplicate(W, a.outcome)
}

/// An agent's OperationAck: an id, a key, a bounded start time and a known
/// outcome.
fn operation_ack(a: &crate::v1::OperationAck) -> Result<(), Malformed> {
    const W: &str = "OperationAck";
    operation_id(W, &a.operation_id)?;
    key(W, a.key.as_ref())?;
    if a.settled_started_at.len() > MAX_TIMESTAMP_LEN {
        return Err(malformed(
            W,
            format!("settled_started_at is longer than {MAX_TIMESTAMP_LEN} characters"),
        ));
    }
    outcome(W, a.outcome).map(drop)
}

/// An agent's ProjectSetAck: a version and a message of bounded length, and
/// a known outcome that is not DUPLICATE.
fn project_set_ack(a: &crate::v1::ProjectSetAck) -> Result<(), Malformed> {
    const W: &str = "ProjectSetAck";
    if a.version.len() > MAX_VERSION_LEN {
        return Err(malformed(
            W,
            format!("version over {MAX_VERSION_LEN} characters"),
        ));
    }
    if a.message.len() > MAX_ACK_MESSAGE_LEN {
        return Err(malformed(
            W,
            format!("message over {MAX_ACK_MESSAGE_LEN} bytes"),
        ));
    }
    not_duplicate(W, a.outcome)
}

/// A Digest, either way, as [`SetDigest::from_proto`] reads it.
fn digest(d: &crate::v1::Digest) -> Result<(), Malformed> {
    SetDigest::from_proto(d)
        .map(drop)
        .map_err(|e| Malformed(e.to_string().trim_start_matches("malformed ").into()))
}

/// The longest message of a ProjectSetAck accepted from an agent.
pub const MAX_ACK_MESSAGE_LEN: usize = 4096;

/// At most this many objects in one ProjectSet.
pub const MAX_PROJECT_SET_OBJECTS: usize = 4096;

/// The longest digest entry version accepted from an agent (the hub's
/// are `<uid>.<sha256 hex>`, about 100 characters).
pub const MAX_VERSION_LEN: usize = 256;

/// An agent's ResyncRequest: of the desired set (the only one it asks the
/// hub for), each bucket listed once and existing, each entry a valid key
/// with a version of bounded length (empty: one the agent does not know). Its entries are then checked against
/// its buckets where it is answered (`digest::repairs_for`), and what its
/// answer may queue on the hub is bounded there.
fn resync_request(r: &crate::v1::ResyncRequest) -> Result<(), Malformed> {
    const W: &str = "ResyncRequest";
    use crate::digest::BUCKETS;
    use crate::v1::DigestSet;
    if DigestSet::try_from(r.set) != Ok(DigestSet::Desired) {
        return Err(malformed(
            W,
            format!(
                "set {} is not DESIRED: an agent asks only for the desired set",
                r.set
            ),
        ));
    }
    let mut seen = [false; BUCKETS as usize];
    for &b in &r.buckets {
        let Some(slot) = seen.get_mut(b as usize) else {
            return Err(malformed(
                W,
                format!("bucket {b} does not exist, protocol 1 has {BUCKETS}"),
            ));
        };
        if std::mem::replace(slot, true) {
            return Err(malformed(W, format!("bucket {b} is listed twice")));
        }
    }
    for e in &r.entries {
        key(W, e.key.as_ref())?;
        // An empty version is legitimate: the agent holds a copy whose
        // version it does not know (one applied before versions were kept,
        // or adopted), and asks the hub to repair it.
        if e.version.len() > MAX_VERSION_LEN {
            return Err(malformed(
                W,
                format!("an entry's version is longer than {MAX_VERSION_LEN} characters"),
            ));
        }
    }
    Ok(())
}

/// Checks a message received by the agent (after the handshake).
pub fn hub_message(m: &HubMessage) -> Result<(), Malformed> {
    use hub_message::Kind;
    match &m.kind {
        None => Err(Malformed(
            "HubMessage: no body (unknown to this protocol version)".into(),
        )),
        Some(Kind::Welcome(_)) => Err(Malformed("HubMessage: Welcome after the handshake".into())),
        Some(Kind::Upsert(u)) => application_upsert(u),
        Some(Kind::Delete(d)) => application_delete(d),
        Some(Kind::Operation(o)) => operation(o),
        Some(Kind::ObjectAck(a)) => object_ack(a),
        Some(Kind::Digest(d)) => digest(d),
        Some(Kind::ResyncRequest(_)) | Some(Kind::Heartbeat(_)) => Ok(()),
        Some(Kind::ProjectSet(p)) => project_set(p),
        Some(Kind::LiveRequest(r)) => live_request(r),
        Some(Kind::LiveCancel(_)) | Some(Kind::LiveCredit(_)) => Ok(()),
        Some(Kind::TerminalOpen(o)) => terminal::open(o),
        Some(Kind::TerminalData(d)) => terminal::data(d, terminal::FROM_HUB),
        Some(Kind::TerminalCredit(c)) => terminal::credit(c),
        Some(Kind::TerminalClose(c)) => terminal::close(c),
    }
}

/// A hub's ApplicationUpsert: a key, a seq, a content version, and a body
/// (whose JSON is checked where it is applied).
fn application_upsert(u: &crate::v1::ApplicationUpsert) -> Result<(), Malformed> {
    const W: &str = "ApplicationUpsert";
    key(W, u.key.as_ref())?;
    seq(W, u.seq)?;
    let Some(meta) = &u.meta else {
        return Err(malformed(W, "meta is missing"));
    };
    if meta.version.is_empty() {
        return Err(malformed(W, "meta.version is empty"));
    }
    if u.application_json.is_empty() {
        return Err(malformed(W, "application_json is empty"));
    }
    Ok(())
}

/// A hub's ApplicationDelete: a key, a seq, and the uid of the hub
/// Application whose copy is to go.
fn application_delete(d: &crate::v1::ApplicationDelete) -> Result<(), Malformed> {
    const W: &str = "ApplicationDelete";
    key(W, d.key.as_ref())?;
    seq(W, d.seq)?;
    if d.hub_uid.is_empty() {
        return Err(malformed(W, "hub_uid is empty"));
    }
    uid(W, "hub_uid", &d.hub_uid)
}

/// A hub's OperationRequest: an id, a key, and a sync with an operation, a
/// refresh of a known kind, or a terminate.
fn operation(o: &crate::v1::OperationRequest) -> Result<(), Malformed> {
    const W: &str = "OperationRequest";
    operation_id(W, &o.operation_id)?;
    key(W, o.key.as_ref())?;
    uid(W, "hub_uid", &o.hub_uid)?;
    match &o.kind {
        None => Err(malformed(W, "no kind (sync, refresh or terminate)")),
        Some(operation_request::Kind::Sync(s)) if s.operation_json.is_empty() => {
            Err(malformed(W, "sync.operation_json is empty"))
        }
        Some(operation_request::Kind::Refresh(r)) => match RefreshKind::try_from(r.kind) {
            Ok(RefreshKind::Normal | RefreshKind::Hard) => Ok(()),
            _ => Err(malformed(
                W,
                format!("refresh.kind {} is not normal or hard", r.kind),
            )),
        },
        Some(_) => Ok(()),
    }
}

/// A hub's ProjectSet: a version of bounded length and a bounded number of
/// objects (each checked where it is applied).
fn project_set(p: &crate::v1::ProjectSet) -> Result<(), Malformed> {
    const W: &str = "ProjectSet";
    if p.version.is_empty() || p.version.len() > MAX_VERSION_LEN {
        return Err(malformed(
            W,
            format!("version empty or over {MAX_VERSION_LEN} characters"),
        ));
    }
    if p.objects_json.len() > MAX_PROJECT_SET_OBJECTS {
        return Err(malformed(
            W,
            format!("over {MAX_PROJECT_SET_OBJECTS} objects"),
        ));
    }
    Ok(())
}

/// Whether `s` is a namespace name the API server accepts: an RFC 1123
/// label (lower-case letters, digits and `-`, starting and ending with a
/// letter or digit, at most 63 characters). The wire contract keeps its
/// own check, free of the Kubernetes crates; code on the Kubernetes side
/// uses `argocd_pull_apis::names::dns_label`, which also says what is
/// wrong.
pub fn is_namespace(s: &str) -> bool {
    s.len() <= MAX_NAMESPACE_LEN && is_label(s)
}

/// Whether `s` is an Application name the API server accepts: an RFC 1123
/// subdomain (labels of lower-case letters, digits and `-` joined by `.`,
/// at most 253 characters).
pub fn is_name(s: &str) -> bool {
    s.len() <= MAX_NAME_LEN && s.split('.').all(is_label)
}

fn is_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let b = s.as_bytes();
    !b.is_empty()
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

fn key(what: &str, key: Option<&ObjectKey>) -> Result<(), Malformed> {
    let Some(key) = key else {
        return Err(malformed(what, "key is missing"));
    };
    // A key names an Application on the managed cluster: anything the API
    // server would refuse (and a path segment like `..`) never gets further.
    if !is_namespace(&key.namespace) {
        return Err(malformed(
            what,
            format!(
                "key.namespace {:?} is not a namespace name (RFC 1123 label, at most {MAX_NAMESPACE_LEN} characters)",
                key.namespace
            ),
        ));
    }
    if !is_name(&key.name) {
        return Err(malformed(
            what,
            format!(
                "key.name {:?} is not an object name (RFC 1123 subdomain, at most {MAX_NAME_LEN} characters)",
                key.name
            ),
        ));
    }
    Ok(())
}

/// The longest timestamp accepted (RFC 3339 with nanoseconds and an offset
/// is 35 characters).
pub const MAX_TIMESTAMP_LEN: usize = 64;

/// The longest uid accepted (Kubernetes uids are 36-character UUIDs).
pub const MAX_UID_LEN: usize = 128;

fn uid(what: &str, field: &str, uid: &str) -> Result<(), Malformed> {
    if uid.len() > MAX_UID_LEN {
        return Err(malformed(
            what,
            format!("{field} is longer than {MAX_UID_LEN} characters"),
        ));
    }
    Ok(())
}

fn seq(what: &str, seq: u64) -> Result<(), Malformed> {
    if seq == 0 {
        return Err(malformed(what, "seq is 0 (sequence numbers start at 1)"));
    }
    Ok(())
}

fn operation_id(what: &str, id: &str) -> Result<(), Malformed> {
    if id.is_empty() || id.len() > MAX_OPERATION_ID_LEN {
        return Err(malformed(
            what,
            format!("operation_id {id:?} is empty or longer than {MAX_OPERATION_ID_LEN}"),
        ));
    }
    Ok(())
}

fn outcome(what: &str, raw: i32) -> Result<AckOutcome, Malformed> {
    match AckOutcome::try_from(raw) {
        Ok(AckOutcome::Unspecified) | Err(_) => Err(malformed(
            what,
            format!("outcome {raw} is not a known outcome"),
        )),
        Ok(o) => Ok(o),
    }
}

/// The outcome of an acknowledgement of anything but an operation.
fn not_duplicate(what: &str, raw: i32) -> Result<(), Malformed> {
    match outcome(what, raw)? {
        AckOutcome::Duplicate => Err(malformed(what, "DUPLICATE is for operations only")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        digest::Entries,
        v1::{
            ApplicationDelete, ApplicationUpsert, DigestSet, Gone, Heartbeat, Hello, ObjectAck,
            ObjectMeta, OperationAck, OperationRequest, ProjectSetAck, RefreshRequest,
            StatusReport, SyncOperation, TerminateOperation,
        },
    };

    fn k() -> Option<ObjectKey> {
        Some(ObjectKey {
            namespace: "argocd".into(),
            name: "guestbook".into(),
        })
    }

    fn meta() -> Option<ObjectMeta> {
        Some(ObjectMeta {
            uid: "u".into(),
            resource_version: "1".into(),
            generation: 1,
            version: "v".into(),
        })
    }

    fn agent(kind: agent_message::Kind) -> AgentMessage {
        AgentMessage { kind: Some(kind) }
    }

    fn hub(kind: hub_message::Kind) -> HubMessage {
        HubMessage { kind: Some(kind) }
    }

    fn upsert() -> ApplicationUpsert {
        ApplicationUpsert {
            key: k(),
            seq: 1,
            meta: meta(),
            application_json: b"{}".to_vec(),
            trace_parent: String::new(),
        }
    }

    fn op(kind: operation_request::Kind) -> OperationRequest {
        OperationRequest {
            operation_id: "op-1".into(),
            key: k(),
            kind: Some(kind),
            hub_uid: "hub-a".into(),
        }
    }

    #[test]
    fn agent_messages() {
        use agent_message::Kind;
        let gone = StatusReport {
            key: k(),
            seq: 1,
            state: Some(status_report::State::Gone(Gone::default())),
            trace_parent: String::new(),
        };
        let ack = ObjectAck {
            key: k(),
            seq: 1,
            outcome: AckOutcome::Applied as i32,
            message: String::new(),
        };
        let op_ack = OperationAck {
            operation_id: "op-1".into(),
            key: k(),
            outcome: AckOutcome::Duplicate as i32,
            message: String::new(),
            settled: true,
            settled_started_at: "2026-11-24T01:00:00Z".into(),
        };
        let digest = crate::digest::SetDigest::of(&Entries::new()).to_proto(DigestSet::Observed);
        // The valid messages above, with one change.
        let status = |change: fn(&mut StatusReport)| {
            let mut s = gone.clone();
            change(&mut s);
            agent(Kind::Status(s))
        };
        let object_ack = |change: fn(&mut ObjectAck)| {
            let mut a = ack.clone();
            change(&mut a);
            agent(Kind::ObjectAck(a))
        };
        let operation_ack = |change: fn(&mut OperationAck)| {
            let mut a = op_ack.clone();
            change(&mut a);
            agent(Kind::OperationAck(a))
        };
        let project_set_ack = |change: fn(&mut ProjectSetAck)| {
            let mut a = ProjectSetAck {
                version: "v1".into(),
                outcome: AckOutcome::Rejected as i32,
                message: "object 0: not JSON".into(),
            };
            change(&mut a);
            agent(Kind::ProjectSetAck(a))
        };
        let tree = |change: fn(&mut crate::v1::ResourceTreeReport)| {
            let mut t = crate::v1::ResourceTreeReport {
                key: k(),
                hub_uid: "hub-uid-1".into(),
                tree_json: br#"{"nodes":[]}"#.to_vec(),
                managed_resources_json: Vec::new(),
            };
            change(&mut t);
            agent(Kind::Tree(t))
        };
        let cases: Vec<(AgentMessage, Result<(), &str>)> = vec![
            (tree(|_| {}), Ok(())),
            (
                tree(|t| t.hub_uid.clear()),
                Err("malformed ResourceTreeReport: hub_uid is empty"),
            ),
            (
                tree(|t| t.key = None),
                Err("malformed ResourceTreeReport: key is missing"),
            ),
            (
                tree(|t| t.managed_resources_json = vec![b' '; MAX_OBJECT_JSON_BYTES + 1]),
                Err("malformed ResourceTreeReport: managed_resources_json is over 1572864 bytes"),
            ),
            (agent(Kind::Status(gone.clone())), Ok(())),
            (agent(Kind::ObjectAck(ack.clone())), Ok(())),
            (agent(Kind::OperationAck(op_ack.clone())), Ok(())),
            (agent(Kind::Digest(digest.clone())), Ok(())),
            (agent(Kind::Heartbeat(Heartbeat::default())), Ok(())),
            (project_set_ack(|_| {}), Ok(())),
            (
                AgentMessage { kind: None },
                Err("malformed AgentMessage: no body (unknown to this protocol version)"),
            ),
            (
                agent(Kind::Hello(Hello::default())),
                Err("malformed AgentMessage: Hello after the handshake"),
            ),
            (
                status(|s| s.key = None),
                Err("malformed StatusReport: key is missing"),
            ),
            (
                status(|s| s.key.as_mut().unwrap().namespace.clear()),
                Err(
                    "malformed StatusReport: key.namespace \"\" is not a namespace name (RFC 1123 label, at most 63 characters)",
                ),
            ),
            (
                status(|s| s.seq = 0),
                Err("malformed StatusReport: seq is 0 (sequence numbers start at 1)"),
            ),
            (
                status(|s| s.state = None),
                Err("malformed StatusReport: no state (observed or gone)"),
            ),
            (
                status(|s| s.state = Some(status_report::State::Observed(Default::default()))),
                Err("malformed StatusReport: observed.meta is missing"),
            ),
            (
                object_ack(|a| a.outcome = 0),
                Err("malformed ObjectAck: outcome 0 is not a known outcome"),
            ),
            (
                object_ack(|a| a.outcome = AckOutcome::Duplicate as i32),
                Err("malformed ObjectAck: DUPLICATE is for operations only"),
            ),
            (
                operation_ack(|a| a.operation_id.clear()),
                Err("malformed OperationAck: operation_id \"\" is empty or longer than 253"),
            ),
            (
                operation_ack(|a| a.settled_started_at = "9".repeat(65)),
                Err("malformed OperationAck: settled_started_at is longer than 64 characters"),
            ),
            (
                project_set_ack(|a| a.outcome = AckOutcome::Duplicate as i32),
                Err("malformed ProjectSetAck: DUPLICATE is for operations only"),
            ),
            (
                project_set_ack(|a| a.version = "v".repeat(257)),
                Err("malformed ProjectSetAck: version over 256 characters"),
            ),
            (
                project_set_ack(|a| a.message = "m".repeat(4097)),
                Err("malformed ProjectSetAck: message over 4096 bytes"),
            ),
            (
                agent(Kind::Digest(crate::v1::Digest {
                    total: vec![],
                    ..digest
                })),
                Err("malformed Digest: total is 0 bytes, not 32"),
            ),
        ];
        for (m, want) in cases {
            let got = agent_message(&m).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string), "{m:?}");
            if let Err(e) = agent_message(&m) {
                assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
            }
        }
    }

    #[test]
    fn an_agents_resync_request_is_bounded() {
        use crate::v1::{DigestEntry, ResyncRequest};
        let entry = |version: &str| DigestEntry {
            key: k(),
            version: version.into(),
        };
        let request = |set: DigestSet, buckets: Vec<u32>, entries: Vec<DigestEntry>| {
            agent(agent_message::Kind::ResyncRequest(ResyncRequest {
                set: set as i32,
                buckets,
                entries,
            }))
        };
        let cases = [
            (
                request(DigestSet::Desired, vec![0, 63], vec![entry("u.h")]),
                Ok(()),
            ),
            (
                request(DigestSet::Desired, (0..64).collect(), vec![]),
                Ok(()),
            ),
            (
                request(DigestSet::Observed, vec![0], vec![]),
                Err(
                    "malformed ResyncRequest: set 2 is not DESIRED: an agent asks only for the desired set",
                ),
            ),
            (
                request(DigestSet::Desired, vec![64], vec![]),
                Err("malformed ResyncRequest: bucket 64 does not exist, protocol 1 has 64"),
            ),
            (
                request(DigestSet::Desired, vec![3, 3], vec![]),
                Err("malformed ResyncRequest: bucket 3 is listed twice"),
            ),
            (
                request(DigestSet::Desired, vec![0], vec![entry("")]),
                Ok(()),
            ),
            (
                request(DigestSet::Desired, vec![0], vec![entry(&"v".repeat(257))]),
                Err("malformed ResyncRequest: an entry's version is longer than 256 characters"),
            ),
            (
                request(
                    DigestSet::Desired,
                    vec![0],
                    vec![DigestEntry {
                        key: None,
                        version: "v".into(),
                    }],
                ),
                Err("malformed ResyncRequest: key is missing"),
            ),
        ];
        for (m, want) in cases {
            let got = agent_message(&m).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string), "{m:?}");
        }
    }

    #[test]
    fn hub_messages() {
        use hub_message::Kind;
        use operation_request::Kind as Op;
        let cases: Vec<(HubMessage, Result<(), &str>)> = vec![
            (hub(Kind::Upsert(upsert())), Ok(())),
            (
                hub(Kind::Delete(ApplicationDelete {
                    key: k(),
                    seq: 2,
                    hub_uid: "u".into(),
                    release: false,
                })),
                Ok(()),
            ),
            (
                hub(Kind::Operation(op(Op::Sync(SyncOperation {
                    operation_json: b"{\"sync\":{}}".to_vec(),
                })))),
                Ok(()),
            ),
            (
                hub(Kind::Operation(op(Op::Refresh(RefreshRequest {
                    kind: RefreshKind::Hard as i32,
                })))),
                Ok(()),
            ),
            (
                hub(Kind::Operation(op(Op::Terminate(TerminateOperation {})))),
                Ok(()),
            ),
            (
                HubMessage { kind: None },
                Err("malformed HubMessage: no body (unknown to this protocol version)"),
            ),
            (
                hub(Kind::Upsert(ApplicationUpsert {
                    application_json: vec![],
                    ..upsert()
                })),
                Err("malformed ApplicationUpsert: application_json is empty"),
            ),
            (
                hub(Kind::Upsert(ApplicationUpsert {
                    meta: None,
                    ..upsert()
                })),
                Err("malformed ApplicationUpsert: meta is missing"),
            ),
            (
                hub(Kind::Upsert(ApplicationUpsert {
                    key: Some(ObjectKey {
                        namespace: "argocd".into(),
                        name: "x".repeat(254),
                    }),
                    ..upsert()
                })),
                Err("is not an object name"),
            ),
            (
                hub(Kind::Delete(ApplicationDelete {
                    key: k(),
                    seq: 2,
                    hub_uid: String::new(),
                    release: false,
                })),
                Err("malformed ApplicationDelete: hub_uid is empty"),
            ),
            (
                hub(Kind::Operation(OperationRequest {
                    kind: None,
                    ..op(Op::Terminate(TerminateOperation {}))
                })),
                Err("malformed OperationRequest: no kind (sync, refresh or terminate)"),
            ),
            (
                hub(Kind::Operation(op(Op::Sync(SyncOperation::default())))),
                Err("malformed OperationRequest: sync.operation_json is empty"),
            ),
            (
                hub(Kind::Operation(op(Op::Refresh(RefreshRequest { kind: 0 })))),
                Err("malformed OperationRequest: refresh.kind 0 is not normal or hard"),
            ),
        ];
        for (m, want) in cases {
            let got = hub_message(&m).map_err(|e| e.to_string());
            match want {
                Ok(()) => assert_eq!(got, Ok(()), "{m:?}"),
                Err(want) => {
                    let got = got.unwrap_err();
                    assert!(got.contains(want), "{got} does not contain {want}");
                }
            }
        }
    }

    #[test]
    fn a_readers_path_never_ends_the_stream() {
        let request = |id: u64, path: String| HubMessage {
            kind: Some(hub_message::Kind::LiveRequest(crate::v1::LiveRequest {
                id,
                path,
                window: 32,
            })),
        };
        let long = format!(
            "/api/v1/namespaces/gb/pods/p/log?container={}",
            "c".repeat(6000)
        );
        assert_eq!(hub_message(&request(7, long)), Ok(()));
        assert_eq!(hub_message(&request(7, "no slash".into())), Ok(()));
        assert!(
            hub_message(&request(0, "/api".into())).is_err(),
            "the hub's own id"
        );
    }

    #[test]
    fn first_message_must_be_hello() {
        let hello = agent(agent_message::Kind::Hello(Hello::default()));
        assert!(first_agent_message(&hello).is_ok());
        let other = agent(agent_message::Kind::Heartbeat(Heartbeat::default()));
        assert_eq!(
            first_agent_message(&other).unwrap_err().to_string(),
            "malformed stream: the first message must be a Hello"
        );
    }
}
