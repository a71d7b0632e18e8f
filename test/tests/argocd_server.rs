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

use http::Method;
use serde_json::Value;
use testenv::CrdSet;
use testenv::argocd::{self, NAMESPACE, Server, ServerOptions};
use testenv::browser::Browser;

const APP: &str = "guestbook-cluster1";
const UI_TIMEOUT: Duration = Duration::from_secs(60);

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
    argocd::pulled_application(&client, APP, argocd::guestbook_status("Healthy"))
        .await
        .expect("the hub copy is written");

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
    // Listed once argocd-server's cache has it, with the status the
    // cluster reported.
    let app = testenv::wait::until(
        &format!("{APP} Synced and Healthy in GET /api/v1/applications"),
        UI_TIMEOUT,
        || async {
            let list = server.list_applications(&token).await?;
            let app = list
                .into_iter()
                .find(|a| at(a, "/metadata/name") == APP)
                .ok_or_else(|| format!("{APP} is not among the listed Applications"))?;
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
    if let Some(why) = testenv::paths::argocd_ui_not_built() {
        testenv::paths::not_run("argocd_server: the hub UI in a browser", &why);
        return;
    }
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
