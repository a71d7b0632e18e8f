//! Clusters behind an egress proxy, on real API servers with a real proxy
//! (tinyproxy, with Basic authentication and an idle timeout) between the
//! spoke-agent process and the hub-controller: the agent honours
//! `HTTPS_PROXY`, `--proxy` and `NO_PROXY`, authenticates from a file it
//! reads at every dial, says what to fix when the proxy refuses, and its
//! stream outlives the proxy's idle timeout because heartbeats flow; a
//! proxy that dies or hangs is left and rejoined within three heartbeat
//! intervals.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use testenv::node::Isolated;
use testenv::paths;
use testenv::tinyproxy::{ProxyOptions, TinyProxy};
use testenv::wait;

mod common;
mod grpc_env;
use grpc_env::{AgentProcess, Env, TIMEOUT};

/// What `Env::start_hub` gives the hub's `--grpc-heartbeat`.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// Digests far apart, so that on a quiet stream only heartbeats cross.
const RARE_DIGESTS: &str = "--grpc-digest-interval=10m";
/// The proxy's idle timeout in the heartbeat test: longer than a
/// heartbeat interval, shorter than the quiet period.
const PROXY_IDLE: Duration = Duration::from_secs(5);
const RECONNECTS: &str = "argocd_pull_agent_reconnects_total";

fn agent_binary() -> std::path::PathBuf {
    paths::own_binary("spoke-agent").expect("cargo test --workspace builds the spoke-agent")
}

async fn proxy_for(env: &Env, basic_auth: Option<(&str, &str)>, idle: Duration) -> TinyProxy {
    TinyProxy::start(ProxyOptions {
        basic_auth: basic_auth.map(|(u, p)| (u.to_string(), p.to_string())),
        idle_timeout: idle,
        connect_ports: vec![env.grpc_addr.port()],
    })
    .await
    .expect("tinyproxy starts (make tools builds it)")
}

/// Waits until `expected` (name -> spoke) is delivered and its status is
/// back on the hub.
async fn delivered(env: &Env, expected: &BTreeMap<String, usize>, what: &str) {
    wait::until(what, TIMEOUT, || env.converged(expected)).await;
}

#[tokio::test]
async fn the_agent_reaches_the_hub_through_its_proxy_with_the_credentials_of_its_secret() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    env.start_hub(&[]).await;
    let proxy = proxy_for(&env, Some(("agent", "s3cret")), Duration::from_secs(600)).await;
    let target = env.grpc_addr.to_string();
    let credentials = env.dir.path().join("proxy-credentials");
    std::fs::write(&credentials, "agent:s3cret\n").unwrap();
    let credentials_flag = credentials.to_str().unwrap().to_string();
    let hub = env.hub_address();

    // 1. HTTPS_PROXY, as OCM's proxyConfig sets it: delivery and status
    //    go through the proxy's tunnel.
    let one = env.spawn_agent_process(
        &agent_binary(),
        0,
        &hub,
        &[("HTTPS_PROXY", &proxy.url())],
        &["--proxy-credentials-file", &credentials_flag],
    );
    one.wait_connected(TIMEOUT).await;
    assert_eq!(
        proxy.connects_to(&target),
        1,
        "the proxy's log shows the agent's CONNECT to the hub:\n{}",
        proxy.log_text()
    );
    let mut expected = BTreeMap::new();
    env.create("through-the-proxy", 0, json!({})).await;
    expected.insert("through-the-proxy".to_string(), 0);
    delivered(&env, &expected, "delivery and status through the proxy").await;
    assert!(
        !one.log_text().contains("s3cret"),
        "the agent never logs the password"
    );

    // 2. `--proxy` wins over the environment (whose proxy does not
    //    exist). No credentials yet: the agent says which flag to set.
    let nowhere = format!("http://{}", testenv::net::free_addr().unwrap());
    let missing = env.dir.path().join("cluster2-credentials");
    let two = env.spawn_agent_process(
        &agent_binary(),
        1,
        &hub,
        &[("HTTPS_PROXY", &nowhere)],
        &[
            "--proxy",
            &proxy.url(),
            "--proxy-credentials-file",
            missing.to_str().unwrap(),
        ],
    );
    two.wait_logged(
        "407 Proxy Authentication Required: set --proxy-credentials-file",
        TIMEOUT,
    )
    .await;
    // A wrong password, read at the next dial: refused, and said so
    // (tinyproxy answers it with 401, not 407: the status line is shown
    // as the proxy gave it).
    std::fs::write(&missing, "agent:wrong\n").unwrap();
    two.wait_logged(
        "401 Unauthorized: the proxy refused the credentials of --proxy-credentials-file",
        TIMEOUT,
    )
    .await;
    assert!(!two.connected().await);
    assert!(
        !two.log_text().contains("connected to the hub"),
        "no connection past a refusing proxy:\n{}",
        two.log_text()
    );
    // The Secret is fixed: the next dial gets through, without a restart.
    std::fs::write(&missing, "agent:s3cret").unwrap();
    two.wait_connected(TIMEOUT).await;
    env.create("second-cluster", 1, json!({})).await;
    expected.insert("second-cluster".to_string(), 1);
    delivered(&env, &expected, "delivery to the second cluster").await;
    drop(two);

    // 3. NO_PROXY naming the hub: dialled directly, the proxy not asked.
    let before = proxy.connects_to(&target);
    let direct = env.spawn_agent_process(
        &agent_binary(),
        1,
        &hub,
        &[
            ("HTTPS_PROXY", &proxy.url()),
            ("NO_PROXY", &format!("example.com, {target}")),
        ],
        &[],
    );
    direct.wait_connected(TIMEOUT).await;
    env.create("direct", 1, json!({})).await;
    expected.insert("direct".to_string(), 1);
    delivered(&env, &expected, "delivery without the proxy").await;
    assert_eq!(proxy.connects_to(&target), before, "{}", proxy.log_text());
}

#[tokio::test]
async fn a_node_whose_only_way_out_is_the_proxy_reaches_the_hub_through_it() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&[]).await;
    let proxy = proxy_for(&env, None, Duration::from_secs(600)).await;
    let hub = env.hub_address();
    // The node reaches its own API server and the proxy, nothing else.
    let mut node = Isolated::create("proxy").unwrap();
    let testenv = paths::own_binary("testenv").unwrap();
    let api = env.spokes[0]
        .cluster
        .server()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    node.reach(&testenv, api).await.unwrap();
    node.reach(&testenv, proxy.addr).await.unwrap();

    // Dialled directly, the hub is out of reach from there.
    let direct = env.spawn_agent_command(node.command(&agent_binary()).into(), 0, &hub, &[], &[]);
    direct
        .wait_logged("no connection to the hub", TIMEOUT)
        .await;
    assert!(
        !direct.log_text().contains("connected to the hub "),
        "{}",
        direct.log_text()
    );
    drop(direct);

    let agent = env.spawn_agent_command(
        node.command(&agent_binary()).into(),
        0,
        &hub,
        &[("HTTPS_PROXY", &proxy.url())],
        &[],
    );
    agent.wait_logged("connected to the hub ", TIMEOUT).await;
    assert_eq!(
        proxy.connects_to(&env.grpc_addr.to_string()),
        1,
        "{}",
        proxy.log_text()
    );
    let expected = BTreeMap::from([("from-the-isolated-node".to_string(), 0)]);
    env.create("from-the-isolated-node", 0, json!({})).await;
    delivered(
        &env,
        &expected,
        "delivery to a node whose only way out is the proxy",
    )
    .await;
}

/// Waits until the agent has reconnected since `before` reconnects and is
/// connected again, within `within` of `since`; returns how long after
/// `since` that was.
async fn reconnected(
    agent: &AgentProcess,
    before: f64,
    since: Instant,
    within: Duration,
) -> Duration {
    let left = within.saturating_sub(since.elapsed());
    wait::until("the agent to reconnect", left, || async {
        let now = agent.metric(RECONNECTS).await.unwrap_or_default();
        if now > before && agent.connected().await {
            Ok(())
        } else {
            Err(format!("{RECONNECTS} {now}"))
        }
    })
    .await;
    since.elapsed()
}

/// A hub with `hub_args` and rare digests, a proxy with a
/// [`PROXY_IDLE`] idle timeout, and one cluster's agent (with `agent_env`
/// besides the proxy) connected through it.
async fn behind_an_idle_timeout(
    hub_args: &[&str],
    agent_env: &[(&str, &str)],
) -> (Env, TinyProxy, AgentProcess) {
    let mut env = Env::new(&["cluster1"]).await;
    let mut args = vec![RARE_DIGESTS];
    args.extend_from_slice(hub_args);
    env.start_hub(&args).await;
    let proxy = proxy_for(&env, None, PROXY_IDLE).await;
    let url = proxy.url();
    let mut vars = vec![("HTTPS_PROXY", url.as_str())];
    vars.extend_from_slice(agent_env);
    let agent = env.spawn_agent_process(&agent_binary(), 0, &env.hub_address(), &vars, &[]);
    agent.wait_connected(TIMEOUT).await;
    (env, proxy, agent)
}

/// The control for the test below: with the hub's default heartbeat
/// (10 s, longer than the proxy's 5 s idle timeout) the same quiet period
/// gets the tunnel cut, so what keeps it open there is the heartbeat.
#[tokio::test]
async fn a_stream_quieter_than_the_proxys_idle_timeout_is_cut() {
    let (env, proxy, agent) = behind_an_idle_timeout(&["--grpc-heartbeat=10s"], &[]).await;
    let reconnects = agent.metric(RECONNECTS).await.unwrap();
    let took = reconnected(&agent, reconnects, Instant::now(), PROXY_IDLE * 3).await;
    eprintln!("the proxy cut the quiet stream; the agent was back {took:?} later");
    assert!(proxy.connects_to(&env.grpc_addr.to_string()) >= 2);
}

#[tokio::test]
async fn heartbeats_outlive_the_proxys_idle_timeout_and_a_dead_proxy_is_left_within_three() {
    let (env, mut proxy, agent) = behind_an_idle_timeout(&[], &[]).await;
    let target = env.grpc_addr.to_string();
    let mut expected = BTreeMap::new();
    env.create("before-the-quiet", 0, json!({})).await;
    expected.insert("before-the-quiet".to_string(), 0);
    delivered(&env, &expected, "a first delivery").await;

    // 1. Quiet: no change for three of the proxy's idle timeouts. Only
    //    heartbeats cross; the one tunnel stays open.
    one_tunnel_through_the_quiet(&env, &proxy, &agent).await;
    assert!(
        !agent.log_text().contains("no connection to the hub"),
        "{}",
        agent.log_text()
    );
    env.create("after-the-quiet", 0, json!({})).await;
    expected.insert("after-the-quiet".to_string(), 0);
    delivered(&env, &expected, "delivery on the stream that stayed open").await;

    // 2. The proxy is killed (SIGKILL) and comes back on its port: the
    //    agent is through it again within three heartbeat intervals.
    let reconnects = agent.metric(RECONNECTS).await.unwrap();
    let killed = Instant::now();
    proxy.kill();
    proxy.restart().await.unwrap();
    let took = reconnected(&agent, reconnects, killed, HEARTBEAT * 3).await;
    eprintln!("reconnected {took:?} after the proxy was killed");
    assert_eq!(proxy.connects_to(&target), 2, "{}", proxy.log_text());

    // 3. The proxy hangs (SIGSTOP): its connections stay open but carry
    //    nothing, as with a proxy host gone from the network. Only the
    //    missing heartbeats tell; the agent gives up on the stream within
    //    three intervals, and rejoins once the proxy is replaced.
    let reconnects = agent.metric(RECONNECTS).await.unwrap();
    let frozen = Instant::now();
    proxy.freeze().unwrap();
    let silence = format!("nothing from the hub for {:?}", HEARTBEAT * 3);
    agent
        .wait_logged(&silence, HEARTBEAT * 3 + Duration::from_secs(2))
        .await;
    let detected = frozen.elapsed();
    eprintln!("a hung proxy detected after {detected:?}");
    assert!(
        detected <= HEARTBEAT * 3 + Duration::from_secs(1),
        "{detected:?}"
    );
    let killed = Instant::now();
    proxy.kill();
    proxy.restart().await.unwrap();
    let took = reconnected(&agent, reconnects, killed, HEARTBEAT * 3).await;
    eprintln!("reconnected {took:?} after the hung proxy was killed");
    env.create("after-the-hang", 0, json!({})).await;
    expected.insert("after-the-hang".to_string(), 0);
    delivered(&env, &expected, "delivery after the proxy was replaced").await;
}

/// One cluster behind a proxy that cuts quiet connections sooner than the
/// hub's interval allows (the control above: 10 s against a 5 s idle
/// timeout) asks for a shorter heartbeat (`--heartbeat`, the addon's
/// `HEARTBEAT`) and keeps its one tunnel through the quiet period; an
/// agent asking for less than the hub's floor gets the floor.
#[tokio::test]
async fn a_cluster_behind_a_short_idle_timeout_asks_for_the_heartbeat_it_needs() {
    let (env, proxy, agent) = behind_an_idle_timeout(
        &["--grpc-heartbeat=10s", "--grpc-heartbeat-min=2s"],
        &[("ARGOCD_PULL_HEARTBEAT", "1s")],
    )
    .await;
    agent
        .wait_logged(
            "the hub grants another heartbeat interval than asked",
            TIMEOUT,
        )
        .await;
    assert!(
        agent.log_text().contains("granted\":\"2s") || agent.log_text().contains("granted=2s"),
        "the hub's floor, not the 1 s asked: {}",
        agent.log_text()
    );
    one_tunnel_through_the_quiet(&env, &proxy, &agent).await;
}

/// Three of the proxy's idle timeouts and a second with nothing to send
/// (the window in which the control, `a_stream_quieter_than_the_proxys_idle_timeout_is_cut`,
/// sees the stream cut): the agent stays connected, never reconnects, and
/// the proxy saw one tunnel to the hub all along.
async fn one_tunnel_through_the_quiet(env: &Env, proxy: &TinyProxy, agent: &AgentProcess) {
    let reconnects = agent.metric(RECONNECTS).await.unwrap();
    tokio::time::sleep(PROXY_IDLE * 3 + Duration::from_secs(1)).await;
    assert!(agent.connected().await);
    assert_eq!(agent.metric(RECONNECTS).await, Some(reconnects));
    assert_eq!(
        proxy.connects_to(&env.grpc_addr.to_string()),
        1,
        "one tunnel all along:\n{}",
        proxy.log_text()
    );
}
