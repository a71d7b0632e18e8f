//! Cutting agents off and holding abusive ones to their limits, on real API
//! servers with real certificates: a certificate
//! put on the deny list is disconnected within seconds and refused until
//! taken off; an expired certificate is refused on a new stream of a
//! connection it opened while valid; a cluster whose ManagedCluster is
//! deleted or whose addon is disabled is cut off until it is back; a flood of handshakes does not keep the real agent out;
//! and a client that sends without reading holds at most
//! `--grpc-control-queue` acknowledgements on the hub, then is disconnected.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{ManagedCluster, ManagedClusterAddOn};
use argocd_pull_hub_controller::transport::grpc::{self, identity::fingerprint};
use argocd_pull_proto::v1::{AgentMessage, Heartbeat, ObjectKey, agent_message, hub_message};
use argocd_pull_spoke_agent::Mode;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::json;
use testenv::pki::Ca;
use testenv::wait;
use tonic::Code;

mod common;
mod grpc_env;
use common::grpc_client::{self, any_next, hello, refused, refused_with, report};
use grpc_env::series::value;
use grpc_env::{Env, SPOKE_NS, TIMEOUT, agent_subject};

/// How fast a deny list entry must cut a connected agent off.
const WITHIN_SECONDS: Duration = Duration::from_secs(10);

/// Waits until cluster1's agent has (or has not) a stream to the hub. (Its
/// readiness says connected until the agent's task first runs.)
async fn connected(env: &Env, yes: bool) {
    wait::until(
        if yes {
            "the agent connected"
        } else {
            "the agent disconnected"
        },
        TIMEOUT,
        || async {
            let agent = env.spokes[0].agent.as_ref().unwrap();
            match agent.metrics.connected.get() == 1 {
                c if c == yes => Ok(()),
                c => Err(c),
            }
        },
    )
    .await;
}

fn is_connected(env: &Env) -> bool {
    env.spokes[0]
        .agent
        .as_ref()
        .unwrap()
        .metrics
        .connected
        .get()
        == 1
}

async fn metric(env: &Env, series: &str) -> f64 {
    value(&env.hub_process.as_ref().unwrap().metrics().await, series)
}

fn refusals(cluster: &str, reason: &str) -> String {
    format!("argocd_pull_hub_grpc_refused_total{{cluster=\"{cluster}\",reason=\"{reason}\"}}")
}

fn fingerprint_of(pem: &str) -> String {
    fingerprint(&CertificateDer::from_pem_slice(pem.as_bytes()).unwrap())
}

async fn set_deny_list(env: &Env, ns: &str, entries: &[(&str, &str)]) {
    let api: Api<ConfigMap> = Api::namespaced(env.hub_client.clone(), ns);
    let data: BTreeMap<String, String> = entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": grpc::revoke::DENY_LIST, "namespace": ns },
        "data": data,
    }))
    .unwrap();
    match api.get_opt(grpc::revoke::DENY_LIST).await.unwrap() {
        None => {
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
        Some(old) => {
            let mut cm = cm;
            cm.metadata.resource_version = old.metadata.resource_version;
            api.replace(grpc::revoke::DENY_LIST, &PostParams::default(), &cm)
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn a_denied_or_expired_certificate_is_refused_on_every_stream() {
    let mut env = Env::new(&["cluster1"]).await;
    let ns = env.hub.namespace("argocd-pull").await.unwrap();
    env.start_hub(&["--grpc-denied-certificates-namespace", &ns])
        .await;
    env.start_agent(0, Mode::Managed);
    connected(&env, true).await;
    let pem = std::fs::read_to_string(&env.spokes[0].certs.cert).unwrap();
    let fp = fingerprint_of(&pem);
    wait::until("the hub's log to name the certificate", TIMEOUT, || async {
        let log = env.hub_log();
        let named = log.lines().any(|l| {
            l.contains("agent connected cluster=cluster1")
                && l.contains(&format!("certificate={fp}"))
        });
        if named { Ok(()) } else { Err(log) }
    })
    .await;

    // Denied: the connected agent is cut off within seconds...
    set_deny_list(
        &env,
        &ns,
        &[(&fp.to_uppercase(), "laptop stolen, ticket 42")],
    )
    .await;
    wait::until("the denied agent cut off", WITHIN_SECONDS, || async {
        let cut = env.hub_log().lines().any(|l| {
            l.contains("refused an agent's stream cluster=cluster1")
                && l.contains("reason=\"certificate-denied\"")
        });
        if cut && !is_connected(&env) {
            Ok(())
        } else {
            Err(format!("cut {cut}, connected {}", is_connected(&env)))
        }
    })
    .await;
    // ... and refused when it dials again, saying why.
    wait::until("a reconnection refused", TIMEOUT, || async {
        match metric(&env, &refusals("cluster1", "certificate-denied")).await {
            n if n >= 2.0 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    let identity = testenv::pki::CertKey {
        cert_pem: pem.clone(),
        key_pem: std::fs::read_to_string(&env.spokes[0].certs.key).unwrap(),
    };
    let ca = env.ca.pem.cert_pem.clone();
    refused_with(
        grpc_client::open(&env.hub_address(), &ca, &identity, hello(1, 1)).await,
        Code::PermissionDenied,
        &format!(
            "the client certificate (SHA-256 {fp}) is on the hub's deny list (ConfigMap {ns}/argocd-pull-denied-certificates): laptop stolen, ticket 42"
        ),
    );
    assert_eq!(
        metric(&env, "argocd_pull_hub_grpc_denied_certificates").await,
        1.0
    );
    assert!(!is_connected(&env));

    // Taken off the list: the agent is back on its own.
    set_deny_list(&env, &ns, &[]).await;
    connected(&env, true).await;

    // A certificate valid for a few seconds more opens a connection and a
    // stream; the hub ends the stream when it expires...
    // A cluster of this hub (the hub refuses certificates of others).
    common::managed_cluster(&env.hub, "cluster7").await;
    grpc_env::enable_addon(&env.hub_client, "cluster7").await;
    let subject = agent_subject("cluster7");
    let short = env
        .ca
        .client_expiring(&subject, Duration::from_secs(6))
        .unwrap();
    let channel = grpc_client::channel(&env.hub_address(), &ca, &short, None)
        .await
        .unwrap();
    let (tx, mut inbound, welcome) = grpc_client::open_on(channel.clone(), hello(1, 1))
        .await
        .unwrap();
    assert!(matches!(welcome.kind, Some(hub_message::Kind::Welcome(_))));
    // Not silent: it is the expiry that ends the stream.
    tokio::spawn(async move {
        let beat = AgentMessage {
            kind: Some(agent_message::Kind::Heartbeat(Heartbeat::default())),
        };
        while tx.send(beat.clone()).await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let ended = loop {
        if let Err(status) = any_next(&mut inbound).await {
            break status;
        }
    };
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    // ... and a new stream on the same connection, with the same expired
    // certificate, is refused before anything else (no Welcome), by the
    // stream's check, not a new handshake.
    refused_with(
        grpc_client::open_on(channel, hello(1, 1)).await,
        Code::Unauthenticated,
        "the client certificate expired at",
    );
    let short_fp = fingerprint_of(&short.cert_pem);
    assert!(
        env.hub_log()
            .lines()
            .any(|l| l.contains("refused an agent's stream cluster=cluster7")
                && l.contains(&format!("certificate={short_fp}"))
                && l.contains("reason=\"certificate-expired\"")),
        "{}",
        env.hub_log()
    );
    assert!(metric(&env, &refusals("cluster7", "certificate-expired")).await >= 2.0);
    assert!(is_connected(&env));
}

/// Revocation driven by the hub's own watches: the ManagedCluster deleted,
/// then the addon disabled; each cuts the agent off and refuses it until the
/// object is back, also by a hub restarted while the cluster was away.
#[tokio::test]
async fn a_cluster_that_leaves_ocm_or_disables_the_addon_is_cut_off_until_back() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&[]).await;
    env.start_agent(0, Mode::Managed);
    connected(&env, true).await;
    let revoked_series =
        r#"argocd_pull_hub_grpc_refused_total{cluster="cluster1",reason="revoked"}"#;
    let ca = env.ca.pem.cert_pem.clone();
    let identity = env.ca.client(&agent_subject("cluster1"), None).unwrap();

    for (leave, why) in [
        ("ManagedCluster", "its ManagedCluster was deleted"),
        ("ManagedClusterAddOn", "the argocd-pull addon was disabled"),
    ] {
        let before = metric(&env, revoked_series).await;
        match leave {
            "ManagedCluster" => Api::<ManagedCluster>::all(env.hub_client.clone())
                .delete("cluster1", &Default::default())
                .await
                .map(|_| ()),
            _ => Api::<ManagedClusterAddOn>::namespaced(env.hub_client.clone(), "cluster1")
                .delete(keys::ADDON_NAME, &Default::default())
                .await
                .map(|_| ()),
        }
        .unwrap();
        wait::until(
            &format!("{leave} gone: the agent cut off and its reconnection refused"),
            WITHIN_SECONDS,
            || async {
                let connected = is_connected(&env);
                let refused = metric(&env, revoked_series).await - before;
                if !connected && refused >= 2.0 {
                    Ok(())
                } else {
                    Err(format!("connected {connected}, refused {refused}"))
                }
            },
        )
        .await;
        let status =
            refused(grpc_client::open(&env.hub_address(), &ca, &identity, hello(1, 1)).await);
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert_eq!(
            status.message(),
            format!("cluster cluster1 may not connect to this hub: {why}")
        );
        // Back: the agent reconnects by itself.
        match leave {
            "ManagedCluster" => common::managed_cluster(&env.hub, "cluster1").await,
            _ => grpc_env::enable_addon(&env.hub_client, "cluster1").await,
        }
        connected(&env, true).await;
    }

    // A hub restarted after the cluster left knows it from its watches,
    // not from having seen it leave.
    Api::<ManagedCluster>::all(env.hub_client.clone())
        .delete("cluster1", &Default::default())
        .await
        .unwrap();
    connected(&env, false).await;
    env.kill_hub().await;
    env.start_hub(&[]).await;
    let status = refused(grpc_client::open(&env.hub_address(), &ca, &identity, hello(1, 1)).await);
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        status.message(),
        "cluster cluster1 may not connect to this hub: there is no ManagedCluster of that name on this hub"
    );
    common::managed_cluster(&env.hub, "cluster1").await;
    connected(&env, true).await;
}

#[tokio::test]
async fn abusive_clients_are_held_to_the_limits() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&[
        "--grpc-max-handshakes=4",
        "--grpc-handshake-timeout=2s",
        "--grpc-control-queue=64",
    ])
    .await;

    // 1. Connections that never start their handshake: four wait, the
    //    others are closed at once and counted.
    let mut idle = Vec::new();
    for _ in 0..24 {
        idle.push(tokio::net::TcpStream::connect(env.grpc_addr).await.unwrap());
    }
    wait::until("connections over the limit dropped", TIMEOUT, || async {
        let m = env.hub_process.as_ref().unwrap().metrics().await;
        let dropped = value(&m, "argocd_pull_hub_grpc_handshakes_dropped_total");
        let in_flight = value(&m, "argocd_pull_hub_grpc_handshakes_in_flight");
        assert!(in_flight <= 4.0, "{m}");
        if dropped >= 20.0 {
            Ok(())
        } else {
            Err(dropped)
        }
    })
    .await;
    drop(idle);

    // 2. A flood of handshakes with a foreign CA's certificates, each
    //    claiming another cluster: the real agent still gets in, and no
    //    claimed name becomes a series.
    let flooding = Arc::new(AtomicBool::new(true));
    let attempts = Arc::new(AtomicU64::new(0));
    let rogue = Ca::new("rogue").unwrap();
    let mut flood = Vec::new();
    for i in 0..6 {
        let identity = rogue
            .client(&agent_subject(&format!("evil{i}")), None)
            .unwrap();
        let (address, ca, flooding) = (
            env.hub_address(),
            env.ca.pem.cert_pem.clone(),
            flooding.clone(),
        );
        let attempts = attempts.clone();
        flood.push(tokio::spawn(async move {
            while flooding.load(Ordering::Relaxed) {
                let _ = grpc_client::channel(&address, &ca, &identity, None).await;
                attempts.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    env.start_agent(0, Mode::Managed);
    connected(&env, true).await;
    flooding.store(false, Ordering::Relaxed);
    for f in flood {
        f.await.unwrap();
    }
    let m = env.hub_process.as_ref().unwrap().metrics().await;
    assert!(
        value(&m, &refusals("unverified", "certificate-invalid")) >= 1.0,
        "{} attempts: {m}",
        attempts.load(Ordering::Relaxed)
    );
    assert!(!m.contains("evil"), "a series for an unverified name: {m}");

    // 3. A client that sends status reports as fast as it can and reads
    //    nothing: the hub's queue for it fills to its bound and no further,
    //    then the hub stops reading and, after three heartbeats, ends it.
    common::managed_cluster(&env.hub, "cluster5").await;
    grpc_env::enable_addon(&env.hub_client, "cluster5").await;
    let flooder = env.ca.client(&agent_subject("cluster5"), None).unwrap();
    let channel = grpc_client::channel(
        &env.hub_address(),
        &env.ca.pem.cert_pem,
        &flooder,
        Some(65_535),
    )
    .await
    .unwrap();
    let (tx, _unread, _welcome) = grpc_client::open_on(channel, hello(1, 1)).await.unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let sender = tokio::spawn(async move {
        let key = ObjectKey {
            namespace: SPOKE_NS.into(),
            name: "alpha".into(),
        };
        for seq in 1.. {
            if tx
                .send(report(key.clone(), seq, b"{}".to_vec()))
                .await
                .is_err()
            {
                return;
            }
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    let queue = "argocd_pull_hub_grpc_agent_control_queue{cluster=\"cluster5\"}";
    let deepest = std::cell::Cell::new(0.0f64);
    wait::until("the flooder disconnected as stalled", TIMEOUT, || async {
        let m = env.hub_process.as_ref().unwrap().metrics().await;
        deepest.set(deepest.get().max(value(&m, queue)));
        match value(&m, &refusals("cluster5", "stalled")) {
            n if n >= 1.0 => Ok(()),
            _ => Err(deepest.get()),
        }
    })
    .await;
    assert_eq!(
        deepest.get(),
        64.0,
        "the queue filled to its bound, not beyond"
    );
    assert_eq!(metric(&env, queue).await, 0.0, "freed with the session");
    sender.abort();
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent > 64, "the client sent {sent}");

    // The real agent never noticed.
    assert!(is_connected(&env));
    env.create("alpha", 0, json!({})).await;
    let expected: BTreeMap<String, usize> = [("alpha".to_string(), 0)].into();
    wait::until("alpha delivered", TIMEOUT, || env.converged(&expected)).await;
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_and_a_place_freed_is_taken_again() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&["--grpc-max-connections=3"]).await;
    env.start_agent(0, Mode::Managed);
    connected(&env, true).await;
    let (address, ca) = (env.hub_address(), env.ca.pem.cert_pem.clone());
    let identity = env.ca.client(&agent_subject("cluster1"), None).unwrap();
    let open = || grpc_client::channel(&address, &ca, &identity, None);

    // The agent holds one place; two more connections fill the cap.
    let mut held = vec![open().await.unwrap(), open().await.unwrap()];
    wait::until("three connections open", TIMEOUT, || async {
        match metric(&env, "argocd_pull_hub_grpc_connections_open").await {
            3.0 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    // A fourth, even with a valid certificate, is closed before its
    // handshake, and counted.
    let refused = open().await;
    assert!(refused.is_err(), "a fourth connection was let in");
    assert!(metric(&env, "argocd_pull_hub_grpc_connections_dropped_total").await >= 1.0);
    assert_eq!(
        metric(&env, "argocd_pull_hub_grpc_connections_open").await,
        3.0
    );
    assert!(is_connected(&env), "the agent keeps its connection");

    // A connection that closes frees its place.
    held.pop();
    wait::until("a place freed", TIMEOUT, || async {
        match metric(&env, "argocd_pull_hub_grpc_connections_open").await {
            2.0 => Ok(()),
            n => Err(n),
        }
    })
    .await;
    held.push(open().await.unwrap());
    assert_eq!(
        metric(&env, "argocd_pull_hub_grpc_connections_open").await,
        3.0
    );
    let log = env.hub_log();
    assert!(
        log.contains("too many gRPC connections open"),
        "the cap is logged:\n{log}"
    );
}

/// A fleet that dials at once after a hub restart: connections over
/// `--grpc-max-handshake-rate` wait their turn in the accept queue instead
/// of being closed (each closed agent backs off further, up to 30 s).
#[tokio::test]
async fn handshakes_over_the_rate_wait_their_turn() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&["--grpc-max-handshake-rate=4"]).await;
    let (address, ca) = (env.hub_address(), env.ca.pem.cert_pem.clone());
    let identity = env.ca.client(&agent_subject("cluster1"), None).unwrap();
    // Three times the burst, all at once.
    let dials: Vec<_> = (0..12)
        .map(|_| {
            let (address, ca, identity) = (address.clone(), ca.clone(), identity.clone());
            tokio::spawn(async move { grpc_client::channel(&address, &ca, &identity, None).await })
        })
        .collect();
    let mut held = Vec::new();
    for d in dials {
        held.push(
            d.await
                .unwrap()
                .expect("a connection over the rate is served in its turn"),
        );
    }
    let m = env.hub_process.as_ref().unwrap().metrics().await;
    assert!(
        value(&m, "argocd_pull_hub_grpc_handshakes_paced_total") >= 6.0,
        "{m}"
    );
    assert_eq!(
        value(&m, "argocd_pull_hub_grpc_handshakes_dropped_total"),
        0.0,
        "{m}"
    );
    assert_eq!(
        value(&m, "argocd_pull_hub_grpc_connections_open"),
        12.0,
        "{m}"
    );
}
