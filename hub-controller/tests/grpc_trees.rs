//! Capability `trees`, the hub's half: what an agent reports of its
//! cluster's Argo CD (the whole tree, children included, and the managed
//! resources with their live and desired states) reaches the hub's real
//! argocd-server, through the hub-controller binary with `--argocd-redis`:
//! its API's `resource-tree` shows the children under their owners, and
//! `managed-resources` the live state. A tree for another hub Application
//! (an old uid) is refused and changes nothing. In the first test the
//! agent is a raw client of the protocol, so that the test controls
//! exactly what it says; in the second it is the real agent reading a
//! real Argo CD's Redis on the managed cluster, and the user reads what
//! it reported with the `argocd` CLI against the hub. The last two read
//! the cluster live through the hub's endpoint: through one replica, and
//! through a replica the agent is not connected to.

mod common;
mod grpc_env;

use std::io::Read as _;

use argocd_pull_proto::v1::{AgentMessage, ResourceTreeReport, agent_message, hub_message};
use argocd_pull_proto::version;
use argocd_pull_runtime::redis::Redis;
use argocd_pull_spoke_agent::Mode;
use argocd_pull_spoke_agent::args::LiveArgs;
use argocd_pull_spoke_agent::trees::{Password, RedisConfig};
use common::grpc_client::{self, hello};
use grpc_env::live::{client as live_client, refused};
use grpc_env::{Env, TIMEOUT};
use http::Method;
use serde_json::{Value, json};
use testenv::argocd::{GitServer, Server, ServerOptions, Spoke, SpokeOptions};
use testenv::wait;

fn tree(hub_uid: &str, key: argocd_pull_proto::v1::ObjectKey, pod: &str) -> AgentMessage {
    let nodes = json!({ "nodes": [
        { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "guestbook",
          "name": "guestbook-ui", "uid": "spoke-d", "health": { "status": "Healthy" } },
        { "group": "apps", "version": "v1", "kind": "ReplicaSet", "namespace": "guestbook",
          "name": "guestbook-ui-5d", "uid": "spoke-rs", "health": { "status": "Healthy" },
          "parentRefs": [{ "group": "apps", "kind": "Deployment", "namespace": "guestbook",
                           "name": "guestbook-ui", "uid": "spoke-d" }] },
        { "version": "v1", "kind": "Pod", "namespace": "guestbook", "name": pod,
          "uid": "spoke-p", "health": { "status": "Healthy" },
          "parentRefs": [{ "group": "apps", "kind": "ReplicaSet", "namespace": "guestbook",
                           "name": "guestbook-ui-5d", "uid": "spoke-rs" }] },
    ]});
    let live = json!({ "apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": { "name": "guestbook-ui", "namespace": "guestbook" },
                       "spec": { "replicas": 1 } });
    let managed = json!([{ "group": "apps", "kind": "Deployment", "namespace": "guestbook",
                           "name": "guestbook-ui", "liveState": live.to_string(),
                           "targetState": live.to_string() }]);
    AgentMessage {
        kind: Some(agent_message::Kind::Tree(ResourceTreeReport {
            key: Some(key),
            hub_uid: hub_uid.into(),
            tree_json: serde_json::to_vec(&nodes).unwrap(),
            managed_resources_json: serde_json::to_vec(&managed).unwrap(),
        })),
    }
}

/// `kind/name <- parent kind` of each node argocd-server's tree has, sorted.
async fn nodes(server: &Server, token: &str, app: &str, ns: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = server
        .tree_nodes(token, ns, app)
        .await?
        .iter()
        .map(|n| {
            let parent = n
                .pointer("/parentRefs/0/kind")
                .and_then(Value::as_str)
                .unwrap_or("-");
            let uid = n.get("uid").and_then(Value::as_str).unwrap_or("");
            format!(
                "{}/{} <- {parent}{uid}",
                n["kind"].as_str().unwrap_or(""),
                n["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argocd_server_shows_the_tree_and_live_states_an_agent_reports() {
    let mut env = Env::new(&["cluster1"]).await;
    let server = Server::start(&env.hub, ServerOptions::default())
        .await
        .expect("argocd-server starts on the hub");
    let redis = server.redis().to_string();
    env.start_hub(&["--argocd-redis", &redis]).await;
    let token = server
        .login("admin", server.admin_password())
        .await
        .unwrap();

    let app = env.create("guestbook", 0, json!({})).await;
    let uid = app.metadata.uid.clone().unwrap();
    let ns = env.team.clone();

    // cluster1's agent, offering `trees`.
    let identity = testenv::pki::CertKey {
        cert_pem: std::fs::read_to_string(&env.spokes[0].certs.cert).unwrap(),
        key_pem: std::fs::read_to_string(&env.spokes[0].certs.key).unwrap(),
    };
    let mut first = hello(1, 1);
    if let Some(agent_message::Kind::Hello(h)) = &mut first.kind {
        h.capabilities.push(version::CAPABILITY_TREES.into());
    }
    let (tx, mut inbound, welcome) =
        grpc_client::open(&env.hub_address(), &env.ca.pem.cert_pem, &identity, first)
            .await
            .unwrap();
    let Some(hub_message::Kind::Welcome(welcome)) = welcome.kind else {
        panic!("no Welcome: {welcome:?}");
    };
    assert!(
        welcome
            .capabilities
            .iter()
            .any(|c| c == version::CAPABILITY_TREES),
        "a hub with --argocd-redis offers trees: {:?}",
        welcome.capabilities
    );
    let key = loop {
        let m = grpc_client::next(&mut inbound).await.unwrap();
        if let Some(hub_message::Kind::Upsert(u)) = m.kind {
            break u.key.unwrap();
        }
    };

    tx.send(tree(&uid, key.clone(), "guestbook-ui-5d-abc"))
        .await
        .unwrap();
    // argocd-server asked before the key is there waits for a refresh that
    // no controller makes: Redis is checked first.
    let redis = Redis::new(server.redis().to_string(), None);
    let instance = argocd_pull_core::status::tree::instance_name(&ns, "guestbook", "argocd");
    let tree_key = argocd_pull_core::status::tree::tree_key(&instance, true);
    wait::until("the tree in the hub's Redis", TIMEOUT, || async {
        match redis.get(&tree_key).await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let want = vec![
        "Deployment/guestbook-ui <- -".to_string(),
        "Pod/guestbook-ui-5d-abc <- ReplicaSet".to_string(),
        "ReplicaSet/guestbook-ui-5d <- Deployment".to_string(),
    ];
    wait::until("the reported tree in argocd-server", TIMEOUT, || async {
        wait::equal(
            nodes(&server, &token, "guestbook", &ns).await,
            Ok(want.clone()),
        )
    })
    .await;

    // The live state, as `argocd app manifests --source live` reads it.
    let (code, managed) = server
        .api(
            Method::GET,
            &format!("/api/v1/applications/guestbook/managed-resources?appNamespace={ns}"),
            Some(&token),
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, 200, "{managed}");
    let live: Value = serde_json::from_str(
        managed
            .pointer("/items/0/liveState")
            .and_then(Value::as_str)
            .unwrap_or("null"),
    )
    .unwrap();
    assert_eq!(live["spec"]["replicas"], 1, "{managed}");

    // A tree for another hub Application (an old uid) is refused; the next
    // one of the right uid replaces the first.
    tx.send(tree("some-older-uid", key.clone(), "forged"))
        .await
        .unwrap();
    tx.send(tree(&uid, key.clone(), "guestbook-ui-5d-def"))
        .await
        .unwrap();
    let want = vec![
        "Deployment/guestbook-ui <- -".to_string(),
        "Pod/guestbook-ui-5d-def <- ReplicaSet".to_string(),
        "ReplicaSet/guestbook-ui-5d <- Deployment".to_string(),
    ];
    wait::until("the second tree in argocd-server", TIMEOUT, || async {
        wait::equal(
            nodes(&server, &token, "guestbook", &ns).await,
            Ok(want.clone()),
        )
    })
    .await;
    env.assert_logged("refused a resource tree");
}

/// `argocd app diff <app>` against `server`: its exit code (0 no
/// difference, 1 a difference, anything else an error) and what it printed.
fn argocd_diff(server: &Server, token: &str, app: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(testenv::argocd::cli().unwrap())
        .args(["app", "diff", app, "--plaintext", "--server"])
        .arg(server.addr().to_string())
        .args(["--auth-token", token])
        .env("HOME", server.dir())
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// cluster1 with a real Argo CD in place of the environment's fake,
/// argocd-server on the hub, and a Git repository whose `app` folder holds
/// a ConfigMap (`settings`, `colour: teal`) and a Secret (`db`, password
/// `hunter2-on-cluster1`), for namespace `guestbook`.
async fn with_real_argocd() -> (Env, Spoke, GitServer, Server, testenv::argocd::Repo) {
    with_real_argocd_options(ServerOptions::default()).await
}

/// [`with_real_argocd`] with argocd-server started with `options`.
async fn with_real_argocd_options(
    options: ServerOptions,
) -> (Env, Spoke, GitServer, Server, testenv::argocd::Repo) {
    let env = Env::new(&["cluster1"]).await;
    let (cluster1, server) =
        tokio::join!(argocd_on_cluster1(&env), Server::start(&env.hub, options),);
    let (spoke, git, repo) = cluster1;
    let server = server.expect("argocd-server starts on the hub");
    (env, spoke, git, server, repo)
}

/// Argo CD on cluster1 (instead of the environment's stand-in), and a Git
/// server with the guestbook: a ConfigMap and a Secret.
async fn argocd_on_cluster1(env: &Env) -> (Spoke, GitServer, testenv::argocd::Repo) {
    env.spokes[0].argocd.stop();
    let (spoke, git) = tokio::join!(
        Spoke::start(&env.spokes[0].cluster, SpokeOptions::default()),
        GitServer::start(),
    );
    let (spoke, git) = (
        spoke.expect("Argo CD starts on cluster1"),
        git.expect("the Git server starts"),
    );
    env.spokes[0]
        .cluster
        .ensure_namespace("guestbook")
        .await
        .unwrap();
    let repo = git.create_repo("guestbook").unwrap();
    repo.commit(
        "a ConfigMap and a Secret",
        &[
            (
                "app/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  colour: teal\n",
            ),
            (
                "app/secret.yaml",
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter2-on-cluster1\n",
            ),
        ],
    )
    .unwrap();
    (spoke, git, repo)
}

/// cluster1's agent reading `spoke`'s Argo CD Redis, serving live views
/// when `live_views`; once connected.
async fn reading_agent(env: &mut Env, spoke: &Spoke, live_views: bool) {
    let hub = env.hub_address();
    let live = LiveArgs {
        views: live_views,
        terminal: false,
    };
    reading_agent_of(env, &hub, spoke, live).await;
}

/// [`reading_agent`] dialling the hub at `address`.
async fn reading_agent_of(env: &mut Env, address: &str, spoke: &Spoke, live: LiveArgs) {
    let mut config = env.agent_config(0, address, Mode::Managed);
    config.argocd_redis = Some(RedisConfig {
        addr: spoke.redis().to_string(),
        password: Password::None,
    });
    config.live = live;
    env.start_agent_with(0, config);
    env.wait_connected().await;
}

/// [`create_guestbook`] aimed at the cluster's own Secret, by name, as
/// ApplicationSets give it; the team's namespace, and `admin`'s session on
/// `server`.
async fn guestbook_by_name(
    env: &Env,
    repo: &testenv::argocd::Repo,
    server: &Server,
) -> (String, String) {
    let destination = json!({ "name": "cluster1", "namespace": "guestbook" });
    create_guestbook(env, repo, destination).await;
    let session = server
        .login("admin", server.admin_password())
        .await
        .unwrap();
    (env.team.clone(), session)
}

/// Starts the hub-controller writing trees into `server`'s Redis, with its
/// live endpoint on 127.0.0.1: the endpoint's token and address.
async fn live_hub(env: &mut Env, server: &Server) -> (String, std::net::SocketAddr) {
    let token = "live-token-of-this-test";
    let tokens = env.dir.path().join("live-tokens");
    std::fs::write(&tokens, format!("{token}\n")).unwrap();
    let live_addr = testenv::net::free_addr().unwrap();
    let live_url = format!("https://127.0.0.1:{}", live_addr.port());
    let ca_file = env.dir.path().join("ca.crt");
    env.start_hub(&[
        "--argocd-redis",
        &server.redis().to_string(),
        "--live-addr",
        &live_addr.to_string(),
        "--live-url",
        &live_url,
        "--live-token-file",
        tokens.to_str().unwrap(),
        "--live-ca-file",
        ca_file.to_str().unwrap(),
    ])
    .await;
    (token.to_string(), live_addr)
}

/// The pulled Application `guestbook` for cluster1 from `repo`, with the
/// hub copy's `destination`; synced once and not self-healing, so that a
/// change on the cluster stays, as a diff.
async fn create_guestbook(env: &Env, repo: &testenv::argocd::Repo, destination: Value) {
    env.create(
        "guestbook",
        0,
        json!({ "spec": {
            "project": "default",
            "source": { "repoURL": repo.url(), "path": "app", "targetRevision": "main" },
            "destination": destination,
            "syncPolicy": { "automated": { "prune": true } },
        }}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reports_what_its_argocd_cached_and_no_secret_value_leaves_the_cluster() {
    let (mut env, spoke, _git, server, repo) = with_real_argocd().await;

    env.start_hub(&["--argocd-redis", &server.redis().to_string()])
        .await;
    reading_agent(&mut env, &spoke, false).await;
    create_guestbook(
        &env,
        &repo,
        json!({ "server": "https://kubernetes.default.svc", "namespace": "guestbook" }),
    )
    .await;
    let ns = env.team.clone();
    let app = format!("{ns}/guestbook");
    let token = server
        .login("admin", server.admin_password())
        .await
        .unwrap();

    // The live states the cluster's Argo CD cached, through the hub: only
    // a reported tree carries them (the status has none).
    let live = wait::until("the live manifests through the hub", TIMEOUT, || async {
        let out = server
            .cli(&token, &["app", "manifests", &app, "--source", "live"])
            .map_err(|e| e.to_string())?;
        if out.contains("colour: teal") {
            Ok(out)
        } else {
            Err(out)
        }
    })
    .await;
    println!("$ argocd app manifests {app} --source live\n{live}");
    assert!(live.contains("name: db"), "{live}");
    assert!(!live.contains("hunter2"), "{live}");
    let resources = server.cli(&token, &["app", "resources", &app]).unwrap();
    println!("$ argocd app resources {app}\n{resources}");
    assert!(
        resources.contains("settings") && resources.contains("db"),
        "{resources}"
    );

    // What left the cluster: the hub's Redis holds the managed resources
    // without the Secret's value.
    let redis = Redis::new(server.redis().to_string(), None).with_max_reply(8 << 20);
    let instance = argocd_pull_core::status::tree::instance_name(&ns, "guestbook", "argocd");
    let gz = redis
        .get(&argocd_pull_core::status::tree::managed_resources_key(
            &instance, true,
        ))
        .await
        .unwrap()
        .expect("the managed resources in the hub's Redis");
    let mut stored = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut stored)
        .unwrap();
    assert!(stored.contains("teal"), "{stored}");
    assert!(!stored.contains("hunter2"), "{stored}");
    assert!(!stored.contains("aHVudGVyMi1vbi1jbHVzdGVyMQ"), "{stored}");
    assert!(stored.contains("++++++++"), "{stored}");

    // Changes one at a time, a second apart: every one shows through the
    // hub (the controller publishes before it writes the live states; an
    // agent that read only on the publish lost about one in ten).
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(env.spokes[0].client.clone(), "guestbook");
    for i in 1..=8 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let colour = format!("teal-{i}");
        cms.patch(
            "settings",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "data": { "colour": colour } })),
        )
        .await
        .unwrap();
        wait::until(&format!("change {i} through the hub"), TIMEOUT, || async {
            let out = server
                .cli(&token, &["app", "manifests", &app, "--source", "live"])
                .map_err(|e| e.to_string())?;
            if out.contains(&format!("colour: {colour}")) {
                Ok(())
            } else {
                Err(out)
            }
        })
        .await;
    }
    // Set back as Git has it: in sync again.
    cms.patch(
        "settings",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({ "data": { "colour": "teal" } })),
    )
    .await
    .unwrap();
    wait::until(
        "the ConfigMap back in sync through the hub",
        TIMEOUT,
        || async {
            match argocd_diff(&server, &token, &app) {
                (Some(0), _) => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;

    // In sync: `argocd app diff` through the hub finds nothing (exit 0).
    let (code, out) = argocd_diff(&server, &token, &app);
    assert_eq!(code, Some(0), "{out}");

    // A change on the cluster reaches the hub's view: the ConfigMap's data
    // changed behind Argo CD's back shows in the live state and the diff.
    let started = std::time::Instant::now();
    cms.patch(
        "settings",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({ "data": { "colour": "amber" } })),
    )
    .await
    .unwrap();
    let diff = wait::until(
        "the cluster's change in the hub's diff",
        TIMEOUT,
        || async {
            match argocd_diff(&server, &token, &app) {
                (Some(1), out) if out.contains("amber") => Ok(out),
                other => Err(other),
            }
        },
    )
    .await;
    println!(
        "a change on cluster1 showed in the hub's diff after {:?}\n$ argocd app diff {app}\n{diff}",
        started.elapsed()
    );
    assert!(diff.contains("teal"), "{diff}");
    let _ = spoke;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argocd_servers_live_views_read_the_cluster_through_its_agent_and_nothing_else() {
    use k8s_openapi::api::core::v1::{ConfigMap, Event};
    let (mut env, spoke, _git, server, repo) = with_real_argocd().await;
    let cluster1 = env.spokes[0].client.clone();

    // The hub-controller with its live endpoint; the cluster Secret it
    // writes points argocd-server there.
    let (token, live_addr) = live_hub(&mut env, &server).await;
    let (token, live_url) = (token.as_str(), format!("https://{live_addr}"));
    let ca_file = env.dir.path().join("ca.crt");
    reading_agent(&mut env, &spoke, true).await;
    let (ns, session) = guestbook_by_name(&env, &repo, &server).await;
    let resource = |kind: &str, name: &str| {
        format!(
            "/api/v1/applications/guestbook/resource?appNamespace={ns}&namespace=guestbook&resourceName={name}&version=v1&kind={kind}&group="
        )
    };

    // What argocd-server answers `token` at `path`.
    let read = async |token: &str, path: &str| {
        server
            .api(Method::GET, path, Some(token), None)
            .await
            .unwrap()
    };

    // The LIVE MANIFEST tab: argocd-server reads the cluster through the
    // cluster Secret, the live endpoint and the agent.
    let manifest = wait::until("the live manifest through the hub", TIMEOUT, || async {
        match server
            .api(
                Method::GET,
                &resource("ConfigMap", "settings"),
                Some(&session),
                None,
            )
            .await
        {
            Ok((200, body)) => Ok(body["manifest"].as_str().unwrap_or("").to_string()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let live: Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(live["data"]["colour"], "teal", "{manifest}");
    assert!(live["metadata"]["uid"].is_string(), "{manifest}");

    // A change on the cluster is what the next read shows (read, not cached).
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(cluster1.clone(), "guestbook");
    cms.patch(
        "settings",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({ "data": { "colour": "amber" } })),
    )
    .await
    .unwrap();
    let (code, body) = read(&session, &resource("ConfigMap", "settings")).await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body["manifest"].as_str().unwrap().contains("amber"),
        "{body}"
    );
    // ... while the discovery argocd-server asks before each read came
    // from the hub's memory the second time (the object never does).
    let metrics = env.hub_process.as_ref().unwrap().metrics().await;
    let reads = |answer: &str| {
        grpc_env::series::value(
            &metrics,
            &format!("argocd_pull_hub_grpc_live_reads_total{{answer=\"{answer}\"}}"),
        )
    };
    assert!(reads("cache") >= 1.0, "{metrics}");
    assert!(reads("cluster") >= 2.0, "{metrics}");

    // Its events, as the UI's EVENTS tab reads them.
    let uid = live["metadata"]["uid"].as_str().unwrap().to_string();
    let events: kube::Api<Event> = kube::Api::namespaced(cluster1.clone(), "guestbook");
    events
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "settings.1", "namespace": "guestbook" },
                "involvedObject": { "apiVersion": "v1", "kind": "ConfigMap", "namespace": "guestbook",
                                    "name": "settings", "uid": uid },
                "reason": "Checked", "message": "seen by the test on cluster1", "type": "Normal",
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let (code, body) = read(&session, &format!(
                "/api/v1/applications/guestbook/events?appNamespace={ns}&resourceNamespace=guestbook&resourceName=settings&resourceUID={uid}"
            )).await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.to_string().contains("seen by the test on cluster1"),
        "{body}"
    );

    // A tenant whose Argo CD rights are on another project's Applications
    // sees nothing of this one's cluster: argocd-server refuses before it
    // asks.
    testenv::argocd::add_local_account(
        &env.hub,
        "tenant-b",
        "tenant-b-password",
        "p, role:team-b, applications, get, team-b/*, allow\n\
         p, role:team-b, logs, get, team-b/*, allow\n\
         g, tenant-b, role:team-b\n",
    )
    .await
    .unwrap();
    let tenant = wait::until("the tenant logs in", TIMEOUT, || async {
        server
            .login("tenant-b", "tenant-b-password")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    for path in [
        resource("ConfigMap", "settings"),
        format!(
            "/api/v1/applications/guestbook/events?appNamespace={ns}&resourceNamespace=guestbook&resourceName=settings&resourceUID={uid}"
        ),
    ] {
        let (code, body) = read(&tenant, &path).await;
        assert_eq!(code, 403, "{path}: {body}");
    }

    // Straight at the live endpoint, as only argocd-server may call it;
    // while a client that connected first says nothing: it holds its own
    // handshake (10 s), not the endpoint's, so it is still open when the
    // read is answered.
    let silent = std::net::TcpStream::connect(live_addr).unwrap();
    let ca_pem = std::fs::read_to_string(&ca_file).unwrap();
    let endpoint = live_client(&format!("{live_url}/clusters/cluster1"), &ca_pem, token);
    let live_cms: kube::Api<ConfigMap> = kube::Api::namespaced(endpoint.clone(), "guestbook");
    assert_eq!(
        live_cms.get("settings").await.unwrap().data.unwrap()["colour"],
        "amber"
    );
    silent.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let still_open = matches!(
        std::io::Read::read(&mut &silent, &mut byte),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
    );
    assert!(
        still_open,
        "the silent connection was closed before the read was answered"
    );
    drop(silent);
    // A Secret leaves the cluster without its values.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(endpoint.clone(), "guestbook");
    let db = serde_json::to_string(&secrets.get("db").await.unwrap()).unwrap();
    assert!(!db.contains("aHVudGVy") && !db.contains("hunter2"), "{db}");
    assert!(db.contains("++++++++"), "{db}");
    // What a managed resource owns is served (the owner references are
    // followed on the cluster, as from a Pod to its Deployment).
    cms.create(
        &Default::default(),
        &serde_json::from_value(json!({ "metadata": { "name": "settings-child",
            "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "settings", "uid": uid }] },
            "data": { "k": "v" } }))
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        live_cms.get("settings-child").await.unwrap().data.unwrap()["k"],
        "v"
    );
    // An object of no pulled Application: refused by the agent.
    cms.create(
        &Default::default(),
        &serde_json::from_value(
            json!({ "metadata": { "name": "not-pulled" }, "data": { "k": "v" } }),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let (code, message) = refused(live_cms.get("not-pulled").await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("belongs to no Application argocd-pull applied on cluster1"),
        "{message}"
    );
    // ... and by argocd-server, which finds it in no tree.
    let (code, body) = read(&session, &resource("ConfigMap", "not-pulled")).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.to_string()
            .contains("not-pulled not found as part of application"),
        "{body}"
    );
    // Writes, lists and watches are refused before they reach the cluster.
    let (code, message) = refused(
        live_cms
            .patch(
                "settings",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({ "data": { "colour": "written" } })),
            )
            .await,
    );
    assert_eq!(code, 405, "{message}");
    let (code, message) = refused(live_cms.list(&Default::default()).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("reads only"), "{message}");
    assert_eq!(
        cms.get("settings").await.unwrap().data.unwrap()["colour"],
        "amber"
    );
    // The wrong token, and a cluster with no agent here.
    let stranger = live_client(&format!("{live_url}/clusters/cluster1"), &ca_pem, "guessed");
    let (code, _) = refused(
        kube::Api::<ConfigMap>::namespaced(stranger, "guestbook")
            .get("settings")
            .await,
    );
    assert_eq!(code, 401);
    let elsewhere = live_client(&format!("{live_url}/clusters/cluster9"), &ca_pem, token);
    let (code, message) = refused(
        kube::Api::<ConfigMap>::namespaced(elsewhere, "guestbook")
            .get("settings")
            .await,
    );
    assert_eq!(code, 501, "{message}");
    assert!(message.contains("need the gRPC transport"), "{message}");
    println!("a cluster without an agent here: {message}");
    let _ = spoke;
}

/// With several replicas, argocd-server's read reaches any of them (its
/// Service balances), while the cluster's agent is connected to one: a
/// replica the agent is not on forwards the read to the one it is on (its
/// presence Lease says where), and the answer, refusals and answers of
/// several chunks included, comes back as that one gave it. A read that
/// was forwarded already is not forwarded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_read_reaching_a_replica_the_agent_is_not_on_is_forwarded_to_the_one_it_is() {
    use grpc_env::replicas::Replica;
    use k8s_openapi::api::core::v1::ConfigMap;
    let mut env = Env::new(&["cluster1"]).await;
    env.hub.ensure_namespace("argocd").await.unwrap();
    let (spoke, _git, repo) = argocd_on_cluster1(&env).await;
    let token = "live-token-of-the-replicas";
    std::fs::write(env.dir.path().join("live-tokens"), format!("{token}\n")).unwrap();
    let mut replicas: Vec<(Replica, String)> = Vec::new();
    let late_ca = env.dir.path().join("late").join("ca.crt");
    std::fs::create_dir_all(late_ca.parent().unwrap()).unwrap();
    for name in ["hub-0", "hub-1"] {
        // hub-0, which the agent dials, listens on the IPv6 loopback and
        // names itself by its IP alone, as the chart does with a pod's IP
        // (v4 or v6): hub-1 forwards to `[::1]:<port of --live-addr>`.
        let (addr, peer) = if name == "hub-0" {
            (testenv::net::free_addr_v6().unwrap(), "::1".to_string())
        } else {
            let addr = testenv::net::free_addr().unwrap();
            (addr, addr.to_string())
        };
        let url = format!("https://{addr}");
        let mut flags = grpc_env::live::flags(&env, addr, &url, &peer);
        if name == "hub-1" {
            // As at a first install, where the CA's Secret is mounted a
            // minute after the hub-controller created it: hub-1 starts
            // and serves without it, and forwards once it is there.
            for flag in flags.iter_mut() {
                if flag.starts_with("--live-ca-file=") {
                    *flag = format!("--live-ca-file={}", late_ca.display());
                }
            }
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        replicas.push((env.start_replica(name, &flags).await, url));
    }
    std::fs::copy(env.dir.path().join("ca.crt"), &late_ca).unwrap();
    // The agent dials hub-0 only.
    let on = format!("https://{}", replicas[0].0.grpc);
    let live = LiveArgs {
        views: true,
        terminal: false,
    };
    reading_agent_of(&mut env, &on, &spoke, live).await;
    wait::until("cluster1's agent on hub-0", TIMEOUT, || async {
        if replicas[0].0.agents().await == ["cluster1"] {
            Ok(())
        } else {
            Err(format!("hub-0 serves {:?}", replicas[0].0.agents().await))
        }
    })
    .await;
    create_guestbook(
        &env,
        &repo,
        json!({ "name": "cluster1", "namespace": "guestbook" }),
    )
    .await;
    let ca_pem = std::fs::read_to_string(env.dir.path().join("ca.crt")).unwrap();
    let through = |i: usize| {
        let endpoint = live_client(
            &format!("{}/clusters/cluster1", replicas[i].1),
            &ca_pem,
            token,
        );
        kube::Api::<ConfigMap>::namespaced(endpoint, "guestbook")
    };

    // Through hub-1, which has no agent of cluster1: forwarded to hub-0.
    let settings = wait::until("the ConfigMap through hub-1", TIMEOUT, || async {
        through(1).get("settings").await.map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(settings.data.as_ref().unwrap()["colour"], "teal");
    // An answer of several chunks (256 KiB each on the agent's stream)
    // streams through both replicas whole: a ConfigMap the managed one
    // owns, of 600 KB.
    let cluster1 = env.spokes[0].client.clone();
    let large = "x".repeat(600_000);
    kube::Api::<ConfigMap>::namespaced(cluster1.clone(), "guestbook")
        .create(
            &Default::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "settings-large",
                "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "settings",
                                      "uid": settings.metadata.uid.clone().unwrap() }] },
                "data": { "large": large } }))
            .unwrap(),
        )
        .await
        .unwrap();
    let got = through(1).get("settings-large").await.unwrap();
    assert_eq!(got.data.unwrap()["large"], large);
    let reads = async |i: usize, answer: &str| {
        let metrics = replicas[i].0.process.metrics().await;
        grpc_env::series::value(
            &metrics,
            &format!("argocd_pull_hub_grpc_live_reads_total{{answer=\"{answer}\"}}"),
        )
    };
    assert!(reads(1, "forwarded").await >= 1.0);
    assert_eq!(reads(1, "cluster").await, 0.0, "hub-1 asked no agent");
    assert!(reads(0, "cluster").await >= 1.0, "hub-0 asked its agent");
    assert_eq!(reads(0, "forwarded").await, 0.0);
    // The agent's refusal comes back as it gave it.
    kube::Api::<ConfigMap>::namespaced(cluster1, "guestbook")
        .create(
            &Default::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "not-pulled" } })).unwrap(),
        )
        .await
        .unwrap();
    let (code, message) = refused(through(1).get("not-pulled").await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("belongs to no Application argocd-pull applied on cluster1"),
        "{message}"
    );
    // The wrong token is refused by hub-1 itself, before any forwarding.
    let forwarded = reads(1, "forwarded").await;
    let stranger = live_client(
        &format!("{}/clusters/cluster1", replicas[1].1),
        &ca_pem,
        "guessed",
    );
    let (code, _) = refused(
        kube::Api::<ConfigMap>::namespaced(stranger, "guestbook")
            .get("settings")
            .await,
    );
    assert_eq!(code, 401);
    assert_eq!(reads(1, "forwarded").await, forwarded);
    // A read already forwarded once is not forwarded again: hub-1 answers
    // it itself, and hub-0 is not asked.
    let asked = reads(0, "cluster").await;
    let request = http::Request::get("/api/v1/namespaces/guestbook/configmaps/settings")
        .header("x-argocd-pull-forwarded-by", "hub-0")
        .body(Vec::new())
        .unwrap();
    let endpoint = live_client(
        &format!("{}/clusters/cluster1", replicas[1].1),
        &ca_pem,
        token,
    );
    let started = std::time::Instant::now();
    let (code, message) = refused(endpoint.request_text(request).await);
    println!(
        "a read forwarded twice, refused in {:?}: {message}",
        started.elapsed()
    );
    assert_eq!(code, 503, "{message}");
    assert!(
        message.contains("moving between hub-controller replicas"),
        "{message}"
    );
    assert_eq!(reads(0, "cluster").await, asked);
    let _ = spoke;
}

/// A pod of the harness's ticker image, for the web terminal.
const TICKER_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: ticker
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: ticker
      image: argocd-pull-ticker:VERSION
      imagePullPolicy: Never
      args: ["guestbook"]
      securityContext:
        runAsNonRoot: true
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
"#;

/// argocd-server's web terminal (`/terminal`, `exec.enabled`, as `admin`)
/// on a pod Argo CD applied on cluster1, which runs on a real kubelet:
/// argocd-server finds the pod in the tree the agent reported, reads it
/// and execs into it through the live endpoint and the agent
/// (`--terminal`). The harness builds no shell image: the "shell" is the
/// ticker (`exec.shells`), whose lines come back as the terminal's output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argocd_servers_web_terminal_opens_in_a_pod_through_the_hub_and_the_agent() {
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let options = ServerOptions {
        settings: vec![
            ("exec.enabled".into(), "true".into()),
            ("exec.shells".into(), "/usr/local/bin/ticker".into()),
        ],
        ..Default::default()
    };
    let (mut env, spoke, _git, server, repo) = with_real_argocd_options(options).await;
    let testenv = testenv::paths::own_binary("testenv").expect("the harness's binary");
    let mut node = testenv::node::Node::start("terminal-argocd")
        .await
        .expect("containerd starts");
    node.join(&env.spokes[0].cluster, &testenv)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = TICKER_POD.replace("VERSION", env!("CARGO_PKG_VERSION"));
    repo.commit("a pod", &[("app/pod.yaml", pod.as_str())])
        .unwrap();
    live_hub(&mut env, &server).await;
    let live = LiveArgs {
        views: true,
        terminal: true,
    };
    let hub = env.hub_address();
    reading_agent_of(&mut env, &hub, &spoke, live).await;
    let (ns, session) = guestbook_by_name(&env, &repo, &server).await;
    wait::until(
        "the pod in the hub's tree, with its uid",
        TIMEOUT,
        || async {
            let nodes = server.tree_nodes(&session, &ns, "guestbook").await?;
            let pod = nodes
                .iter()
                .find(|n| n["kind"] == "Pod" && n["name"] == "ticker");
            match pod {
                Some(p) if p["uid"].as_str().is_some_and(|u| !u.is_empty()) => Ok(()),
                _ => Err(format!("{nodes:?}")),
            }
        },
    )
    .await;

    let path = format!(
        "/terminal?pod=ticker&container=ticker&appName=guestbook&projectName=default&namespace=guestbook&appNamespace={ns}"
    );
    let output = wait::until("the terminal's output", TIMEOUT, || async {
        let mut request = format!("ws://{}{path}", server.addr())
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("cookie", format!("argocd.token={session}").parse().unwrap());
        let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(request, tcp)
            .await
            .map_err(|e| format!("the terminal: {e}"))?;
        let mut output = String::new();
        while let Ok(Some(Ok(m))) = tokio::time::timeout(TIMEOUT, ws.next()).await {
            let text = m.into_text().map_err(|e| e.to_string())?;
            let Ok(m) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            output.push_str(m["data"].as_str().unwrap_or(""));
            if output.contains("tick 1") {
                return Ok(output);
            }
        }
        Err(format!("the terminal ended with {output:?}"))
    })
    .await;
    println!("argocd-server's terminal through the hub:\n{output}");
    env.assert_logged("a web terminal opened in pod guestbook/ticker container ticker");

    // A user who may read the Application but not exec into it:
    // argocd-server refuses before it asks the cluster.
    let policy = "p, viewer, applications, get, *, allow\n";
    testenv::argocd::add_local_account(&env.hub, "viewer", "viewer-password", policy)
        .await
        .unwrap();
    let refusal = wait::until("argocd-server's refusal of the viewer", TIMEOUT, || async {
        let viewer = server
            .login("viewer", "viewer-password")
            .await
            .map_err(|e| e.to_string())?;
        let mut request = format!("ws://{}{path}", server.addr())
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("cookie", format!("argocd.token={viewer}").parse().unwrap());
        let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        match tokio_tungstenite::client_async(request, tcp).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                let body = r.body().clone().unwrap_or_default();
                Ok((
                    r.status().as_u16(),
                    String::from_utf8_lossy(&body).into_owned(),
                ))
            }
            other => Err(format!("not refused: {:?}", other.map(|_| ()))),
        }
    })
    .await;
    assert_eq!(refusal.0, 401, "{}", refusal.1);
    assert!(
        refusal.1.contains("permission denied: exec, create"),
        "{}",
        refusal.1
    );
    terminal_in_the_ui(&env, &server, &ns).await;
    drop(node);
}

/// The pod's TERMINAL tab in argocd-server's UI (headless Chromium, as
/// `admin`): the hub opens one more session for it; a picture of it in
/// docs/img with `ARGOCD_PULL_SCREENSHOTS`.
async fn terminal_in_the_ui(env: &Env, server: &Server, ns: &str) {
    if let Some(why) = testenv::paths::argocd_ui_not_built() {
        testenv::paths::not_run("the web terminal in the hub's UI", &why);
        return;
    }
    let opened = "a web terminal opened in pod guestbook/ticker container ticker";
    let before = env.hub_log().matches(opened).count();
    let browser = testenv::browser::Browser::start(1440, 900)
        .await
        .expect("chromium starts");
    let mut page = browser.page().await.unwrap();
    server
        .ui_login(&mut page, TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let node = "%2FPod%2Fguestbook%2Fticker%2F0";
    page.navigate(&format!(
        "{}/applications/{ns}/guestbook?node={node}&tab=exec",
        server.url()
    ))
    .await
    .unwrap();
    server
        .ui_wait_for(
            &mut page,
            "the pod's TERMINAL tab",
            "(() => document.querySelector('.xterm') !== null)()",
            TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait::until("the UI's session at the hub", TIMEOUT, || async {
        let now = env.hub_log().matches(opened).count();
        if now > before { Ok(()) } else { Err(now) }
    })
    .await;
    // The ticker writes a line a second: let a few show before the picture.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    page.screenshot(&browser.dir().join("hub-ui-terminal.png"))
        .await
        .unwrap();
    if std::env::var_os("ARGOCD_PULL_SCREENSHOTS").is_some() {
        let docs = testenv::paths::workspace_dir().join("docs/img/hub-ui-terminal.png");
        page.screenshot(&docs).await.unwrap();
        eprintln!("screenshot: {}", docs.display());
    }
}
