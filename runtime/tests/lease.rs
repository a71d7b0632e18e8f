//! Leader election against a real API server: one leader at a time, a
//! released lease is taken at once, an abandoned one after its duration,
//! and a leader whose lease is taken notices.

use std::time::Duration;

use argocd_pull_runtime::lease::{LeaseConfig, acquire};
use argocd_pull_runtime::shutdown;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use testenv::{CrdSet, wait};

/// Fast timings so that the test does not wait 15 s per step.
fn config(ns: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
        ..LeaseConfig::new(ns, "leader", identity)
    }
}

async fn holder(api: &Api<Lease>) -> Option<String> {
    api.get("leader")
        .await
        .ok()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_released_lease_is_taken_at_once() {
    testenv::init_tracing();
    let cluster = testenv::shared("lease", CrdSet::None).await.unwrap();
    let client = cluster.client().await.unwrap();
    let ns = cluster.namespace("lease").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let (_stop, down) = shutdown::channel();

    let a = acquire(client.clone(), config(&ns, "a"), down.clone())
        .await
        .expect("a leads");
    assert_eq!(holder(&api).await.as_deref(), Some("a"));

    // b stands by for well over a lease duration while a renews.
    let b = tokio::spawn(acquire(client.clone(), config(&ns, "b"), down.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!b.is_finished(), "b must not lead while a renews");
    assert_eq!(holder(&api).await.as_deref(), Some("a"));

    // a steps down gracefully: b takes over, and a's hand-back is recorded.
    a.release().await;
    let b = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("b takes over a released lease")
        .unwrap()
        .expect("b leads");
    assert_eq!(holder(&api).await.as_deref(), Some("b"));
    let spec = api.get("leader").await.unwrap().spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(1));

    // Someone else takes the lease: b notices and reports it lost.
    let mut lease = api.get("leader").await.unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
    lease.spec.as_mut().unwrap().lease_duration_seconds = Some(60);
    api.replace("leader", &PostParams::default(), &lease)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), b.lost())
        .await
        .expect("b sees that it lost the lease");
}

#[tokio::test]
async fn an_abandoned_lease_is_taken_over_after_its_duration_not_before() {
    testenv::init_tracing();
    let cluster = testenv::shared("lease", CrdSet::None).await.unwrap();
    let client = cluster.client().await.unwrap();
    let ns = cluster.namespace("lease").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    // A leader that crashed: its lease is never renewed again. Its
    // renewTime is in the future on purpose: clocks are not compared.
    let ghost = Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("ghost".into()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime("2099-01-01T00:00:00Z".parse().unwrap())),
            ..Default::default()
        }),
    };
    api.create(&PostParams::default(), &ghost).await.unwrap();
    let (stop, down) = shutdown::channel();
    let started = std::time::Instant::now();
    let c = acquire(client.clone(), config(&ns, "c"), down.clone())
        .await
        .expect("c leads");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "took over after {:?}, before the lease expired",
        started.elapsed()
    );
    wait::until("c to hold the lease", Duration::from_secs(5), || async {
        match holder(&api).await.as_deref() {
            Some("c") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    c.release().await;

    // A candidate asked to stop before it leads returns nothing.
    let ns = cluster.namespace("lease").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let mut held = ghost.clone();
    held.spec.as_mut().unwrap().lease_duration_seconds = Some(600);
    api.create(&PostParams::default(), &held).await.unwrap();
    let d = tokio::spawn(acquire(client.clone(), config(&ns, "d"), down.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.fire();
    let got = tokio::time::timeout(Duration::from_secs(5), d)
        .await
        .expect("d stops when asked")
        .unwrap();
    assert!(got.is_none(), "d must not lead");
    assert_eq!(holder(&api).await.as_deref(), Some("ghost"));
}
