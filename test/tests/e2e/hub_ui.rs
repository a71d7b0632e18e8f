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
use testenv::stack::{Stack, TICKER_LINE};

/// As long as the e2e's other waits ([`super::support::TIMEOUT`]): the
/// first page of a cold browser on a loaded CI machine is slow.
const UI_TIMEOUT: Duration = super::support::TIMEOUT;

/// The guestbook's Deployment whose pod writes [`TICKER_LINE`]s (the
/// harness adds it to the example, `testenv::stack`).
const TICKER: &str = "guestbook-ticker";

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
    let live = cli_until(
        stack,
        &token,
        "the live manifests of cluster1's Application through the hub",
        &["app", "manifests", &grpc_app, "--source", "live"],
        |out| out.contains("kind: ConfigMap"),
    )
    .await;
    eprintln!("$ argocd app manifests {grpc_app} --source live\n{live}");
    // Each tree as the hub's Redis has it: written by the hub-controller
    // from what the cluster reported, which may follow the status a moment.
    for name in names {
        let app = format!("argocd/{name}");
        let out = cli_until(
            stack,
            &token,
            &format!("argocd app resources {app}"),
            &["app", "resources", &app],
            |out| out.contains("ConfigMap"),
        )
        .await;
        eprintln!("$ argocd app resources {app}\n{out}");
    }
    let diff = cli_until(
        stack,
        &token,
        &format!("argocd app diff {grpc_app} in sync (exit 0)"),
        &["app", "diff", &grpc_app],
        |_| true,
    )
    .await;
    eprintln!("$ argocd app diff {grpc_app}   (exit 0: in sync)\n{diff}");
    // A resource's live manifest (the UI's LIVE MANIFEST tab), read on
    // cluster1 when asked, through the hub's live endpoint and cluster1's
    // agent. cluster2's tree (from its ManifestWork's feedback, which the
    // hub copy's status carries and a tenant could write) has no uids, so
    // argocd-server refuses before it asks any cluster.
    fn get_resource(app: &str) -> [&str; 9] {
        [
            "app",
            "get-resource",
            app,
            "--kind",
            "ConfigMap",
            "--resource-name",
            "guestbook-ui",
            "-o",
            "yaml",
        ]
    }
    let args = get_resource(&grpc_app);
    let live_manifest = cli_until(
        stack,
        &token,
        "cluster1's live ConfigMap through the hub",
        &args,
        |out| out.contains("kind: ConfigMap") && out.contains("resourceVersion"),
    )
    .await;
    eprintln!("$ argocd {}\n{live_manifest}", args.join(" "));
    let mw_app = format!("argocd/{}", names[1]);
    let args = get_resource(&mw_app);
    let expected = format!("guestbook-ui not found as part of application {}", names[1]);
    let refused = eventually(
        stack,
        "argocd-server's refusal of cluster2's live ConfigMap",
        || async {
            match server.cli(&token, &args) {
                Ok(out) => panic!("cluster2's live ConfigMap was read from the hub:\n{out}"),
                Err(e) if e.to_string().contains(&expected) => Ok(e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    eprintln!("$ argocd {}   (exit 20)\n{refused}", args.join(" "));
    // A pod's logs, read on cluster1 when asked, through the hub's live
    // endpoint and cluster1's agent: the guestbook's ticker writes a line
    // a second, so the last lines differ from one read to the next.
    let logs_args = [
        "app",
        "logs",
        &grpc_app,
        "--group",
        "apps",
        "--kind",
        "Deployment",
        "--name",
        TICKER,
        "--tail",
        "3",
    ];
    let ticks = |out: &str| -> Vec<u64> {
        out.lines()
            .filter_map(|l| l.trim().strip_prefix(TICKER_LINE)?.trim().parse().ok())
            .collect()
    };
    let first = cli_until(
        stack,
        &token,
        "the ticker pod's logs through the hub",
        &logs_args,
        |out| ticks(out).len() == 3,
    )
    .await;
    eprintln!("$ argocd {}\n{first}", logs_args.join(" "));
    let last_of = |out: &str| ticks(out).last().copied().unwrap_or_default();
    let later = cli_until(
        stack,
        &token,
        "later lines of the ticker pod",
        &logs_args,
        |out| last_of(out) > last_of(&first),
    )
    .await;
    eprintln!("$ argocd {}   (again)\n{later}", logs_args.join(" "));
    // The same as the CLI shows it, and on the UI, as a person opens each:
    // the Application's page with its health and sync, and the tree's
    // nodes: the resources its cluster reported in the hub copy's status,
    // over gRPC (cluster1) or in a ManifestWork's feedback (cluster2).
    if let Some(why) = testenv::paths::argocd_ui_not_built() {
        testenv::paths::not_run("e2e: the hub UI's pages in a browser", &why);
        return;
    }
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
        let file = if i == 0 {
            "hub-ui-app.png".to_string()
        } else {
            format!("hub-ui-app-{}.png", transport_of(name))
        };
        screenshot(&browser, &mut page, &file).await;
    }
    // The ticker's logs on the UI, as a person opens them: its node in
    // cluster1's tree, the LOGS tab.
    page.navigate(&format!(
        "{}/applications/argocd/{}?node=apps%2FDeployment%2Fguestbook%2F{TICKER}%2F0&tab=logs",
        server.url(),
        names[0]
    ))
    .await
    .unwrap();
    let lines = format!("(() => document.body.innerText.split({TICKER_LINE:?}).length > 3)()");
    server
        .ui_wait_for(
            &mut page,
            &format!("{TICKER}'s LOGS tab with lines of its pod"),
            &lines,
            UI_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    screenshot(&browser, &mut page, "hub-ui-logs.png").await;
}

/// The output of `argocd <args>` against the stack's argocd-server, once
/// it exits 0 with an output that `shows`.
async fn cli_until(
    stack: &Stack,
    token: &str,
    what: &str,
    args: &[&str],
    shows: impl Fn(&str) -> bool,
) -> String {
    eventually(stack, what, || async {
        let out = stack
            .argocd_server
            .cli(token, args)
            .map_err(|e| e.to_string())?;
        if shows(&out) { Ok(out) } else { Err(out) }
    })
    .await
}

/// A picture of `page` in the browser's folder, and in docs/img when
/// `ARGOCD_PULL_SCREENSHOTS` is set.
async fn screenshot(browser: &Browser, page: &mut testenv::browser::Page, file: &str) {
    // Let the page settle (fonts, icons) before the picture.
    tokio::time::sleep(Duration::from_secs(2)).await;
    page.screenshot(&browser.dir().join(file)).await.unwrap();
    if std::env::var_os("ARGOCD_PULL_SCREENSHOTS").is_some() {
        let docs = paths::workspace_dir().join("docs/img").join(file);
        page.screenshot(&docs).await.unwrap();
        eprintln!("screenshot: {}", docs.display());
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
