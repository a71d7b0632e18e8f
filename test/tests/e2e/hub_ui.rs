//! The hub's Argo CD API server (started by the stack, as in `make demo`)
//! shows the pulled Applications with the status their clusters reported:
//! logged in as the local admin through its session API, its Application
//! list carries each hub copy's sync and health, on either transport.

use http::Method;
use serde_json::Value;
use testenv::stack::Stack;

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
            let (code, list) = server
                .api(Method::GET, "/api/v1/applications", Some(&token), None)
                .await
                .map_err(|e| e.to_string())?;
            if code != 200 {
                return Err(format!("{code}: {list}"));
            }
            let items = list["items"].as_array().cloned().unwrap_or_default();
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
    let out = std::process::Command::new(testenv::argocd::cli().unwrap())
        .args(["app", "get", &format!("argocd/{}", names[0]), "-o", "json"])
        .args(["--plaintext", "--server", &server.addr().to_string()])
        .args(["--auth-token", &token])
        .env("HOME", server.dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "argocd app get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let app: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(at(&app, "/status/health/status"), "Healthy", "{app}");
}
