//! Leader election against a real API server: one leader at a time, a
//! released lease is taken at once, an abandoned one after its duration
//! (when a standby's watch shows it, not at the standby's next poll),
//! a leader whose lease is taken notices, and a leader whose connection to
//! the API server freezes stops before a standby takes over.

use std::time::{Duration, Instant};

use argocd_pull_runtime::lease::{LeaseConfig, acquire};
use argocd_pull_runtime::shutdown;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use testenv::freeze::FreezingProxy;
use testenv::{CrdSet, wait};

/// The shared cluster, a client, a namespace of the test's own and its
/// Leases.
async fn lease_env() -> (&'static testenv::Cluster, kube::Client, String, Api<Lease>) {
    testenv::init_tracing();
    let cluster = testenv::shared("lease", CrdSet::None).await.unwrap();
    let client = cluster.client().await.unwrap();
    let ns = cluster.namespace("lease").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    (cluster, client, ns, api)
}

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

/// Watches the lease until `renewals` renewals by `holder` have been seen
/// over more than `span` (each one a new resourceVersion), failing as soon
/// as anyone else holds it.
async fn held_through(api: &Api<Lease>, holder: &str, renewals: usize, span: Duration) {
    let started = Instant::now();
    let mut versions = std::collections::BTreeSet::new();
    while versions.len() < renewals || started.elapsed() <= span {
        assert!(
            started.elapsed() < span * 4,
            "only {} renewals by {holder} in {:?}",
            versions.len(),
            started.elapsed()
        );
        let lease = api.get("leader").await.unwrap();
        let now_held_by = lease.spec.and_then(|s| s.holder_identity);
        assert_eq!(
            now_held_by.as_deref(),
            Some(holder),
            "the lease changed hands"
        );
        versions.insert(lease.metadata.resource_version.unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn one_leader_at_a_time_and_a_released_lease_is_taken_at_once() {
    let (_, client, ns, api) = lease_env().await;
    let (_stop, down) = shutdown::channel();

    let a = acquire(client.clone(), config(&ns, "a"), down.clone())
        .await
        .expect("a leads");
    assert_eq!(holder(&api).await.as_deref(), Some("a"));

    // b stands by while a renews, over more than a lease duration: the
    // lease keeps changing, and only ever as a's.
    let b = tokio::spawn(acquire(client.clone(), config(&ns, "b"), down.clone()));
    held_through(&api, "a", 6, Duration::from_secs(4)).await;
    assert!(!b.is_finished(), "b must not lead while a renews");

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

/// The lease of a leader that crashed: held by "ghost" for 3 s, renewed
/// at `renewed` (on another clock, so it means nothing) and never again.
fn ghost(renewed: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("leader".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("ghost".into()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            ..Default::default()
        }),
    }
}

/// A standby that polls only every two minutes: what it does sooner, it
/// does from its watch of the lease.
fn slow_poller(ns: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        retry_period: Duration::from_secs(120),
        ..config(ns, identity)
    }
}

#[tokio::test]
async fn a_standby_acts_when_the_lease_it_saw_expires_or_is_released_not_at_its_next_poll() {
    testenv::init_tracing();
    let cluster = testenv::shared("lease", CrdSet::None).await.unwrap();
    let client = cluster.client().await.unwrap();
    let (_stop, down) = shutdown::channel();

    // A lease nobody renews: the standby tries again when the duration it
    // saw runs out (3 s), not two minutes later.
    let ns = cluster.namespace("lease").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &ghost("2000-01-01T00:00:00Z"))
        .await
        .unwrap();
    let started = Instant::now();
    let c = tokio::time::timeout(
        Duration::from_secs(60),
        acquire(client.clone(), slow_poller(&ns, "c"), down.clone()),
    )
    .await
    .expect("c takes the expired lease at its expiry, not at its next poll")
    .expect("c leads");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "took over after {:?}",
        started.elapsed()
    );
    c.release().await;

    // A leader that renews and then hands the lease back: the standby,
    // which polled once, stands by while renewals go on, and takes the
    // lease as soon as its watch shows it released.
    let ns = cluster.namespace("lease").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let a = acquire(client.clone(), config(&ns, "a"), down.clone())
        .await
        .expect("a leads");
    let d = tokio::spawn(acquire(client.clone(), slow_poller(&ns, "d"), down.clone()));
    held_through(&api, "a", 6, Duration::from_secs(4)).await;
    assert!(!d.is_finished(), "d must not lead while a renews");
    a.release().await;
    tokio::time::timeout(Duration::from_secs(30), d)
        .await
        .expect("d takes the released lease at once, not at its next poll")
        .unwrap()
        .expect("d leads")
        .release()
        .await;
}

#[tokio::test]
async fn an_abandoned_lease_is_taken_over_after_its_duration_not_before() {
    let (cluster, client, ns, api) = lease_env().await;
    // A leader that crashed: its lease is never renewed again. Its
    // renewTime is in the future on purpose: clocks are not compared.
    let ghost = ghost("2099-01-01T00:00:00Z");
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
    // d reads the lease through a proxy, so that its attempts can be seen.
    let proxy = FreezingProxy::start(cluster).await.unwrap();
    let through = proxy.client(cluster).await.unwrap();
    let d = tokio::spawn(acquire(through, config(&ns, "d"), down.clone()));
    wait::until(
        "d to try for the lease a few times",
        Duration::from_secs(10),
        || async {
            let mut seen = Vec::new();
            for _ in 0..3 {
                seen.push(proxy.sent());
                tokio::time::sleep(Duration::from_millis(350)).await;
            }
            if seen[0] > 0 && seen[0] < seen[1] && seen[1] < seen[2] {
                Ok(())
            } else {
                Err(format!("bytes sent {seen:?}"))
            }
        },
    )
    .await;
    stop.fire();
    let got = tokio::time::timeout(Duration::from_secs(5), d)
        .await
        .expect("d stops when asked")
        .unwrap();
    assert!(got.is_none(), "d must not lead");
    assert_eq!(holder(&api).await.as_deref(), Some("ghost"));
}

#[tokio::test]
async fn a_leader_whose_api_connection_freezes_stops_before_anyone_takes_over() {
    let (cluster, client, ns, api) = lease_env().await;
    let (_stop, down) = shutdown::channel();

    // The leader talks to the API server through a proxy; the standby does not.
    let proxy = FreezingProxy::start(cluster).await.unwrap();
    let leader_config = config(&ns, "frozen");
    let deadline = leader_config.renew_deadline;
    let a = acquire(
        proxy.client(cluster).await.unwrap(),
        leader_config,
        down.clone(),
    )
    .await
    .expect("the leader leads");
    let b = tokio::spawn(acquire(
        client.clone(),
        config(&ns, "standby"),
        down.clone(),
    ));
    held_through(&api, "frozen", 3, Duration::from_millis(600)).await;

    // Its connection hangs: every call it makes now waits forever.
    let frozen_at = Instant::now();
    proxy.freeze();
    tokio::time::timeout(deadline * 3, a.lost())
        .await
        .expect("the leader reports the lease lost although its calls hang");
    let lost_after = frozen_at.elapsed();
    // Its last renewal started before the freeze; slack for the scheduler.
    assert!(
        lost_after <= deadline + Duration::from_millis(500),
        "lost reported {lost_after:?} after the freeze, deadline {deadline:?}"
    );
    let b = tokio::time::timeout(Duration::from_secs(15), b)
        .await
        .expect("the standby takes over")
        .unwrap()
        .expect("the standby leads");
    let taken_after = frozen_at.elapsed();
    assert!(
        lost_after < taken_after,
        "two leaders: the standby led {taken_after:?} after the freeze, the old leader stopped at {lost_after:?}"
    );
    assert_eq!(holder(&api).await.as_deref(), Some("standby"));
    b.release().await;
}
