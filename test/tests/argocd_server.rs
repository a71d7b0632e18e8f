//! The harness's Argo CD API server and UI (`testenv::argocd::Server`, what
//! `make demo` runs on the hub): a wrong password is refused, the local
//! admin logs in through the REST API, the `argocd` CLI and the real UI
//! (built from the pinned module's `ui/` sources, in headless Chromium),
//! and each lists an Application hub copy.
//!
//! The hub copy here is written by the test: this checks the server and
//! its UI, not delivery. The end-to-end test (`e2e.rs`, phase "the hub's
//! Argo CD") opens Applications that real clusters reported, in the same
//! UI, and takes the screenshot in docs/.

use std::time::Duration;

use argocd_pull_apis::argocd::application_resource;
use http::Method;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::CrdSet;
use testenv::argocd::{NAMESPACE, Server, ServerOptions};
use testenv::browser::Browser;

const APP: &str = "guestbook-cluster1";
const UI_TIMEOUT: Duration = Duration::from_secs(60);

/// The hub copy of a pulled Application, as `example/` makes it, with the
/// status cluster1 reported.
async fn pulled_application(client: &kube::Client) {
    let apps =
        Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &application_resource());
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {
            "name": APP, "namespace": NAMESPACE,
            "labels": { "apps.open-cluster-management.io/pull-to-ocm-managed-cluster": "true" },
            "annotations": {
                "apps.open-cluster-management.io/ocm-managed-cluster": "cluster1",
                "argocd.argoproj.io/skip-reconcile": "true",
            },
        },
        "spec": {
            "project": "default",
            "source": { "repoURL": "git://127.0.0.1:9418/guestbook.git", "targetRevision": "main", "path": "guestbook" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" },
            "syncPolicy": { "automated": {} },
        },
    }))
    .expect("a valid Application");
    apps.create(&PostParams::default(), &app)
        .await
        .expect("the hub copy is created");
    // Argo CD's Application has no status subresource: the status is part
    // of the object, as the hub-controller writes it.
    let status = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "status": {
            "sync": { "status": "Synced", "revision": "4b825dc642cb6eb9a060e54bf8d69288fbee4904" },
            "health": { "status": "Healthy" },
            "resources": [
                { "version": "v1", "kind": "Service", "namespace": "guestbook", "name": "guestbook-ui",
                  "status": "Synced", "health": { "status": "Healthy" } },
                { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "guestbook",
                  "name": "guestbook-ui", "status": "Synced", "health": { "status": "Healthy" } },
            ],
            "sourceType": "Directory",
        },
    });
    apps.patch(
        APP,
        // The test's own field manager: this copy stands in for one the
        // hub-controller delivered (e2e's "the hub's Argo CD" phase checks
        // a really delivered one, on the UI too).
        &PatchParams::apply("argocd-pull-test").force(),
        &Patch::Apply(&status),
    )
    .await
    .expect("the status is written");
}

fn at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_ui_shows_a_pulled_application() {
    testenv::init_tracing();
    let hub = testenv::shared("hub-ui", CrdSet::Hub)
        .await
        .expect("the hub starts");
    let client = hub.client().await.unwrap();
    let server = Server::start(hub, ServerOptions::default())
        .await
        .expect("argocd-server starts on the hub");
    pulled_application(&client).await;

    // The API: a wrong password is refused, the right one gives a session.
    let wrong = server.login("admin", "not-the-password").await;
    assert!(wrong.is_err(), "a wrong password logs in: {wrong:?}");
    let token = server
        .login("admin", server.admin_password())
        .await
        .expect("the admin logs in");
    let (code, _) = server
        .api(Method::GET, "/api/v1/applications", None, None)
        .await
        .unwrap();
    assert_eq!(code, 401, "the Applications are listed without a session");
    // argocd-server lists from its informer's cache, which sees the
    // Application a moment after the API server stored it: wait for it
    // there, with the status the cluster reported.
    let app = testenv::wait::until(
        &format!("{APP} Synced and Healthy in GET /api/v1/applications"),
        UI_TIMEOUT,
        || async {
            let (code, list) = server
                .api(Method::GET, "/api/v1/applications", Some(&token), None)
                .await
                .map_err(|e| e.to_string())?;
            if code != 200 {
                return Err(format!("{code}: {list}"));
            }
            let app = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| at(a, "/metadata/name") == APP)
                .cloned()
                .ok_or_else(|| format!("{APP} is not among the listed Applications: {list}"))?;
            if at(&app, "/status/sync/status") == "Synced"
                && at(&app, "/status/health/status") == "Healthy"
            {
                Ok(app)
            } else {
                Err(format!("not yet Synced and Healthy: {app}"))
            }
        },
    )
    .await;
    assert_eq!(at(&app, "/metadata/namespace"), NAMESPACE, "{app}");

    // The CLI, as a user runs it against this server.
    let got = server.app_get(&token, APP).expect("argocd app get");
    assert_eq!(at(&got, "/status/health/status"), "Healthy", "{got}");

    // The UI: its login page, then the Applications list.
    let browser = Browser::start(1440, 900).await.expect("chromium starts");
    let mut page = browser.page().await.unwrap();
    server.ui_login(&mut page, UI_TIMEOUT).await.unwrap();
    let in_list = format!("document.body.innerText.includes({APP:?})");
    server
        .ui_wait_for(
            &mut page,
            "the Application in the list",
            &in_list,
            UI_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}
