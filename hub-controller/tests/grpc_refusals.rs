//! Bad input and abuse of the gRPC transport, on real API servers: wrong
//! and expired certificates, an identity that maps to no cluster, an
//! unknown protocol version, malformed and oversized messages, and an agent
//! reporting another cluster's Application. Each is refused with a status
//! that says what is wrong and logged with the cluster name, and the
//! well-behaved agent next to them never notices.

use std::collections::BTreeMap;

use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, Heartbeat, ObjectAck, ObjectKey, agent_message, hub_message,
};

use serde_json::json;
use testenv::pki::{Ca, CertKey};
use testenv::wait;
use tonic::{Code, Status};

mod common;
mod grpc_env;
use common::grpc_client::{self, Opened, hello, next, refused, refused_with, report};
use common::set_source;
use grpc_env::{Env, SPOKE_NS, TIMEOUT, agent_subject};

/// A raw stream to the hub of `env` with `identity`, opened with `first`.
async fn open(env: &Env, identity: &CertKey, first: AgentMessage) -> Result<Opened, Status> {
    grpc_client::open(&env.hub_address(), &env.ca.pem.cert_pem, identity, first).await
}

#[tokio::test]
async fn bad_input_is_refused_and_logged_without_affecting_other_agents() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    env.start_hub(&[]).await;
    env.connect_agent(0).await;
    env.create("alpha", 0, json!({})).await;
    let expected: BTreeMap<String, usize> = [("alpha".to_string(), 0)].into();
    wait::until("alpha delivered", TIMEOUT, || env.converged(&expected)).await;
    let cluster2 = env.ca.client(&agent_subject("cluster2"), None).unwrap();

    // A certificate from another CA, and an expired one, never get a stream.
    let rogue = Ca::new("rogue")
        .unwrap()
        .client(&agent_subject("cluster1"), None)
        .unwrap();
    // Refused in the TLS handshake: the client sees the connection fail
    // (how exactly depends on when the alert arrives).
    refused(open(&env, &rogue, hello(1, 1)).await);
    let expired = env
        .ca
        .client_valid(&agent_subject("cluster1"), (2020, 1, 1), (2021, 1, 1))
        .unwrap();
    refused(open(&env, &expired, hello(1, 1)).await);

    // A trusted certificate whose subject names no cluster.
    let stranger = env.ca.client("someone", None).unwrap();
    refused_with(
        open(&env, &stranger, hello(1, 1)).await,
        Code::PermissionDenied,
        "\"someone\" matches no identity pattern",
    );

    // An agent from the future.
    let status = refused(open(&env, &cluster2, hello(7, 9)).await);
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        status.message(),
        "agent speaks protocol 7..=9, hub supports 1: upgrade the hub"
    );

    // A first message that is not a Hello.
    let heartbeat = AgentMessage {
        kind: Some(agent_message::Kind::Heartbeat(Heartbeat::default())),
    };
    refused_with(
        open(&env, &cluster2, heartbeat).await,
        Code::InvalidArgument,
        "the first message must be a Hello",
    );

    // After a good handshake: a report of another cluster's Application is
    // refused, that one report only; the hub copy is untouched.
    let (tx, mut inbound, welcome) = open(&env, &cluster2, hello(1, 1)).await.unwrap();
    assert!(matches!(welcome.kind, Some(hub_message::Kind::Welcome(_))));
    let alpha = ObjectKey {
        namespace: SPOKE_NS.into(),
        name: "alpha".into(),
    };
    let forged = serde_json::to_vec(&json!({ "health": { "status": "Missing" } })).unwrap();
    tx.send(report(alpha.clone(), 1, forged)).await.unwrap();
    match next(&mut inbound).await.unwrap().kind {
        Some(hub_message::Kind::ObjectAck(ack)) => {
            assert_eq!(ack.outcome, AckOutcome::Rejected as i32);
            assert!(
                ack.message
                    .contains("not an Application the hub delivers to cluster cluster2"),
                "{ack:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A report that is not JSON is refused the same way (one of an
    // Application the hub does deliver to cluster2: others are refused
    // unread, above).
    env.create("beta", 1, json!({})).await;
    let beta = ObjectKey {
        namespace: SPOKE_NS.into(),
        name: "beta".into(),
    };
    take(&tx, &mut inbound, &beta, false).await;
    tx.send(report(beta.clone(), 2, b"{nope".to_vec()))
        .await
        .unwrap();
    match next(&mut inbound).await.unwrap().kind {
        Some(hub_message::Kind::ObjectAck(ack)) => {
            assert_eq!(ack.outcome, AckOutcome::Rejected as i32);
            assert!(ack.message.contains("is not JSON"), "{ack:?}");
        }
        other => panic!("{other:?}"),
    }
    // beta goes again (the rest is about alpha): its delete taken.
    env.hub_apps()
        .delete("beta", &Default::default())
        .await
        .unwrap();
    take(&tx, &mut inbound, &beta, true).await;
    // A message breaking the contract ends the stream, naming the field.
    tx.send(report(alpha.clone(), 0, b"{}".to_vec()))
        .await
        .unwrap();
    let status = refused(next(&mut inbound).await);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("seq is 0"), "{status:?}");

    // A message over the 4 MiB limit ends the stream too.
    let (tx, mut inbound, _) = open(&env, &cluster2, hello(1, 1)).await.unwrap();
    let huge = format!("{{\"x\":\"{}\"}}", "y".repeat(5 << 20)).into_bytes();
    tx.send(report(alpha.clone(), 1, huge)).await.unwrap();
    let status = refused(next(&mut inbound).await);
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // The hub copy never saw any of it; the real agent kept its stream and
    // still delivers.
    set_source(&env.hub_apps(), "alpha", "targetRevision", "after-abuse").await;
    wait::until("alpha updated after the abuse", TIMEOUT, || {
        env.converged(&expected)
    })
    .await;
    let hub_alpha = env.hub_apps().get("alpha").await.unwrap();
    assert_eq!(hub_alpha.data["status"]["health"]["status"], "Healthy");

    let log = env.hub_log();
    let lines = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(lines("agent connected cluster=cluster1"), 1, "{log}");
    assert!(
        lines("refused an agent's client certificate cluster=cluster1") >= 2,
        "{log}"
    );
    for reason in ["protocol-version", "malformed", "oversized"] {
        assert!(
            log.lines()
                .any(|l| l.contains("cluster=cluster2")
                    && l.contains(&format!("reason=\"{reason}\""))),
            "no refusal {reason} logged with the cluster: {log}"
        );
    }
    assert!(
        lines("refused a status report cluster=cluster2") >= 2,
        "{log}"
    );
    let metrics = env.hub_process.as_ref().unwrap().metrics().await;
    // Nothing vouches for the name in a refused certificate: no series of
    // its own, whatever it claims.
    assert!(
        !metrics.contains("refused_total{cluster=\"cluster1\""),
        "{metrics}"
    );
    for (cluster, reason) in [
        ("unverified", "certificate-expired"),
        ("unverified", "certificate-invalid"),
        ("unverified", "unknown-identity"),
        ("cluster2", "protocol-version"),
        ("cluster2", "not-this-agents"),
        ("cluster2", "oversized"),
    ] {
        // A client may try its handshake more than once.
        let series = format!(
            "argocd_pull_hub_grpc_refused_total{{cluster=\"{cluster}\",reason=\"{reason}\"}} "
        );
        let count: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series)?.parse().ok())
            .unwrap_or(0.0);
        assert!(count >= 1.0, "{series} missing in {metrics}");
    }
}

/// Waits for the hub's upsert (or delete) of `key` and acknowledges it, as
/// an agent would, so that it is not sent again.
async fn take(
    tx: &tokio::sync::mpsc::Sender<AgentMessage>,
    inbound: &mut tonic::Streaming<argocd_pull_proto::v1::HubMessage>,
    key: &ObjectKey,
    delete: bool,
) {
    loop {
        let m = tokio::time::timeout(TIMEOUT, next(inbound))
            .await
            .expect("the hub to send it")
            .unwrap();
        let (k, seq) = match m.kind {
            Some(hub_message::Kind::Upsert(u)) if !delete => (u.key, u.seq),
            Some(hub_message::Kind::Delete(d)) if delete => (d.key, d.seq),
            _ => continue,
        };
        if k.as_ref() == Some(key) {
            tx.send(AgentMessage {
                kind: Some(agent_message::Kind::ObjectAck(ObjectAck {
                    key: k,
                    seq,
                    outcome: AckOutcome::Applied as i32,
                    message: String::new(),
                })),
            })
            .await
            .unwrap();
            return;
        }
    }
}
