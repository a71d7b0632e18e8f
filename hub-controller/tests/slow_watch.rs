//! Read your own writes, against a real API server whose watch of
//! Applications comes seconds late (as on a loaded hub): the controller
//! must not decide from a cached copy older than its own last write. On a
//! controller that does, every retry re-sends the same status PATCH until
//! the echo arrives (found in the ManifestWork benchmark: 36,000 retries
//! and 38,000 status writes for 1,000 Applications).

use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::render::work::work_name;
use futures::StreamExt;
use http::Method;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use testenv::slow_watch::{RequestLog, SlowWatch};
use testenv::wait;

mod common;
use common::{app, apps_api, feed_back, managed_cluster, placement_selects, run_controller};

const APPS: usize = 200;
const WATCH_DELAY: Duration = Duration::from_secs(4);
const STARTED: &str = "2026-11-23T10:00:00Z";

#[tokio::test]
async fn a_late_watch_costs_no_extra_status_writes() {
    let (hub, admin) = common::start_hub("hub").await;
    let log = RequestLog::default();
    let slow = SlowWatch {
        resource: "/applications",
        delay: WATCH_DELAY,
        log: log.clone(),
    }
    .client(hub.config().await.unwrap())
    .unwrap();
    let (ctx, _stop) = run_controller(slow).await;

    managed_cluster(&hub, "cluster1").await;
    let ns = hub.namespace("team").await.unwrap();
    placement_selects(&admin, &ns, &["cluster1"]).await;
    let apps = apps_api(&admin, &ns);
    let works: Api<ManifestWork> = Api::namespaced(admin.clone(), "cluster1");
    let names: Vec<String> = (0..APPS).map(|i| format!("app-{i:03}")).collect();
    futures::stream::iter(&names)
        .for_each_concurrent(32, |name| {
            let apps = apps.clone();
            let a = app(
                name,
                &ns,
                json!({ keys::MANAGED_CLUSTER: "cluster1" }),
                json!({}),
            );
            async move {
                apps.create(&PostParams::default(), &a).await.unwrap();
            }
        })
        .await;
    // Application works only: the project work delivers none.
    common::wait_count(
        &works,
        &ListParams::default().labels("!argocd-pull.io/project"),
        APPS,
        "a ManifestWork for every Application",
        Duration::from_secs(120),
    )
    .await;

    // The work agent reports a sync that has already ended Healthy: one
    // change on the spoke, one write on the hub.
    futures::stream::iter(&names)
        .for_each_concurrent(32, |name| {
            let (works, ns) = (works.clone(), ns.clone());
            async move {
                let values = [
                    ("healthStatus", "Healthy"),
                    ("syncStatus", "Synced"),
                    ("syncRevision", "abc123"),
                    ("operationStatePhase", "Succeeded"),
                    ("operationStateStartedAt", STARTED),
                ];
                feed_back(&works, &work_name(&ns, name), &ns, name, &values).await;
            }
        })
        .await;
    common::wait_all(
        &apps,
        "every hub copy Healthy and Synced",
        Duration::from_secs(180),
        exact,
        |a| {
            format!(
                "{}: {}",
                a.name_any(),
                a.data.get("status").cloned().unwrap_or_default()
            )
        },
    )
    .await;
    // Every write's echo has reached the controller's cache, and whatever
    // those echoes triggered has run: the counts below are final.
    wait::until(
        "the controller to see its own writes",
        Duration::from_secs(60),
        || async {
            let (pending, queued, running) = (
                ctx.writer.written().len(),
                ctx.queue.depth(),
                ctx.queue.running(),
            );
            if pending + queued + running == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{pending} writes unseen, {queued} queued, {running} running"
                ))
            }
        },
    )
    .await;

    let patches = log.paths(&Method::PATCH);
    let mut worst = (0, String::new());
    for name in &names {
        let path = format!("/namespaces/{ns}/applications/{name}");
        let n = patches.iter().filter(|p| p.ends_with(&path)).count();
        assert!(n >= 1, "{name}: {n} PATCHes; its status takes one");
        if n > worst.0 {
            worst = (n, name.clone());
        }
    }
    assert!(
        worst.0 <= 1,
        "{} PATCHes for {} (one feedback, one write); \
         {} in all for {APPS} Applications; the watch came {WATCH_DELAY:?} late",
        worst.0,
        worst.1,
        patches
            .iter()
            .filter(|p| p.contains("/applications/"))
            .count()
    );
    let list = apps.list(&ListParams::default()).await.unwrap();
    assert!(list.items.iter().all(exact), "every hub copy still exact");
    // One live GET per new work (a just-deleted Application must not get
    // its work back from a stale cache); none for a late cache.
    let gets = log.count(&Method::GET, "/applications/");
    assert!(
        gets <= APPS,
        "{gets} live GETs of Applications for {APPS} new works"
    );
}

/// The hub copy shows exactly what the spoke reported.
fn exact(a: &Application) -> bool {
    let s = a.data.get("status").cloned().unwrap_or_default();
    s["health"]["status"] == "Healthy"
        && s["sync"]["status"] == "Synced"
        && s["sync"]["revision"] == "abc123"
        && s["operationState"]["phase"] == "Succeeded"
        && s["operationState"]["startedAt"] == STARTED
}
