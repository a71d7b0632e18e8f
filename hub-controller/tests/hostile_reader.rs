//! A reader of the live views (whoever argocd-server lets open a LIVE
//! MANIFEST, an EVENTS or a LOGS tab) against the hub's live endpoint,
//! called as argocd-server calls it: the cluster Secret's token, the
//! Kubernetes API's paths under `/clusters/<cluster>`. What one reader
//! asks never cuts the cluster's agent off (a path the agent would not
//! take is refused at the hub, 414 or 400, before it goes on the stream),
//! never takes every live read of the cluster (each namespace has its
//! share, followed logs apart, and a follow ends), never reads another
//! object's events (no uid, no events) and never reads what Argo CD did
//! not apply for a pulled Application, whatever an Application's status
//! lists. Connections on the live port are bounded and closed when idle.
//! The hub is the hub-controller binary; the agent the real one on a real
//! API server, or a raw client of the protocol where the test must hold
//! reads open (a followed log needs a kubelet).

mod common;
mod grpc_env;

use std::sync::Arc;
use std::time::Duration;

use argocd_pull_proto::v1::{AgentMessage, HubMessage, LiveResponse, agent_message, hub_message};
use argocd_pull_proto::version;
use argocd_pull_spoke_agent::Mode;
use common::grpc_client::{self, hello};
use grpc_env::live::client as live_client;
use grpc_env::{Env, TIMEOUT};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::ResourceExt;
use serde_json::{Value, json};
use testenv::wait;

const TOKEN: &str = "live-token-of-the-hostile-reader";

/// The hub with its live endpoint: the endpoint's address and CA.
async fn hub_with_live(env: &mut Env, extra: &[&str]) -> (std::net::SocketAddr, String) {
    grpc_env::live::start_hub(env, TOKEN, extra).await
}

/// A client of cluster1's path on the endpoint, as argocd-server is one.
fn reader(addr: std::net::SocketAddr, ca_pem: &str) -> kube::Client {
    live_client(&format!("https://{addr}/clusters/cluster1"), ca_pem, TOKEN)
}

/// GET `path` through `client`: the code and the body (or the Status
/// message of a refusal).
async fn get(client: &kube::Client, path: &str) -> (u16, String) {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => (0, e.to_string()),
    }
}

/// cluster1's real agent, serving live views, connected.
async fn live_agent(env: &mut Env) {
    let mut config = env.agent_config(0, &env.hub_address(), Mode::Managed);
    config.live.views = true;
    env.start_agent_with(0, config);
    env.wait_connected().await;
}

fn reconnects(env: &Env) -> i64 {
    env.spokes[0]
        .agent
        .as_ref()
        .unwrap()
        .metrics
        .reconnects
        .get() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_agent_would_not_take_is_refused_at_the_hub_and_the_cluster_stays_connected() {
    let mut env = Env::new(&["cluster1"]).await;
    let (addr, ca_pem) = hub_with_live(&mut env, &[]).await;
    live_agent(&mut env).await;
    let client = reader(addr, &ca_pem);
    wait::until("the agent serves discovery", TIMEOUT, || async {
        match get(&client, "/version").await {
            (200, _) => Ok(()),
            other => Err(other),
        }
    })
    .await;

    // argocd-server's logs API with a 6,000-character container, twice.
    let long = format!(
        "/api/v1/namespaces/guestbook/pods/guestbook-ui-1/log?container={}&follow=true&tailLines=10",
        "c".repeat(6000)
    );
    for _ in 0..2 {
        let (code, message) = get(&client, &long).await;
        println!(
            "a logs request of {} characters: {code} {message}",
            long.len()
        );
        assert_eq!(code, 414, "{message}");
        assert!(message.contains("over the 4096"), "{message}");
    }
    // A path and a query over the limit by their names alone.
    let (code, message) = get(
        &client,
        &format!(
            "/api/v1/namespaces/guestbook/configmaps/{}",
            "n".repeat(5000)
        ),
    )
    .await;
    assert_eq!(code, 414, "{message}");
    let (code, message) = get(
        &client,
        &format!(
            "/api/v1/namespaces/guestbook/events?fieldSelector=involvedObject.name%3D{}",
            "n".repeat(5000)
        ),
    )
    .await;
    assert_eq!(code, 414, "{message}");
    // A path of a form the agent does not take.
    let (code, message) = get(&client, "/api/v1/namespaces/guest%20book/configmaps/x").await;
    assert_eq!(code, 400, "{message}");

    // The cluster's agent never saw them: the next read is answered by
    // it, on the session it had.
    let (code, body) = get(&client, "/api/v1/namespaces/guestbook/configmaps/absent").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("the cluster's API server"), "{body}");
    assert_eq!(reconnects(&env), 0, "the agent's session ended");
    env.assert_logged("refused a live read");
    let log = env.hub_log();
    let line = log
        .lines()
        .find(|l| l.contains("refused a live read") && l.contains("length=6"))
        .expect("the hub's log line of the oversized read");
    println!("the hub's log line: {line}");
}

/// The hub and cluster1's agent as a raw client of the protocol offering
/// `live-views` and `live-credits`: the sender, the stream, and a client
/// of the endpoint.
async fn raw_agent(
    env: &mut Env,
    extra: &[&str],
) -> (
    tokio::sync::mpsc::Sender<AgentMessage>,
    tonic::Streaming<HubMessage>,
    kube::Client,
) {
    let (addr, ca_pem) = hub_with_live(env, extra).await;
    let identity = testenv::pki::CertKey {
        cert_pem: std::fs::read_to_string(&env.spokes[0].certs.cert).unwrap(),
        key_pem: std::fs::read_to_string(&env.spokes[0].certs.key).unwrap(),
    };
    let mut first = hello(1, 1);
    if let Some(agent_message::Kind::Hello(h)) = &mut first.kind {
        h.capabilities.push(version::CAPABILITY_LIVE_VIEWS.into());
        h.capabilities.push(version::CAPABILITY_LIVE_CREDITS.into());
    }
    let (tx, inbound, _) =
        grpc_client::open(&env.hub_address(), &env.ca.pem.cert_pem, &identity, first)
            .await
            .unwrap();
    (tx, inbound, reader(addr, &ca_pem))
}

/// The next live message for the agent.
async fn next_live(inbound: &mut tonic::Streaming<HubMessage>) -> hub_message::Kind {
    loop {
        match grpc_client::next(inbound).await.unwrap().kind {
            Some(
                k @ (hub_message::Kind::LiveRequest(_)
                | hub_message::Kind::LiveCredit(_)
                | hub_message::Kind::LiveCancel(_)),
            ) => return k,
            _ => continue,
        }
    }
}

fn chunk(id: u64, content_type: &str, body: &[u8], last: bool) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::LiveResponse(LiveResponse {
            id,
            http_status: 200,
            content_type: content_type.into(),
            body: body.to_vec(),
            last,
        })),
    }
}

/// A followed log of `pod` in `namespace` through `client`: its open body,
/// or the code and message it was refused with.
async fn follow(
    client: kube::Client,
    namespace: &str,
    pod: &str,
) -> Result<impl futures::AsyncRead + use<>, (u16, String)> {
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}/log?follow=true&container=main"
    ))
    .body(Vec::new())
    .unwrap();
    client.request_stream(request).await.map_err(|e| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => (0, other.to_string()),
    })
}

/// Plays the cluster's side: every LiveRequest is answered with a first
/// chunk (a log line, or a ConfigMap) that is not the last, or whole for
/// an object; the paths asked, in order.
fn answer_everything(
    tx: tokio::sync::mpsc::Sender<AgentMessage>,
    mut inbound: tonic::Streaming<HubMessage>,
) -> (
    Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let asked: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let seen = asked.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok(m) = grpc_client::next(&mut inbound).await else {
                continue;
            };
            let Some(hub_message::Kind::LiveRequest(r)) = m.kind else {
                continue;
            };
            seen.lock().unwrap().push(r.path.clone());
            let answer = if r.path.contains("/log") {
                chunk(r.id, "text/plain", b"a line\n", false)
            } else {
                let cm = json!({ "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": { "name": "settings", "namespace": "guestbook" } });
                chunk(r.id, "application/json", cm.to_string().as_bytes(), true)
            };
            if tx.send(answer).await.is_err() {
                return;
            }
        }
    });
    (asked, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_followed_logs_of_one_namespace_hold_back_no_other_read() {
    let mut env = Env::new(&["cluster1"]).await;
    let (tx, inbound, client) = raw_agent(&mut env, &[]).await;
    let (asked, _agent) = answer_everything(tx, inbound);

    // Ten followed logs of one namespace (one browser tab on a Deployment
    // of ten pods), all at once.
    let follows = (0..10).map(|i| {
        let client = client.clone();
        tokio::spawn(async move { follow(client, "guestbook", &format!("ui-{i}")).await })
    });
    let mut open = Vec::new();
    let mut refusals = Vec::new();
    for f in follows {
        match f.await.unwrap() {
            Ok(body) => open.push(body),
            Err(refusal) => refusals.push(refusal),
        }
    }
    println!("{} follows open; refused: {refusals:?}", open.len());
    assert_eq!(open.len(), 4, "{refusals:?}");
    assert_eq!(refusals.len(), 6);
    for (code, message) in &refusals {
        assert_eq!(*code, 429, "{message}");
        assert!(
            message.contains("followed logs in namespace guestbook")
                && message.contains("--live-follows-per-namespace"),
            "{message}"
        );
    }
    // While they stay open: the LIVE MANIFEST of the same namespace, a
    // follow of another namespace, and discovery are all served.
    let (code, body) = get(&client, "/api/v1/namespaces/guestbook/configmaps/settings").await;
    assert_eq!(code, 200, "{body}");
    let other = follow(client.clone(), "other-team", "api-0").await;
    assert!(other.is_ok(), "{:?}", other.err());
    let (code, body) = get(&client, "/api/v1/namespaces/other-team/configmaps/settings").await;
    assert_eq!(code, 200, "{body}");
    let follows_asked = asked
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.contains("/guestbook/pods/"))
        .count();
    assert_eq!(follows_asked, 4, "{:?}", asked.lock().unwrap());
    let log = env.hub_log();
    let line = log
        .lines()
        .find(|l| l.contains("refused a live read: its share of the cluster"))
        .expect("the hub's log line of a fair-share refusal");
    println!("the hub's log line: {line}");
    drop(open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_log_ends_after_the_follow_timeout() {
    use futures::AsyncReadExt;
    let mut env = Env::new(&["cluster1"]).await;
    let (tx, mut inbound, client) = raw_agent(&mut env, &["--live-follow-timeout=3s"]).await;
    let reading = tokio::spawn(async move {
        let body = follow(client, "guestbook", "ui-0").await.unwrap();
        futures::pin_mut!(body);
        let mut all = Vec::new();
        let started = std::time::Instant::now();
        body.read_to_end(&mut all).await.unwrap();
        (all, started.elapsed())
    });
    let hub_message::Kind::LiveRequest(request) = next_live(&mut inbound).await else {
        panic!("no LiveRequest first");
    };
    tx.send(chunk(request.id, "text/plain", b"first line\n", false))
        .await
        .unwrap();
    // The agent keeps the log open; the hub ends it, and says so.
    let cancelled = match next_live(&mut inbound).await {
        hub_message::Kind::LiveCancel(c) => c,
        other => panic!("not ended: {other:?}"),
    };
    assert_eq!(cancelled.id, request.id);
    let (all, took) = tokio::time::timeout(TIMEOUT, reading)
        .await
        .unwrap()
        .unwrap();
    println!("a follow ended after {took:?}");
    assert_eq!(all, b"first line\n");
    assert!(took >= Duration::from_secs(2), "{took:?}");
}

/// The spoke copy of `name` once the agent applied it: its namespace and
/// name, and the instance name its objects' tracking carries.
async fn applied(env: &Env, name: &str) -> (String, String) {
    let spoke = wait::until("the spoke copy", TIMEOUT, || async {
        env.spoke_apps(0).get(name).await.map_err(|e| e.to_string())
    })
    .await;
    let ns = spoke.namespace().unwrap();
    let instance = argocd_pull_core::status::tree::instance_name(&ns, name, grpc_env::SPOKE_NS);
    (ns, instance)
}

/// On cluster1, in namespace `guestbook`: ConfigMap `applied`, which Argo
/// CD applied for the Application of `instance` (its tracking annotation
/// names it), `applied-child` it owns, `never-applied` and `copied` (with
/// `applied`'s annotation), all listed in the spoke copy's status (as
/// anybody who may update the Application writes it), and an Event of
/// each of the first and third: the uids of those two.
async fn objects_of_guestbook(env: &Env, instance: &str) -> (String, String) {
    let cluster1 = env.spokes[0].client.clone();
    env.spokes[0]
        .cluster
        .ensure_namespace("guestbook")
        .await
        .unwrap();
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(cluster1.clone(), "guestbook");
    let create = async |body: Value| {
        cms.create(&Default::default(), &serde_json::from_value(body).unwrap())
            .await
            .unwrap()
    };
    // What Argo CD applied for the pulled Application (its tracking
    // annotation names it); what it owns; and one it never applied.
    let tracked = create(json!({ "metadata": { "name": "applied", "annotations": {
        "argocd.argoproj.io/tracking-id": format!("{instance}:/ConfigMap:guestbook/applied") } } }))
    .await;
    create(json!({ "metadata": { "name": "applied-child", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "applied", "uid": tracked.uid().unwrap() }] } }))
    .await;
    let never = create(json!({ "metadata": { "name": "never-applied" } })).await;
    // A copied annotation names the object it was copied from.
    create(json!({ "metadata": { "name": "copied", "annotations": {
        "argocd.argoproj.io/tracking-id": format!("{instance}:/ConfigMap:guestbook/applied") } } }))
    .await;
    // Labelled for the Application as label tracking would, by whatever
    // may create ConfigMaps there: the cluster's Argo CD tracks by
    // annotation (its default), which keeps no label.
    create(json!({ "metadata": { "name": "labelled", "labels": {
        "app.kubernetes.io/instance": instance } } }))
    .await;
    // The Application's status lists them all, as a status anybody who
    // may update the Application writes does.
    let listed: Vec<Value> = ["applied", "never-applied", "copied", "labelled"]
        .iter()
        .map(|n| json!({ "version": "v1", "kind": "ConfigMap", "namespace": "guestbook", "name": n }))
        .collect();
    env.spokes[0].argocd.stop();
    env.spoke_apps(0)
        .patch(
            "guestbook",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "status": { "resources": listed } })),
        )
        .await
        .unwrap();
    let events: kube::Api<Event> = kube::Api::namespaced(cluster1.clone(), "guestbook");
    for (name, uid) in [
        ("applied", tracked.uid().unwrap()),
        ("never-applied", never.uid().unwrap()),
    ] {
        events
            .create(
                &Default::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": format!("{name}.1") },
                    "involvedObject": { "apiVersion": "v1", "kind": "ConfigMap",
                        "namespace": "guestbook", "name": name, "uid": uid },
                    "reason": "Seen", "message": format!("an event of {name}"), "type": "Normal",
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    (tracked.uid().unwrap(), never.uid().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_argocd_applied_is_served_and_events_only_by_uid() {
    let mut env = Env::new(&["cluster1"]).await;
    let (addr, ca_pem) = hub_with_live(&mut env, &[]).await;
    live_agent(&mut env).await;
    env.create("guestbook", 0, json!({})).await;
    let (_, instance) = applied(&env, "guestbook").await;
    let (tracked, never) = objects_of_guestbook(&env, &instance).await;
    let client = reader(addr, &ca_pem);
    let cm = |name: &str| format!("/api/v1/namespaces/guestbook/configmaps/{name}");
    let events_of = |name: &str, uid: &str| {
        format!(
            "/api/v1/namespaces/guestbook/events?fieldSelector=involvedObject.name%3D{name}%2CinvolvedObject.namespace%3Dguestbook%2CinvolvedObject.uid%3D{uid}"
        )
    };

    let applied_cm = wait::until("the applied ConfigMap through the hub", TIMEOUT, || async {
        match get(&client, &cm("applied")).await {
            (200, body) => Ok(body),
            other => Err(other),
        }
    })
    .await;
    assert!(applied_cm.contains("\"name\":\"applied\""), "{applied_cm}");
    let (code, body) = get(&client, &cm("applied-child")).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = get(&client, &events_of("applied", &tracked)).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("an event of applied"), "{body}");

    // Everything below must be refused; what was served instead is
    // collected, so that one run shows every hole.
    let mut served = Vec::new();
    let mut refused = |what: &str, (code, message): (u16, String), reason: &str| {
        println!("{what}: {code} {message}");
        if code != 403 || !message.contains(reason) {
            served.push(format!("{what}: {code} {message}"));
        }
    };
    // Events never without a uid (argocd-server sends an empty one for a
    // node that has none): they would be another object's.
    for (what, path) in [
        ("events of applied, empty uid", events_of("applied", "")),
        ("events of never-applied, empty uid", events_of("never-applied", "")),
        (
            "events of never-applied, no uid",
            "/api/v1/namespaces/guestbook/events?fieldSelector=involvedObject.name%3Dnever-applied%2CinvolvedObject.namespace%3Dguestbook".to_string(),
        ),
    ] {
        refused(what, get(&client, &path).await, "without the uid");
    }
    // Listed in the status, never applied by Argo CD (or with another
    // object's tracking, or a label the cluster's tracking does not keep):
    // refused, and their events too.
    for name in ["never-applied", "copied", "labelled"] {
        refused(
            name,
            get(&client, &cm(name)).await,
            "belongs to no Application",
        );
    }
    refused(
        "events of never-applied by its uid",
        get(&client, &events_of("never-applied", &never)).await,
        "belongs to no Application",
    );
    assert!(served.is_empty(), "served: {served:#?}");
    // An applied object's name with another object's uid: nothing of the
    // other's.
    let (code, body) = get(&client, &events_of("applied", &never)).await;
    assert!(!body.contains("an event of"), "{code} {body}");
}

/// A TLS connection to the live port that completes its handshake and
/// sends nothing.
async fn silent(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    silent_from("127.0.0.1", addr, ca_pem).await.unwrap()
}

/// [`silent`] from the loopback address `source` (another client, to the
/// endpoint, than one at another address); an error when the endpoint
/// closes it before the handshake is through.
async fn silent_from(
    source: &str,
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let tcp = socket.connect(addr).await?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    connector.connect(name, tcp).await
}

/// How long until the server closes `conn` (within `within`), or `None`.
async fn closed_within(
    conn: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    within: Duration,
) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, conn.read(&mut buf)).await {
        Ok(_) => Some(started.elapsed()),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_request_is_closed() {
    let mut env = Env::new(&["cluster1"]).await;
    let (addr, ca_pem) = hub_with_live(&mut env, &[]).await;
    let mut conn = silent(addr, &ca_pem).await;
    // The default header timeout (10 s), with room.
    let took = closed_within(&mut conn, Duration::from_secs(30)).await;
    println!("a silent connection closed after {took:?}");
    assert!(took.is_some(), "still open after 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_holds_its_share_of_the_live_port_and_no_more() {
    let mut env = Env::new(&["cluster1"]).await;
    let (addr, ca_pem) = hub_with_live(
        &mut env,
        &[
            "--live-max-connections=8",
            "--live-max-connections-per-client=2",
            "--live-header-timeout=30s",
        ],
    )
    .await;
    // One client, silent, at its share: a third connection of it is
    // closed at once, well before the header timeout.
    let _first = silent_from("127.0.0.1", addr, &ca_pem).await.unwrap();
    let _second = silent_from("127.0.0.1", addr, &ca_pem).await.unwrap();
    // Cut before its handshake is through, or at once after it.
    if let Ok(mut third) = silent_from("127.0.0.1", addr, &ca_pem).await {
        let took = closed_within(&mut third, Duration::from_secs(10)).await;
        assert!(took.is_some(), "a client took more than its share");
    }
    env.assert_logged("a client of the live endpoint holds its share");
    // Another client, meanwhile, is answered (401 for a guessed token: an
    // answer of the endpoint, not a closed connection).
    let mut other = silent_from("127.0.0.2", addr, &ca_pem).await.unwrap();
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        other
            .write_all(
                format!("GET /clusters/cluster1/version HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer guessed\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(20), other.read(&mut buf))
            .await
            .expect("the other client is answered")
            .unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
}

#[tokio::test]
async fn connections_on_the_live_port_are_bounded_and_idle_ones_closed() {
    let mut env = Env::new(&["cluster1"]).await;
    let (addr, ca_pem) = hub_with_live(
        &mut env,
        &[
            "--live-max-connections=2",
            // Longer than the third's window (3 s) with room: the first
            // two, slow to open on a loaded machine, must still hold
            // their places when the third comes.
            "--live-header-timeout=10s",
            "--live-idle-timeout=10s",
        ],
    )
    .await;
    let mut first = silent(addr, &ca_pem).await;
    let mut second = silent(addr, &ca_pem).await;
    // A third, beyond the bound: closed at once.
    let mut third = silent(addr, &ca_pem).await;
    let took = closed_within(&mut third, Duration::from_secs(3)).await;
    assert!(took.is_some(), "a connection beyond the bound stayed open");
    env.assert_logged("--live-max-connections open: closed a new one");
    // The first two, once they have been silent for the header timeout.
    for conn in [&mut first, &mut second] {
        let took = closed_within(conn, Duration::from_secs(20)).await;
        assert!(took.is_some(), "a silent connection stayed open");
    }
    // Room again: a reader is served (401 for a guessed token is an
    // answer of the endpoint, not a closed connection).
    let stranger = live_client(
        &format!("https://{addr}/clusters/cluster1"),
        &ca_pem,
        "guessed",
    );
    let (code, _) = get(&stranger, "/version").await;
    assert_eq!(code, 401);
    // A connection that was served, then left idle: closed after the idle
    // timeout, with no request under way.
    let mut used = silent(addr, &ca_pem).await;
    {
        use tokio::io::AsyncWriteExt;
        used.write_all(
            format!("GET /clusters/cluster1/version HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer guessed\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    }
    let mut answer = Vec::new();
    let started = std::time::Instant::now();
    {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(20), used.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                Err(_) => panic!("an idle connection stayed open for 20 s"),
            }
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    println!(
        "a served connection, idle, closed after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= Duration::from_secs(3));
}
