//! The hub's Argo CD API server (started by the stack, as in `make demo`)
//! shows the pulled Applications with the status their clusters reported:
//! logged in as the local admin through its session API, its Application
//! list carries each hub copy's sync and health, on either transport; the
//! CLI and the UI (headless Chromium) show each, its tree's nodes
//! included (cluster2's from its ManifestWork's raw feedback). Over gRPC,
//! the CLI also reads what cluster1's own Argo CD cached, as the agent
//! reported it: the live manifests and the diff.

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
    // What cluster1's Argo CD cached, through the hub, as its agent
    // reported it: the live manifests and the diff (in sync: exit 0).
    let grpc_app = format!("argocd/{}", names[0]);
    let live = eventually(
        stack,
        "the live manifests of cluster1's Application through the hub",
        || async {
            let out = server
                .cli(&token, &["app", "manifests", &grpc_app, "--source", "live"])
                .map_err(|e| e.to_string())?;
            if out.contains("kind: ConfigMap") {
                Ok(out)
            } else {
                Err(out)
            }
        },
    )
    .await;
    eprintln!("$ argocd app manifests {grpc_app} --source live\n{live}");
    for name in names {
        let app = format!("argocd/{name}");
        let out = server.cli(&token, &["app", "resources", &app]).unwrap();
        eprintln!("$ argocd app resources {app}\n{out}");
        assert!(out.contains("ConfigMap"), "{out}");
    }
    let diff = server
        .cli(&token, &["app", "diff", &grpc_app])
        .unwrap_or_else(|e| panic!("argocd app diff {grpc_app}: {e}"));
    eprintln!("$ argocd app diff {grpc_app}   (exit 0: in sync)\n{diff}");
    // The same as the CLI shows it, and on the UI, as a person opens each:
    // the Application's page with its health and sync, and the tree's
    // nodes: the resources its cluster reported in the hub copy's status,
    // over gRPC (cluster1) or in a ManifestWork's feedback (cluster2).
    let browser = Browser::start(1440, 900).await.expect("chromium starts");
    let mut page = browser.page().await.unwrap();
    server.ui_login(&mut page, UI_TIMEOUT).await.unwrap();
    for (i, name) in names.iter().enumerate() {
        let app = server.app_get(&token, &format!("argocd/{name}")).unwrap();
        assert_eq!(at(&app, "/status/health/status"), "Healthy", "{app}");
        let resources: Vec<String> = app
            .pointer("/status/resources")
            .and_then(|r| r.as_array())
            .into_iter()
            .flatten()
            .map(|r| at(r, "/name").to_string())
            .collect();
        assert!(!resources.is_empty(), "no resources reported: {app}");
        page.navigate(&format!("{}/applications/argocd/{name}", server.url()))
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
                &format!("{name}'s page with its health, sync and the tree's nodes {resources:?}"),
                &shown,
                UI_TIMEOUT,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Let the page settle (fonts, icons) before the picture.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let file = if i == 0 {
            "hub-ui-app.png".to_string()
        } else {
            format!("hub-ui-app-{}.png", transport_of(name))
        };
        page.screenshot(&browser.dir().join(&file)).await.unwrap();
        if std::env::var_os("ARGOCD_PULL_SCREENSHOTS").is_some() {
            let docs = paths::workspace_dir().join("docs/img").join(&file);
            page.screenshot(&docs).await.unwrap();
            eprintln!("screenshot: {}", docs.display());
        }
    }
}

/// What the e2e topology sends `name` over (cluster2's Applications go in
/// ManifestWorks).
fn transport_of(name: &str) -> &'static str {
    if name.ends_with("cluster2") {
        "manifestwork"
    } else {
        "grpc"
    }
}
