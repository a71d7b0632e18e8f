//! The hub's Argo CD API server and UI (`testenv::argocd::Server`, what
//! `make demo` runs on the hub) show a pulled Application's hub copy with
//! the status its cluster reported: through the REST API after a login as
//! the local admin, through the `argocd` CLI, and on the real UI (built from
//! the pinned module's `ui/` sources) in headless Chromium, which logs in on
//! the login page and opens the Application.
//!
//! The hub copy here carries the status as the hub-controller writes it;
//! the end-to-end test (`e2e.rs`) checks the same on Applications that a
//! real cluster reported. The screenshot goes to the test's folder, and to
//! `docs/img/hub-ui-app.png` with `ARGOCD_PULL_SCREENSHOTS=1`.

use std::time::Duration;

use argocd_pull_apis::argocd::application_resource;
use http::Method;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::argocd::{self, NAMESPACE, Server, ServerOptions};
use testenv::browser::Browser;
use testenv::{CrdSet, paths};

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
        &PatchParams::apply("argocd-pull-hub-controller").force(),
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
    let (code, list) = server
        .api(Method::GET, "/api/v1/applications", Some(&token), None)
        .await
        .unwrap();
    assert_eq!(code, 200, "{list}");
    let app = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| at(a, "/metadata/name") == APP)
        .unwrap_or_else(|| panic!("{APP} is not among the listed Applications: {list}"));
    assert_eq!(at(app, "/status/sync/status"), "Synced", "{app}");
    assert_eq!(at(app, "/status/health/status"), "Healthy", "{app}");

    // The CLI, as a user runs it against this server.
    let out = std::process::Command::new(argocd::cli().unwrap())
        .args(["app", "get", APP, "-o", "json", "--plaintext"])
        .args([
            "--server",
            &server.addr().to_string(),
            "--auth-token",
            &token,
        ])
        .env("HOME", server.dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "argocd app get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(at(&got, "/status/health/status"), "Healthy", "{got}");

    // The UI, as a person uses it: the login page, then the Application.
    let browser = Browser::start(1440, 900).await.expect("chromium starts");
    let mut page = browser.page().await.unwrap();
    page.navigate(&format!("{}/login", server.url()))
        .await
        .unwrap();
    page.wait_for(
        "the login page",
        "document.querySelector('input[name=username]') !== null",
        UI_TIMEOUT,
    )
    .await
    .unwrap();
    page.type_into("input[name=username]", "admin")
        .await
        .unwrap();
    page.type_into("input[name=password]", server.admin_password())
        .await
        .unwrap();
    page.click("button[type=submit]").await.unwrap();
    page.wait_for(
        "the Applications list after the login",
        &format!("document.body.innerText.includes({APP:?}) && location.pathname.startsWith('/applications')"),
        UI_TIMEOUT,
    )
    .await
    .unwrap();
    page.navigate(&format!("{}/applications/{NAMESPACE}/{APP}", server.url()))
        .await
        .unwrap();
    let text = page
        .wait_for(
            "the Application's page with its health and sync status",
            "(() => { const t = document.body.innerText; \
               return t.includes('APP HEALTH') && t.includes('Healthy') && t.includes('Synced') ? t : ''; })()",
            UI_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nargocd-server: {}", server.log_tail("argocd-server", 20)));
    let text = text.as_str().unwrap_or_default();
    assert!(text.contains(APP), "the page does not name {APP}:\n{text}");
    // The tree's nodes: the managed resources from the status the cluster
    // reported (argocd-server has no live tree for it; the UI draws these).
    page.wait_for(
        "the tree's nodes: the guestbook's Service and Deployment",
        "(() => { const t = document.body.innerText; \
           return t.includes('guestbook-ui') && t.includes('svc') && t.includes('deploy'); })()",
        UI_TIMEOUT,
    )
    .await
    .unwrap();
    // Let the page settle (fonts, icons) before the picture.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let shot = browser.dir().join("hub-ui-app.png");
    page.screenshot(&shot).await.unwrap();
    if std::env::var_os("ARGOCD_PULL_SCREENSHOTS").is_some() {
        let docs = paths::workspace_dir().join("docs/img/hub-ui-app.png");
        page.screenshot(&docs).await.unwrap();
        eprintln!("screenshot: {}", docs.display());
    }
}
