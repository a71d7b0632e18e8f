//! The hub-controller binary as an operator runs it: against a real API
//! server, serving its admin port, and stopping cleanly on SIGTERM.

use std::time::Duration;

use testenv::{CrdSet, net, wait};

#[tokio::test]
async fn starts_serves_admin_endpoints_and_stops_on_sigterm() {
    let hub = testenv::shared("hub", CrdSet::Hub).await.unwrap();
    // The leader Lease's default namespace, as deploy/ creates it.
    hub.ensure_namespace("argocd-pull").await.unwrap();
    let admin = net::free_addr().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-controller"))
        .arg("--kubeconfig")
        .arg(hub.kubeconfig())
        .arg("--admin-addr")
        .arg(admin.to_string())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    wait::until("/readyz to answer ok", Duration::from_secs(60), || async {
        match net::http_get(admin, "/readyz").await {
            Ok((200, body)) if body == "ok" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(net::http_get(admin, "/healthz").await.unwrap().0, 200);
    // A single replica leads after its first Lease round.
    let body = wait::until("the replica to lead", Duration::from_secs(30), || async {
        match net::http_get(admin, "/metrics").await {
            Ok((200, body)) if body.contains("argocd_pull_hub_leader 1") => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for metric in [
        "argocd_pull_hub_application_reconciles_total",
        "argocd_pull_hub_application_reconcile_duration_seconds",
        "argocd_pull_hub_manifestworks",
        "argocd_pull_hub_queue_depth",
        "argocd_pull_hub_leader 1",
    ] {
        assert!(body.contains(metric), "{metric} missing from:\n{body}");
    }

    let status = net::terminate(&mut child, Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test]
async fn fails_with_a_clear_message_when_the_hub_is_unreachable() {
    let out = net::run_unreachable(env!("CARGO_BIN_EXE_hub-controller"), &[]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach the hub API server"),
        "{stderr}"
    );
}
