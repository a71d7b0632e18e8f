//! The spoke-agent binary as an operator runs it: against a real API
//! server, serving its admin port, and stopping cleanly on SIGTERM.

use std::time::Duration;

use testenv::{CrdSet, net, wait};

#[tokio::test]
async fn starts_serves_admin_endpoints_and_stops_on_sigterm() {
    let cluster = testenv::shared("cluster1", CrdSet::Managed).await.unwrap();
    let admin = net::free_addr().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_spoke-agent"))
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .arg("--admin-addr")
        .arg(admin.to_string())
        .args([
            "--cluster-name",
            "cluster1",
            "--hub-address",
            "https://127.0.0.1:1",
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // Up, but not ready: readiness reflects the connection to the hub,
    // which is unreachable here.
    wait::until(
        "/readyz to name the missing hub connection",
        Duration::from_secs(60),
        || async {
            match net::http_get(admin, "/readyz").await {
                Ok((503, body)) if body == "not ready: hub-connected" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(net::http_get(admin, "/healthz").await.unwrap().0, 200);
    let (code, _) = net::http_get(admin, "/metrics").await.unwrap();
    assert_eq!(code, 200);

    let status = net::terminate(&mut child, Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test]
async fn fails_with_a_clear_message_when_the_hub_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spoke-agent"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--admin-addr")
        .arg(net::free_addr().unwrap().to_string())
        .args([
            "--cluster-name",
            "cluster1",
            "--hub-address",
            "https://127.0.0.1:1",
        ])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach the managed cluster's API server"),
        "{stderr}"
    );
}
