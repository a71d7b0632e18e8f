//! The resource trees of pulled Applications in the hub's Argo CD: the
//! hub-controller binary with `--argocd-redis` writes each hub copy's tree,
//! from its status, into the Redis of a real argocd-server, which then
//! answers `argocd app resources` and the API's `resource-tree` (without
//! it: "cache: key is missing" and a refresh on every view). A change of
//! the status reaches the tree; a deleted hub copy leaves no key behind;
//! the tree opens no live read of the hub's own objects.

use std::time::Duration;

use argocd_pull_core::status::tree;
use argocd_pull_runtime::redis::Redis;
use http::Method;
use kube::api::DeleteParams;
use serde_json::Value;
use testenv::argocd::{self, NAMESPACE, Server, ServerOptions};
use testenv::{CrdSet, net, wait};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The tree argocd-server answers for `app`: its nodes as `kind/name
/// health`, sorted; the error text when it has none.
async fn tree_nodes(server: &Server, token: &str, app: &str) -> Result<Vec<String>, String> {
    let mut nodes: Vec<String> = server
        .tree_nodes(token, NAMESPACE, app)
        .await?
        .iter()
        .map(|n| {
            let text = |p: &str| n.pointer(p).and_then(Value::as_str).unwrap_or("");
            format!(
                "{}/{} {}",
                text("/kind"),
                text("/name"),
                text("/health/status")
            )
        })
        .collect();
    nodes.sort();
    Ok(nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argocd_server_shows_the_tree_the_hub_controller_writes_from_the_status() {
    testenv::init_tracing();
    let hub = testenv::shared("hub-trees", CrdSet::Hub)
        .await
        .expect("the hub starts");
    hub.ensure_namespace("argocd-pull").await.unwrap();
    let client = hub.client().await.unwrap();
    let server = Server::start(hub, ServerOptions::default())
        .await
        .expect("argocd-server starts on the hub");
    let token = server
        .login("admin", server.admin_password())
        .await
        .expect("the admin logs in");

    // Before the hub-controller runs, argocd-server's Redis has no tree.
    // (Asked for one then, argocd-server would ask for a refresh and wait
    // for it: the key is checked in Redis instead, and argocd-server is
    // asked only once it is there.)
    let redis = Redis::new(server.redis().to_string(), None);
    let key = |app: &str| tree::tree_key(&tree::instance_name(NAMESPACE, app, NAMESPACE), true);
    let written = |app: &'static str| {
        let (redis, key) = (&redis, key(app));
        async move {
            wait::until(&format!("{app}'s tree in Redis"), TIMEOUT, || async {
                match redis.get(&key).await {
                    Ok(Some(_)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await
        }
    };
    argocd::pulled_application(&client, "early", argocd::guestbook_status("Healthy"))
        .await
        .unwrap();
    assert_eq!(redis.get(&key("early")).await.unwrap(), None);

    let admin = net::free_addr().unwrap();
    let mut controller = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-controller"))
        .arg("--kubeconfig")
        .arg(hub.kubeconfig())
        .arg("--admin-addr")
        .arg(admin.to_string())
        .arg("--leader-elect=false")
        .arg("--argocd-redis")
        .arg(server.redis().to_string())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // Ready once every watch has listed (as an operator's probe sees it).
    wait::until("/readyz to answer ok", TIMEOUT, || async {
        match net::http_get(admin, "/readyz").await {
            Ok((200, body)) if body == "ok" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // A copy there before the start, and one created after it.
    let want = vec![
        "Deployment/guestbook-ui Healthy".to_string(),
        "Service/guestbook-ui Healthy".to_string(),
    ];
    argocd::pulled_application(&client, "later", argocd::guestbook_status("Healthy"))
        .await
        .unwrap();
    for app in ["early", "later"] {
        written(app).await;
        wait::until(
            &format!("argocd-server to show {app}'s tree"),
            TIMEOUT,
            || async { wait::equal(tree_nodes(&server, &token, app).await?, want.clone()) },
        )
        .await;
    }
    // As a user sees it with the CLI.
    let listed = server
        .cli(&token, &["app", "resources", &format!("{NAMESPACE}/later")])
        .expect("argocd app resources");
    for line in ["Service", "Deployment", "guestbook-ui"] {
        assert!(listed.contains(line), "{line} missing from:\n{listed}");
    }

    // The tree opens no live view onto the hub: the hub copy's destination
    // is the hub's own cluster (`https://kubernetes.default.svc`, as
    // upstream's examples write it), where argocd-server would read with
    // its own service account, and the tree's names come from the
    // cluster's report. argocd-server must refuse at the tree (its nodes
    // carry no uid), before it builds a client for the destination (with
    // a uid it goes on to the destination's config: shown failing so).
    let (code, answer) = server
        .api(
            Method::GET,
            &format!(
                "/api/v1/applications/later/resource?appNamespace={NAMESPACE}&namespace=guestbook\
                 &resourceName=guestbook-ui&version=v1&kind=Service&group="
            ),
            Some(&token),
            None,
        )
        .await
        .unwrap();
    assert!(
        code != 200
            && answer
                .to_string()
                .contains("not found as part of application"),
        "argocd-server answered a live read of a tree node from the hub itself: {code} {answer}"
    );

    // A change of the status on the hub copy reaches the tree.
    argocd::set_status(&client, "later", argocd::guestbook_status("Degraded"))
        .await
        .unwrap();
    wait::until(
        "the tree to show the Deployment Degraded",
        TIMEOUT,
        || async {
            wait::equal(
                tree_nodes(&server, &token, "later").await?,
                vec![
                    "Deployment/guestbook-ui Degraded".to_string(),
                    "Service/guestbook-ui Healthy".to_string(),
                ],
            )
        },
    )
    .await;

    // A deleted hub copy leaves no key in argocd-server's Redis; the other
    // copy's stays.
    argocd::applications(&client)
        .delete("later", &DeleteParams::default())
        .await
        .unwrap();
    wait::until("the deleted copy's tree to go", TIMEOUT, || async {
        match redis.get(&key("later")).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(redis.get(&key("early")).await.unwrap().is_some());

    let status = net::terminate(&mut controller, Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test]
async fn an_unreadable_redis_password_file_stops_the_start_with_a_clear_message() {
    let out = net::run_unreachable(
        env!("CARGO_BIN_EXE_hub-controller"),
        &[
            "--argocd-redis",
            "127.0.0.1:6379",
            "--argocd-redis-password-file",
            "/nonexistent/argocd-redis/auth",
        ],
    )
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--argocd-redis-password-file /nonexistent/argocd-redis/auth"),
        "{stderr}"
    );
}
