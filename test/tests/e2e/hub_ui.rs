//! The hub's Argo CD API server (started by the stack, as in `make demo`)
//! shows the pulled Applications with the status their clusters reported:
//! logged in as the local admin through its session API, its Application
//! list carries each hub copy's sync and health, on either transport; the
//! CLI and the UI (headless Chromium) show the first one, its tree's nodes
//! included.

use std::time::Duration;

use testenv::browser::Browser;
use testenv::paths;
use testenv::stack::Stack;

const UI_TIMEOUT: Duration = Duration::from_secs(60);

use super::support::{at, eventually};

pub async fn shows_the_pulled_applications(stack: &Stack, names: &[String]) {
    let server = &stack.argocd_server;
    let token = server
        .login("admin", server.admin_password())
        .await
        .expect("the admin logs in to the hub's argocd-server");
    eventually(
        stack,
        "the hub's argocd-server to list the pulled Applications Synced/Healthy",
        || async {
            let items = server.list_applications(&token).await?;
            for name in names {
                let app = items
                    .iter()
                    .find(|a| at(a, "/metadata/name") == name)
                    .ok_or_else(|| format!("{name} is not listed"))?;
                let (sync, health) = (
                    at(app, "/status/sync/status"),
                    at(app, "/status/health/status"),
                );
                if (sync, health) != ("Synced", "Healthy") {
                    return Err(format!("{name} is listed {sync}/{health}"));
                }
            }
            Ok::<_, String>(())
        },
    )
    .await;
    // The same as the CLI shows it.
    let app = server
        .app_get(&token, &format!("argocd/{}", names[0]))
        .unwrap();
    assert_eq!(at(&app, "/status/health/status"), "Healthy", "{app}");

    // And on the UI, as a person opens it: the Application's page with its
    // health and sync, and the tree's nodes: the resources the cluster
    // reported in the hub copy's status.
    let resources: Vec<String> = app
        .pointer("/status/resources")
        .and_then(|r| r.as_array())
        .into_iter()
        .flatten()
        .map(|r| at(r, "/name").to_string())
        .collect();
    assert!(!resources.is_empty(), "no resources reported: {app}");
    let browser = Browser::start(1440, 900).await.expect("chromium starts");
    let mut page = browser.page().await.unwrap();
    server.ui_login(&mut page, UI_TIMEOUT).await.unwrap();
    page.navigate(&format!(
        "{}/applications/argocd/{}",
        server.url(),
        names[0]
    ))
    .await
    .unwrap();
    let shown = format!(
        "(() => {{ const t = document.body.innerText; \
           return t.includes('APP HEALTH') && t.includes('Healthy') && t.includes('Synced') \
             && {:?}.every(n => t.includes(n)); }})()",
        resources
    );
    server
        .ui_wait_for(
            &mut page,
            "the Application's page with its health, sync and the tree's nodes",
            &shown,
            UI_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Let the page settle (fonts, icons) before the picture.
    tokio::time::sleep(Duration::from_secs(2)).await;
    page.screenshot(&browser.dir().join("hub-ui-app.png"))
        .await
        .unwrap();
    if std::env::var_os("ARGOCD_PULL_SCREENSHOTS").is_some() {
        let docs = paths::workspace_dir().join("docs/img/hub-ui-app.png");
        page.screenshot(&docs).await.unwrap();
        eprintln!("screenshot: {}", docs.display());
    }
}
