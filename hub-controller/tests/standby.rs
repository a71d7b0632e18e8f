//! Two hub-controller replicas against a real API server, as the
//! Deployment runs them: only the Lease holder serves gRPC, so only it is
//! Ready (the gRPC Service routes by readiness); the standby is alive but
//! not Ready until it takes over.

use std::net::SocketAddr;
use std::time::Duration;

use testenv::{Cluster, ClusterConfig, CrdSet, net, wait};

mod common;
use common::Binary;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A replica serving gRPC on `grpc`, keeping its own certificate files.
fn replica(hub: &Cluster, grpc: SocketAddr, files: &std::path::Path) -> Binary {
    let args = common::kept_certificates(grpc, files);
    Binary::start(hub, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

async fn readyz(admin: SocketAddr) -> Result<(u16, String), String> {
    net::http_get(admin, "/readyz")
        .await
        .map_err(|e| e.to_string())
}

async fn listens(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

#[tokio::test]
async fn only_the_lease_holder_is_ready_and_the_standby_becomes_ready_when_it_takes_over() {
    testenv::init_tracing();
    let hub = Cluster::start(ClusterConfig::new("hub", CrdSet::Hub))
        .await
        .unwrap();
    // The leader Lease's and the certificates' namespace, as deploy/ creates it.
    hub.ensure_namespace("argocd-pull").await.unwrap();
    let (files_a, files_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (grpc_a, grpc_b) = (net::free_addr().unwrap(), net::free_addr().unwrap());

    let mut a = replica(&hub, grpc_a, files_a.path());
    wait::until(
        "the first replica to lead and be Ready",
        TIMEOUT,
        || async {
            match (
                readyz(a.admin).await,
                a.metric("argocd_pull_hub_leader").await,
            ) {
                (Ok((200, _)), Some(1.0)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(listens(grpc_a).await, "the leader serves gRPC");

    let mut b = replica(&hub, grpc_b, files_b.path());
    // Positive signals that the standby is up and standing by: alive, its
    // metrics say it does not lead, and /readyz names the reason.
    let body = wait::until(
        "the standby's /readyz to name the Lease",
        TIMEOUT,
        || async {
            match readyz(b.admin).await {
                Ok((503, body)) if body.contains(argocd_pull_hub_controller::LEADER_CHECK) => {
                    Ok(body)
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(
        body, "not ready: leader",
        "the standby waits for nothing else"
    );
    assert_eq!(net::http_get(b.admin, "/livez").await.unwrap().0, 200);
    assert_eq!(b.metric("argocd_pull_hub_leader").await, Some(0.0));
    // It stays so across several of the leader's renewals (every 2 s),
    // each probe answered.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(readyz(b.admin).await.unwrap().0, 503);
        assert_eq!(readyz(a.admin).await.unwrap().0, 200);
        assert!(!listens(grpc_b).await, "a standby serves no gRPC");
    }

    // The leader stops gracefully and hands the Lease over.
    let status = net::terminate(&mut a.child, Duration::from_secs(30)).await;
    assert!(status.success(), "exit status {status:?}");
    wait::until("the standby to lead and be Ready", TIMEOUT, || async {
        match (
            readyz(b.admin).await,
            b.metric("argocd_pull_hub_leader").await,
        ) {
            (Ok((200, body)), Some(1.0)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(listens(grpc_b).await, "the new leader serves gRPC");
    let status = net::terminate(&mut b.child, Duration::from_secs(30)).await;
    assert!(status.success(), "exit status {status:?}");
}
