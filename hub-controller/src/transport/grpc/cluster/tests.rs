//! Unit tests of the per-cluster state.
use super::*;
use argocd_pull_proto::v1::{HubMessage, ObjectMeta, OperationRequest, hub_message};
use prometheus_client::metrics::gauge::Gauge;

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn desired(name: &str, version: &str) -> Arc<Desired> {
    Arc::new(Desired {
        hub: HubRef {
            namespace: "team".into(),
            name: name.into(),
        },
        json: crate::compact::CompactJson::new("{}"),
        meta: ObjectMeta {
            uid: format!("uid-{name}"),
            version: version.into(),
            ..Default::default()
        },
        created: 0,
        grant: crate::fixtures::grant(&format!("uid-{name}"), "default"),
    })
}

fn fp(fingerprint: &str) -> Agent {
    Agent {
        fingerprint: fingerprint.into(),
        ..Agent::default()
    }
}

fn kinds(ms: &[HubMessage]) -> Vec<String> {
    ms.iter()
        .map(|m| match m.kind.as_ref().unwrap() {
            hub_message::Kind::Upsert(u) => format!("upsert {}", u.key.as_ref().unwrap().name),
            hub_message::Kind::Delete(d) if d.release => {
                format!("release {}", d.key.as_ref().unwrap().name)
            }
            hub_message::Kind::Delete(d) => format!("delete {}", d.key.as_ref().unwrap().name),
            hub_message::Kind::Operation(o) => format!("op {}", o.operation_id),
            other => format!("{other:?}"),
        })
        .collect()
}

/// The sequence number of `m`, an upsert.
fn upsert_seq(m: &HubMessage) -> u64 {
    let Some(hub_message::Kind::Upsert(u)) = &m.kind else {
        panic!("not an upsert: {m:?}")
    };
    u.seq
}

/// The sequence number of `m`, a delete or release.
fn delete_seq(m: &HubMessage) -> u64 {
    let Some(hub_message::Kind::Delete(d)) = &m.kind else {
        panic!("not a delete: {m:?}")
    };
    d.seq
}

/// A cluster whose managed session 1 has just been sent `a` at v1, and
/// the upsert's sequence number.
fn sent_a() -> (ClusterState, u64) {
    let c = ClusterState::new("c1");
    c.attach(1, AgentMode::Managed);
    c.set_desired(&key("a"), desired("a", "v1"));
    let sent = c.next_messages(1, 10);
    assert_eq!(kinds(&sent), ["upsert a"]);
    let seq = upsert_seq(&sent[0]);
    (c, seq)
}

/// The agent's acknowledgement of `a`'s message `seq`: applied.
fn applied(c: &ClusterState, seq: u64) -> Option<Item> {
    c.object_acked(&key("a"), seq, AckOutcome::Applied, "")
}

#[test]
fn a_new_resource_version_alone_is_not_sent_again() {
    let (c, _) = sent_a();
    let mut newer = (*desired("a", "v1")).clone();
    newer.meta.resource_version = "99".into();
    c.set_desired(&key("a"), Arc::new(newer));
    assert!(c.next_messages(1, 10).is_empty());
}

#[test]
fn only_changes_are_sent_and_the_latest_wins() {
    let c = ClusterState::new("c1");
    c.set_desired(&key("a"), desired("a", "v1"));
    c.set_desired(&key("a"), desired("a", "v1"));
    c.set_desired(&key("a"), desired("a", "v2"));
    assert!(c.next_messages(1, 10).is_empty(), "no session yet");
    c.attach(1, AgentMode::Managed);
    let sent = c.next_messages(1, 10);
    assert_eq!(kinds(&sent), ["upsert a"]);
    let Some(hub_message::Kind::Upsert(u)) = &sent[0].kind else {
        unreachable!()
    };
    assert_eq!(u.meta.as_ref().unwrap().version, "v2");
    // Unchanged: nothing more.
    c.set_desired(&key("a"), desired("a", "v2"));
    assert!(c.next_messages(1, 10).is_empty());
    assert!(applied(&c, u.seq).is_some());
    assert_eq!(c.desired_entries().len(), 1);
}

#[test]
fn a_delete_is_confirmed_by_gone_after_its_acknowledgement() {
    let (c, seq) = sent_a();
    c.set_deleting(&key("a"), "uid-a");
    assert!(
        c.desired_entries().is_empty(),
        "a deleting object is not desired"
    );
    // A gone before the delete is acknowledged confirms nothing.
    assert!(!c.observe(&key("a"), Observation::Gone));
    applied(&c, seq);
    let del = c.next_messages(1, 10);
    assert_eq!(kinds(&del), ["delete a"]);
    applied(&c, delete_seq(&del[0]));
    assert!(c.observe(&key("a"), Observation::Gone));
    assert_eq!(
        c.lock().deletes.gone.get(&key("a")).map(String::as_str),
        Some("uid-a")
    );
}

/// What an agent that finds nothing to delete may answer: `gone` first,
/// then the acknowledgement. The delete is complete (a finalizer can be
/// released) and, once no hub Application names the key, forgotten.
#[test]
fn a_gone_before_the_delete_is_acknowledged_completes_it_with_the_ack() {
    let (c, seq) = sent_a();
    applied(&c, seq);
    c.set_deleting(&key("a"), "uid-a");
    let del = delete_seq(&c.next_messages(1, 10)[0]);
    assert!(!c.observe(&key("a"), Observation::Gone));
    assert!(
        c.lock().deletes.gone.is_empty(),
        "not before the acknowledgement"
    );
    applied(&c, del);
    assert_eq!(
        c.lock().deletes.gone.get(&key("a")).map(String::as_str),
        Some("uid-a")
    );
    c.forget_if_idle(&key("a"));
    let inner = c.lock();
    assert!(
        inner.deletes.gone.is_empty()
            && inner.deletes.delete_acked.is_empty()
            && inner.sending.enqueued.is_empty()
            && inner.observed.is_empty(),
        "nothing is left of a key gone on both sides"
    );
}

/// A `gone` from before the Application was delivered again says
/// nothing about the delete that follows.
#[test]
fn a_gone_before_the_delete_was_sent_does_not_complete_it() {
    let (c, seq) = sent_a();
    assert!(!c.observe(&key("a"), Observation::Gone));
    applied(&c, seq);
    c.set_deleting(&key("a"), "uid-a");
    applied(&c, delete_seq(&c.next_messages(1, 10)[0]));
    assert!(
        c.lock().deletes.gone.is_empty(),
        "the spoke copy may still exist"
    );
    assert!(c.observe(&key("a"), Observation::Gone));
}

#[test]
fn a_new_session_gets_what_the_old_one_left_in_flight() {
    let c = ClusterState::new("c1");
    let mut old = c.attach(1, AgentMode::Managed);
    c.set_desired(&key("a"), desired("a", "v1"));
    assert_eq!(kinds(&c.next_messages(1, 10)), ["upsert a"]);
    c.control(HubMessage::default());
    c.attach(2, AgentMode::Managed);
    assert_eq!(
        *old.borrow_and_update(),
        Some(Stop::Replaced),
        "the old session is told to stop"
    );
    assert!(
        c.next_messages(1, 10).is_empty(),
        "the old session gets nothing"
    );
    assert_eq!(
        kinds(&c.next_messages(2, 10)),
        ["upsert a"],
        "no stale control"
    );
}

#[test]
fn commands_go_once_per_session_until_answered() {
    let c = ClusterState::new("c1");
    c.attach(1, AgentMode::Autonomous);
    c.set_desired(&key("a"), desired("a", "v1"));
    let owner = Work::Mirror {
        cluster: "c1".into(),
        key: key("a"),
    };
    let op = OperationRequest {
        operation_id: "op-1".into(),
        key: Some(key("a")),
        kind: None,
        hub_uid: String::new(),
    };
    assert!(c.add_op(op.clone(), owner.clone()));
    assert!(!c.add_op(op, owner.clone()));
    assert_eq!(
        kinds(&c.next_messages(1, 10)),
        ["op op-1"],
        "autonomous: commands only"
    );
    assert!(c.next_messages(1, 10).is_empty());
    c.attach(2, AgentMode::Autonomous);
    assert_eq!(
        kinds(&c.next_messages(2, 10)),
        ["op op-1"],
        "resent after reconnect"
    );
    assert_eq!(
        c.lock().ops.answered("op-1", AckOutcome::Retry, "", None),
        None
    );
    assert!(!c.has_ready(2), "a retry waits a moment");
    assert_eq!(
        c.lock()
            .ops
            .answered("op-1", AckOutcome::Duplicate, "", None),
        Some(owner.clone())
    );
    assert!(c.next_messages(2, 10).is_empty());
    c.lock().ops.done("op-1");
    assert!(c.lock().ops.is_empty());
}

#[test]
fn a_command_the_agent_cannot_run_is_never_sent_and_each_answer_is_reported_once() {
    let c = ClusterState::new("c1");
    // Nobody connected: the agent that connects is asked.
    assert!(c.agent_offers("terminate-operation"));
    let old = Agent {
        capabilities: vec!["owner-check".into()],
        ..fp("f1")
    };
    c.attach_as(1, AgentMode::Managed, old).unwrap();
    assert!(!c.agent_offers("terminate-operation"));
    assert!(c.agent_offers("owner-check"));
    let owner = Work::App(HubRef {
        namespace: "team".into(),
        name: "a".into(),
    });
    let op = |id: &str| OperationRequest {
        operation_id: id.into(),
        key: Some(key("a")),
        kind: None,
        hub_uid: "uid-a".into(),
    };
    // Refused here, reported by the caller: never sent, never again.
    c.lock()
        .ops
        .add_refused(op("t-1"), owner.clone(), "upgrade the agent");
    assert!(c.next_messages(1, 10).is_empty());
    assert!(!c.lock().ops.report_once("t-1"));
    // Answered by the agent: reported once, kept until done.
    assert!(c.add_op(op("t-2"), owner.clone()));
    assert!(!c.lock().ops.report_once("t-2"), "not answered yet");
    assert_eq!(kinds(&c.next_messages(1, 10)), ["op t-2"]);
    c.lock().ops.answered("t-2", AckOutcome::Applied, "", None);
    assert!(c.lock().ops.report_once("t-2"));
    assert!(!c.lock().ops.report_once("t-2"));
    assert!(c.next_messages(1, 10).is_empty());
}

#[test]
fn a_release_is_forgotten_once_acknowledged() {
    let (c, seq) = sent_a();
    applied(&c, seq);
    c.release(&key("a"));
    let m = c.next_messages(1, 10);
    assert_eq!(kinds(&m), ["release a"]);
    applied(&c, delete_seq(&m[0]));
    assert!(!c.knows(&key("a")));
}

#[test]
fn a_rejection_is_kept_until_a_new_value() {
    let (c, seq) = sent_a();
    c.object_acked(&key("a"), seq, AckOutcome::Rejected, "too big");
    assert_eq!(c.lock().rejected[&key("a")], "too big");
    assert!(c.next_messages(1, 10).is_empty(), "not retried");
    c.set_desired(&key("a"), desired("a", "v2"));
    assert!(c.lock().rejected.is_empty());
    assert_eq!(kinds(&c.next_messages(1, 10)), ["upsert a"]);
}

fn ack(name: &str) -> HubMessage {
    HubMessage {
        kind: Some(hub_message::Kind::ObjectAck(
            argocd_pull_proto::v1::ObjectAck {
                key: Some(key(name)),
                seq: 1,
                ..Default::default()
            },
        )),
    }
}

#[test]
fn acknowledgements_are_counted_and_sending_them_makes_room() {
    let c = ClusterState::new("c1");
    let gauge = Gauge::default();
    c.set_control_gauge(gauge.clone());
    c.attach(1, AgentMode::Managed);
    for i in 0..5 {
        c.control(ack(&format!("a{i}")));
    }
    assert_eq!((c.control_len(), gauge.get()), (5, 5));
    let room = c.room.notified();
    tokio::pin!(room);
    room.as_mut().enable();
    assert_eq!(c.next_messages(1, 2).len(), 2);
    assert_eq!((c.control_len(), gauge.get()), (3, 3));
    // Woken at once: the receiver may read again.
    futures::executor::block_on(room);
    c.attach(2, AgentMode::Managed);
    assert_eq!((c.control_len(), gauge.get()), (0, 0), "no stale acks");
}

#[test]
fn digests_and_resync_requests_are_built_when_sent_and_never_pile_up() {
    let c = ClusterState::new("c1");
    c.attach(1, AgentMode::Managed);
    c.send_digest();
    c.send_digest();
    for _ in 0..1000 {
        c.request_resyncs(&[3, 7]);
    }
    c.request_resync(3);
    c.set_desired(&key("a"), desired("a", "v1"));
    c.observe(
        &key("b"),
        Observation::Mirrored {
            version: "v9".into(),
        },
    );
    let m = c.next_messages(1, 10);
    let hub_message::Kind::Digest(d) = m[0].kind.as_ref().unwrap() else {
        panic!("{m:?}")
    };
    let want = SetDigest::of(&c.desired_entries()).to_proto(DigestSet::Desired);
    assert_eq!(
        d, &want,
        "the desired set as it was when sent, upsert a included"
    );
    let hub_message::Kind::ResyncRequest(r) = m[1].kind.as_ref().unwrap() else {
        panic!("{m:?}")
    };
    assert_eq!(r.buckets, [3, 7], "one request for every ask");
    assert_eq!(kinds(&m[2..]), ["upsert a"]);
    assert!(!c.has_ready(1));
}

#[test]
fn a_retry_is_scheduled_once_per_message_in_flight() {
    let (c, seq) = sent_a();
    assert!(!c.schedule_retry(&key("a"), seq + 1), "not in flight");
    assert!(!c.schedule_retry(&key("zz"), seq), "unknown key");
    assert!(c.schedule_retry(&key("a"), seq));
    for _ in 0..100 {
        assert!(!c.schedule_retry(&key("a"), seq), "already scheduled");
    }
    c.retry(&key("a"), seq);
    assert_eq!(kinds(&c.next_messages(1, 10)), ["upsert a"]);
}

#[test]
fn a_revoked_cluster_is_stopped_and_refused_until_allowed() {
    let c = ClusterState::new("c1");
    let mut first = c.attach_as(1, AgentMode::Managed, fp("fp-1")).unwrap();
    assert!(c.revoke("its ManagedCluster was deleted"));
    assert_eq!(
        *first.borrow_and_update(),
        Some(Stop::Revoked("its ManagedCluster was deleted".into()))
    );
    assert_eq!(
        c.attach_as(2, AgentMode::Managed, fp("fp-1")).unwrap_err(),
        "its ManagedCluster was deleted"
    );
    assert_eq!(
        c.revoked().as_deref(),
        Some("its ManagedCluster was deleted")
    );
    assert!(c.allow());
    assert!(!c.allow());
    assert!(c.attach_as(3, AgentMode::Managed, fp("fp-1")).is_ok());
}

#[test]
fn only_the_session_of_a_denied_certificate_is_stopped() {
    let c = ClusterState::new("c1");
    let s = c.attach_as(1, AgentMode::Managed, fp("fp-good")).unwrap();
    let deny = |fp: &str| (fp == "fp-bad").then(|| "stolen".to_string());
    assert_eq!(c.stop_if_denied(deny), None);
    assert!(!s.has_changed().unwrap());
    let mut s = c.attach_as(2, AgentMode::Managed, fp("fp-bad")).unwrap();
    assert_eq!(c.stop_if_denied(deny).as_deref(), Some("fp-bad"));
    assert_eq!(*s.borrow_and_update(), Some(Stop::Denied("stolen".into())));
}

#[test]
fn removals_an_agent_asks_for_are_bounded_and_go_with_its_session() {
    use argocd_pull_proto::digest::Repair;
    let c = ClusterState::new("c1");
    c.attach(1, AgentMode::Managed);
    c.set_desired(&key("wanted"), desired("wanted", "v1"));
    // The agent lists far more unknown Applications than the bound.
    let unknown = MAX_REPAIR_REMOVALS + 500;
    let repairs: Vec<Repair> = (0..unknown)
        .map(|i| Repair::Remove(key(&format!("junk-{i}"))))
        .collect();
    let deferred = c.repair(repairs, |k| {
        Some(Item::Delete {
            hub_uid: format!("uid-{}", k.name),
        })
    });
    assert_eq!(deferred, 500);
    assert_eq!(
        c.lag().1,
        MAX_REPAIR_REMOVALS + 1,
        "the bound, and the wanted one"
    );
    // Asked again: the same keys take no more room.
    let again: Vec<Repair> = (0..10)
        .map(|i| Repair::Remove(key(&format!("junk-{i}"))))
        .collect();
    assert_eq!(
        c.repair(again, |_| Some(Item::Delete {
            hub_uid: "u".into()
        })),
        0
    );
    assert_eq!(c.lag().1, MAX_REPAIR_REMOVALS + 1);
    let sent = c.next_messages(1, 10);
    assert_eq!(sent.len(), 10);
    // The session ends: what it asked for goes, what the hub wants stays.
    c.detach(1);
    assert_eq!(c.lag().1, 1);
    assert!(c.knows(&key("wanted")) && !c.knows(&key("junk-0")));
    c.attach(2, AgentMode::Managed);
    assert_eq!(kinds(&c.next_messages(2, 10)), ["upsert wanted"]);
}
