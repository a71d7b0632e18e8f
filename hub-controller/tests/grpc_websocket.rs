//! Clusters behind an HTTP/1.1-only reverse proxy (a real nginx passing
//! requests to the hub over HTTP/1.1 with `Upgrade`), on real API servers
//! with the spoke-agent and hub-controller processes: gRPC through it never
//! connects (the proxy reads the TLS ClientHello as a bad HTTP request),
//! the WebSocket wire carries the same mutual TLS, HTTP/2 and gRPC through
//! it (delivery, status, commands and live views), `--transport auto`
//! falls back to it and says so, heartbeats keep it open past the proxy's
//! read timeout, the client certificate is checked inside it as on the
//! gRPC wire, stray HTTP requests to the hub's port are answered without
//! disturbing anyone, and behind an egress proxy the WebSocket runs
//! inside its `CONNECT` tunnel.

use std::collections::BTreeMap;
use std::time::Duration;

use argocd_pull_runtime::websocket::PATH;
use grpc_env::replicas::request_sync;
use grpc_env::{AgentProcess, Env, TIMEOUT, write_pair};
use serde_json::json;
use testenv::nginx::{Nginx, NginxOptions};
use testenv::tinyproxy::{ProxyOptions, TinyProxy};
use testenv::{paths, wait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
mod grpc_env;

const RECONNECTS: &str = "argocd_pull_agent_reconnects_total";
const ON_WEBSOCKET: &str = r#"argocd_pull_agent_wire{wire="websocket"}"#;
const GRPC_DIAL_FAILURES: &str = r#"argocd_pull_agent_dial_failures_total{wire="grpc"}"#;
const HUB_WEBSOCKETS: &str = r#"argocd_pull_hub_grpc_wire_connections_total{wire="websocket"}"#;
const HUB_GRPC: &str = r#"argocd_pull_hub_grpc_wire_connections_total{wire="grpc"}"#;
const HUB_HTTP_REFUSED: &str = "argocd_pull_hub_grpc_http_refused_total";
/// The proxy's read timeout in the heartbeat test: longer than the hub's
/// 2 s heartbeat (`Env::start_hub`), shorter than the quiet period.
const PROXY_IDLE: Duration = Duration::from_secs(5);
const TOKEN: &str = "live-token-of-the-websocket-test";

fn agent_binary() -> std::path::PathBuf {
    paths::own_binary("spoke-agent").expect("cargo test --workspace builds the spoke-agent")
}

async fn nginx_for(env: &Env, read_timeout: Duration) -> Nginx {
    Nginx::start(NginxOptions {
        upstream: env.grpc_addr,
        read_timeout,
    })
    .await
    .expect("nginx starts (make tools builds it)")
}

/// The hub's metric `name`, 0 when it has no such series yet.
async fn hub_metric(env: &Env, name: &str) -> f64 {
    let admin = env.hub_process.as_ref().expect("the hub runs").admin;
    common::metric_at(admin, name).await.unwrap_or_default()
}

/// The hub's refusals of client certificates (`certificate-invalid`).
async fn hub_certificate_refusals(env: &Env) -> f64 {
    let metrics = env.hub_process.as_ref().unwrap().metrics().await;
    metrics
        .lines()
        .filter(|l| l.contains("_refused_total{") && l.contains("certificate-invalid"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Whether `log` has the structured field `key` with `value`, in either of
/// the log formats.
fn logged(log: &str, key: &str, value: &str) -> bool {
    log.contains(&format!("\"{key}\":\"{value}\""))
        || log.contains(&format!("{key}={value}"))
        || log.contains(&format!("{key}=\"{value}\""))
}

/// Stops `agent` and waits until the proxy logs `n` WebSockets: nginx
/// writes an upgraded request's line when it closes.
async fn websockets_through(nginx: &Nginx, agent: AgentProcess, n: usize) {
    drop(agent);
    wait::until("nginx to log the closed WebSockets", TIMEOUT, || async {
        match nginx.requests(PATH, 101) {
            seen if seen == n => Ok(()),
            seen => Err(format!("{seen}:\n{}", nginx.access_log())),
        }
    })
    .await;
}

/// Waits until the agent's metric `name` is at least `min`.
async fn metric_reaches(agent: &AgentProcess, name: &str, min: f64) {
    wait::until(&format!("{name} to reach {min}"), TIMEOUT, || async {
        match agent.metric(name).await {
            Some(v) if v >= min => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Waits until `expected` is delivered and its status is back on the hub.
async fn delivered(env: &Env, expected: &BTreeMap<String, usize>, what: &str) {
    wait::until(what, TIMEOUT, || env.converged(expected)).await;
}

/// The hub with its live endpoint: the endpoint's address and CA.
async fn hub_with_live(env: &mut Env, extra: &[&str]) -> (std::net::SocketAddr, String) {
    grpc_env::live::start_hub(env, TOKEN, extra).await
}

/// An agent with `--transport grpc` dialling `via` (nginx): every dial
/// fails, nginx answers each ClientHello with `400`, and no TLS reaches
/// the hub.
async fn grpc_never_connects_through(env: &mut Env, nginx: &Nginx, via: &str) {
    let grpc = env.spawn_agent_process(&agent_binary(), 0, via, &[], &["--transport", "grpc"]);
    metric_reaches(&grpc, GRPC_DIAL_FAILURES, 3.0).await;
    assert!(
        nginx.garbage_requests() >= 3,
        "nginx answered each ClientHello with 400:\n{}",
        nginx.access_log()
    );
    assert!(!grpc.connected().await);
    assert!(
        !grpc.log_text().contains("connected to the hub "),
        "{}",
        grpc.log_text()
    );
    assert_eq!(
        hub_metric(env, HUB_GRPC).await,
        0.0,
        "no TLS reached the hub"
    );
    assert_eq!(
        grpc.metric(ON_WEBSOCKET).await,
        None,
        "--transport grpc stays on gRPC"
    );
    drop(grpc);
}

#[tokio::test]
async fn grpc_through_an_http1_proxy_fails_and_the_websocket_wire_carries_everything() {
    let mut env = Env::new(&["cluster1"]).await;
    let (live, ca_pem) = hub_with_live(&mut env, &[]).await;
    let nginx = nginx_for(&env, Duration::from_secs(600)).await;
    let via = format!("https://{}", nginx.address());

    // 1. Plain gRPC: the proxy reads the ClientHello as a bad request.
    grpc_never_connects_through(&mut env, &nginx, &via).await;

    // 2. The WebSocket wire through the same proxy, its URL derived from
    //    the hub address.
    let ws = env.spawn_agent_process(
        &agent_binary(),
        0,
        &via,
        &[],
        &["--transport", "websocket", "--live-views"],
    );
    ws.wait_connected(TIMEOUT).await;
    assert_eq!(ws.metric(ON_WEBSOCKET).await, Some(1.0));
    assert_eq!(hub_metric(&env, HUB_WEBSOCKETS).await, 1.0);
    assert!(
        logged(&ws.log_text(), "wire", "websocket"),
        "{}",
        ws.log_text()
    );

    // Delivery and status back.
    let mut expected = BTreeMap::new();
    env.create("over-the-websocket", 0, json!({})).await;
    expected.insert("over-the-websocket".to_string(), 0);
    delivered(&env, &expected, "delivery and status over the WebSocket").await;

    // A sync command, run on the spoke and cleared on the hub.
    request_sync(&env, "over-the-websocket", "v2").await;
    wait::until("the sync to run on the spoke", TIMEOUT, || async {
        let syncs = env.spokes[0].argocd.syncs_of("over-the-websocket");
        syncs.contains(&"v2".to_string()).then_some(()).ok_or(syncs)
    })
    .await;
    delivered(&env, &expected, "the sync's status back on the hub").await;

    // A live view, read through the hub's live endpoint and the agent
    // (the spoke API server's version, as argocd-server reads it first).
    let reader =
        grpc_env::live::client(&format!("https://{live}/clusters/cluster1"), &ca_pem, TOKEN);
    wait::until("a live read through the WebSocket", TIMEOUT, || async {
        let request = http::Request::get("/version").body(Vec::new()).unwrap();
        match reader.request_text(request).await {
            Ok(body) if body.contains("\"gitVersion\"") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // All of it on the one WebSocket, through the proxy.
    assert_eq!(ws.metric(RECONNECTS).await, Some(0.0));
    assert_eq!(hub_metric(&env, HUB_WEBSOCKETS).await, 1.0);
    assert_eq!(hub_metric(&env, HUB_GRPC).await, 0.0);
    websockets_through(&nginx, ws, 1).await;
}

#[tokio::test]
async fn auto_falls_back_to_the_websocket_behind_an_http1_proxy_and_says_so() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&[]).await;
    let nginx = nginx_for(&env, Duration::from_secs(600)).await;
    let via = format!("https://{}", nginx.address());
    let agent = env.spawn_agent_process(&agent_binary(), 0, &via, &[], &[]);
    agent.wait_connected(TIMEOUT).await;
    agent
        .wait_logged("dialling the other wire (--transport auto)", TIMEOUT)
        .await;
    let log = agent.log_text();
    assert!(
        logged(&log, "from", "grpc") && logged(&log, "to", "websocket"),
        "{log}"
    );
    assert_eq!(agent.metric(ON_WEBSOCKET).await, Some(1.0));
    assert!(agent.metric(GRPC_DIAL_FAILURES).await >= Some(1.0));
    assert!(nginx.garbage_requests() >= 1, "{}", nginx.access_log());
    let expected = BTreeMap::from([("after-the-fallback".to_string(), 0)]);
    env.create("after-the-fallback", 0, json!({})).await;
    delivered(&env, &expected, "delivery after the fallback").await;
    assert_eq!(
        agent.metric(RECONNECTS).await,
        Some(1.0),
        "one failed gRPC dial"
    );
    assert_eq!(hub_metric(&env, HUB_WEBSOCKETS).await, 1.0);
    websockets_through(&nginx, agent, 1).await;
}

#[tokio::test]
async fn heartbeats_keep_the_websocket_open_past_the_proxys_read_timeout() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&["--grpc-digest-interval=10m"]).await;
    let nginx = nginx_for(&env, PROXY_IDLE).await;
    let via = format!("https://{}", nginx.address());
    let agent =
        env.spawn_agent_process(&agent_binary(), 0, &via, &[], &["--transport", "websocket"]);
    agent.wait_connected(TIMEOUT).await;
    let mut expected = BTreeMap::from([("before-the-quiet".to_string(), 0)]);
    env.create("before-the-quiet", 0, json!({})).await;
    delivered(&env, &expected, "a first delivery").await;

    // Three of the proxy's read timeouts and a second with nothing to
    // send: only heartbeats cross, and the one WebSocket stays open.
    let reconnects = agent.metric(RECONNECTS).await.unwrap();
    tokio::time::sleep(PROXY_IDLE * 3 + Duration::from_secs(1)).await;
    assert!(agent.connected().await);
    assert_eq!(agent.metric(RECONNECTS).await, Some(reconnects));
    assert_eq!(
        nginx.requests(PATH, 101),
        0,
        "none closed:\n{}",
        nginx.access_log()
    );
    env.create("after-the-quiet", 0, json!({})).await;
    expected.insert("after-the-quiet".to_string(), 0);
    delivered(
        &env,
        &expected,
        "delivery on the WebSocket that stayed open",
    )
    .await;
    assert_eq!(
        hub_metric(&env, HUB_WEBSOCKETS).await,
        1.0,
        "one WebSocket all along"
    );
    websockets_through(&nginx, agent, 1).await;
}

/// The control of the test above: with a heartbeat longer than the
/// proxy's read timeout the quiet WebSocket is cut, so what keeps it open
/// there is the heartbeat.
#[tokio::test]
async fn a_websocket_quieter_than_the_proxys_read_timeout_is_cut() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&["--grpc-digest-interval=10m", "--grpc-heartbeat=10s"])
        .await;
    let nginx = nginx_for(&env, PROXY_IDLE).await;
    let via = format!("https://{}", nginx.address());
    let agent =
        env.spawn_agent_process(&agent_binary(), 0, &via, &[], &["--transport", "websocket"]);
    agent.wait_connected(TIMEOUT).await;
    let reconnects = agent.metric(RECONNECTS).await.unwrap();
    wait::until(
        "the proxy to cut the quiet WebSocket",
        PROXY_IDLE * 4,
        || async {
            match agent.metric(RECONNECTS).await {
                Some(n) if n > reconnects && nginx.requests(PATH, 101) >= 1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// Sends `request` to `addr` and reads the answer to its end.
async fn http_exchange(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(TIMEOUT, s.read_to_end(&mut answer))
        .await
        .expect("the hub answers and closes")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn the_client_certificate_is_checked_inside_the_websocket_and_stray_requests_are_refused() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    env.start_hub(&[]).await;
    let hub = env.hub_address();

    // cluster1 connected over gRPC, straight to the hub.
    let grpc = env.spawn_agent_process(&agent_binary(), 0, &hub, &[], &["--transport", "grpc"]);
    grpc.wait_connected(TIMEOUT).await;
    let reconnects = grpc.metric(RECONNECTS).await.unwrap();

    // Requests that are no WebSocket upgrade: a short 400 or 404, closed.
    let plain = http_exchange(
        env.grpc_addr,
        &format!("GET {PATH} HTTP/1.1\r\nHost: hub\r\n\r\n"),
    )
    .await;
    assert!(plain.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{plain}");
    let elsewhere = http_exchange(env.grpc_addr, "GET / HTTP/1.1\r\nHost: hub\r\n\r\n").await;
    assert!(
        elsewhere.starts_with("HTTP/1.1 404 Not Found\r\n"),
        "{elsewhere}"
    );
    assert_eq!(hub_metric(&env, HUB_HTTP_REFUSED).await, 2.0);
    let expected = BTreeMap::from([("undisturbed".to_string(), 0)]);
    env.create("undisturbed", 0, json!({})).await;
    delivered(&env, &expected, "delivery on the gRPC stream after them").await;
    assert_eq!(grpc.metric(RECONNECTS).await, Some(reconnects));

    // cluster2 with a certificate of another CA: refused by the hub's TLS
    // on either wire, counted and logged the same way.
    let other = testenv::pki::Ca::new("not-the-hubs-ca").unwrap();
    let pair = other
        .client(&grpc_env::agent_subject("cluster2"), None)
        .unwrap();
    let (cert, key) = write_pair(env.dir.path(), "cluster2-foreign", &pair);
    env.spokes[1].certs.cert = cert;
    env.spokes[1].certs.key = key;
    for wire in ["grpc", "websocket"] {
        let before = hub_certificate_refusals(&env).await;
        let agent = env.spawn_agent_process(&agent_binary(), 1, &hub, &[], &["--transport", wire]);
        wait::until(
            &format!("the hub to refuse the {wire} wire's certificate"),
            TIMEOUT,
            || async {
                let n = hub_certificate_refusals(&env).await;
                (n > before).then_some(()).ok_or(n)
            },
        )
        .await;
        assert!(!agent.connected().await);
        drop(agent);
    }
    assert_eq!(
        hub_metric(&env, HUB_WEBSOCKETS).await,
        0.0,
        "no WebSocket got past TLS"
    );
    let log = env.hub_log();
    assert!(
        log.matches("refused an agent's client certificate").count() >= 2,
        "{log}"
    );
    assert_eq!(grpc.metric(RECONNECTS).await, Some(reconnects));
}

#[tokio::test]
async fn the_websocket_wire_runs_inside_the_egress_proxys_tunnel() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&[]).await;
    let proxy = TinyProxy::start(ProxyOptions {
        basic_auth: None,
        idle_timeout: Duration::from_secs(600),
        connect_ports: vec![env.grpc_addr.port()],
    })
    .await
    .expect("tinyproxy starts (make tools builds it)");
    let hub = env.hub_address();
    let agent = env.spawn_agent_process(
        &agent_binary(),
        0,
        &hub,
        &[("HTTPS_PROXY", &proxy.url())],
        &["--transport", "websocket"],
    );
    agent.wait_connected(TIMEOUT).await;
    assert_eq!(
        proxy.connects_to(&env.grpc_addr.to_string()),
        1,
        "the WebSocket's host asked of the proxy:\n{}",
        proxy.log_text()
    );
    assert_eq!(hub_metric(&env, HUB_WEBSOCKETS).await, 1.0);
    assert_eq!(agent.metric(ON_WEBSOCKET).await, Some(1.0));
    let expected = BTreeMap::from([("through-the-tunnel".to_string(), 0)]);
    env.create("through-the-tunnel", 0, json!({})).await;
    delivered(&env, &expected, "delivery over a WebSocket in a tunnel").await;
}
