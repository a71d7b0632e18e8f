//! Read your own writes on the gRPC path, against a real hub API server
//! whose watch of Applications comes seconds late (as on a loaded hub): the
//! hub's gRPC transport runs in this process with a client whose
//! Application watch events arrive 4 s late, a real spoke-agent delivers
//! 200 Applications to a real managed cluster, and the test plays the
//! spoke's Argo CD running a sync: each spoke status goes Progressing
//! (operation Running), then Healthy (Succeeded). The hub must not decide
//! from a cached copy older than its own last write: one status PATCH per
//! spoke status (two per Application), and every hub copy ends exactly as
//! the spoke.
//! The ManifestWork half is `slow_watch.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_hub_controller::route::authz::Authorization;
use argocd_pull_hub_controller::transport::grpc::{self, metrics::GrpcMetrics};
use argocd_pull_hub_controller::watch::watches::{Scope, Watches};
use clap::Parser;
use futures::StreamExt;
use http::Method;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::slow_watch::{RequestLog, SlowWatch};
use testenv::wait;

mod common;
mod grpc_env;
use grpc_env::Env;

const APPS: usize = 200;
const WATCH_DELAY: Duration = Duration::from_secs(4);
const TIMEOUT: Duration = Duration::from_secs(180);
const STARTED: &str = "2026-11-23T10:00:00Z";
const FINISHED: &str = "2026-11-23T10:00:07Z";

/// The spoke status while Argo CD runs the sync.
fn progressing() -> Value {
    json!({
        "health": { "status": "Progressing" },
        "sync": { "status": "OutOfSync", "revision": "abc123" },
        "operationState": {
            "operation": { "sync": { "revision": "abc123" } },
            "phase": "Running", "startedAt": STARTED,
        },
    })
}

/// The spoke status once the sync has ended Healthy.
fn healthy() -> Value {
    json!({
        "health": { "status": "Healthy" },
        "sync": { "status": "Synced", "revision": "abc123" },
        "operationState": {
            "operation": { "sync": { "revision": "abc123" } },
            "phase": "Succeeded", "startedAt": STARTED, "finishedAt": FINISHED,
        },
    })
}

fn status(a: &Application) -> Value {
    a.data.get("status").cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_late_watch_costs_no_extra_status_writes_over_grpc() {
    let mut env = Env::new(&["cluster1"]).await;
    // The test plays the spoke's Argo CD itself.
    env.spokes[0].argocd.stop();

    // The hub's gRPC transport in this process, its Application watch late.
    let log = RequestLog::default();
    let slow = SlowWatch {
        resource: "/applications",
        delay: WATCH_DELAY,
        log: log.clone(),
    }
    .client(env.hub.config().await.unwrap())
    .unwrap();
    let d = env.dir.path();
    let args = argocd_pull_hub_controller::Args::parse_from([
        "hub-controller".to_string(),
        format!("--grpc-addr={}", env.grpc_addr),
        format!("--grpc-tls-cert={}", d.join("hub.crt").display()),
        format!("--grpc-tls-key={}", d.join("hub.key").display()),
        format!("--grpc-client-ca={}", d.join("ca.crt").display()),
        "--grpc-heartbeat=2s".to_string(),
        "--grpc-digest-interval=5s".to_string(),
    ]);
    let config = args.grpc.config(Authorization::default()).unwrap();
    // The hub's one set of watches, through the slow client, feeding the
    // gRPC transport alone.
    let watches = Watches::new(Scope {
        grpc: true,
        ..Scope::default()
    });
    let hub = grpc::Hub::new(grpc::hub::HubParts::new(
        config,
        slow.clone(),
        GrpcMetrics::default(),
        watches.caches(),
    ));
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    let caches = watches.caches();
    tokio::spawn(watches.run(slow.clone(), vec![hub.clone()], shutdown.clone().wait()));
    let served = grpc::start(hub.clone(), shutdown.wait()).await.unwrap();
    hub.wait_synced().await;
    env.connect_agent(0).await;

    let apps = env.hub_apps();
    let spoke = env.spoke_apps(0);
    let names: Vec<String> = (0..APPS).map(|i| format!("app-{i:03}")).collect();
    futures::stream::iter(&names)
        .for_each_concurrent(32, |name| {
            let (apps, a) = (apps.clone(), env.app(name, 0, json!({})));
            async move {
                apps.create(&PostParams::default(), &a).await.unwrap();
            }
        })
        .await;
    let managed = ListParams::default().labels(&format!("{}=true", keys::HUB_MANAGED));
    common::wait_count(
        &spoke,
        &managed,
        APPS,
        "every Application on the spoke",
        TIMEOUT,
    )
    .await;

    // Argo CD on the spoke starts the sync...
    set_spoke_status(&env, &names, progressing()).await;
    every_hub_copy(&apps, "every hub copy Progressing", progressing()).await;
    // ...and it ends Healthy, while the hub's watch has not yet shown it
    // its own Progressing writes.
    set_spoke_status(&env, &names, healthy()).await;
    every_hub_copy(&apps, "every hub copy exactly as the spoke", healthy()).await;
    // The hub's cache shows the last status of every Application, every
    // write's echo has reached a reconcile and nothing is queued: no more
    // writes can follow, the counts below are final.
    wait::until("the hub to see its own writes", TIMEOUT, || async {
        let stale = caches
            .apps
            .state()
            .iter()
            .filter(|a| status(&a.application()) != healthy())
            .count();
        let (unseen, queued) = (hub.writer.written().len(), hub.queued());
        if stale + unseen + queued == 0 {
            Ok(())
        } else {
            Err(format!(
                "{stale} cached copies stale, {unseen} writes unseen, {queued} queued"
            ))
        }
    })
    .await;

    let patches = log.paths(&Method::PATCH);
    let per_app: BTreeMap<&String, usize> = names
        .iter()
        .map(|name| {
            let path = format!("/namespaces/{}/applications/{name}", env.team);
            (name, patches.iter().filter(|p| p.ends_with(&path)).count())
        })
        .collect();
    let total: usize = per_app.values().sum();
    let (worst, most) = per_app
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(name, n)| ((*name).clone(), *n))
        .unwrap();
    eprintln!(
        "gRPC slow watch: {total} status PATCHes for {APPS} Applications, at most {most} ({worst}); \
         the watch came {WATCH_DELAY:?} late"
    );
    for (name, n) in &per_app {
        assert!(
            *n >= 2,
            "{name}: {n} PATCHes; the spoke's Progressing, then its Healthy, take two"
        );
    }
    assert!(
        most <= 2,
        "{most} PATCHes for {worst} (at most 2: one per spoke status); \
         {total} in all for {APPS} Applications; the watch came {WATCH_DELAY:?} late"
    );
    // Exact: the hub copy shows what the spoke has, nothing more.
    let spoke_status: BTreeMap<String, Value> = spoke
        .list(&managed)
        .await
        .unwrap()
        .items
        .iter()
        .map(|a| (a.name_any(), status(a)))
        .collect();
    for a in apps.list(&ListParams::default()).await.unwrap().items {
        assert_eq!(
            Some(&status(&a)),
            spoke_status.get(&a.name_any()),
            "{}",
            a.name_any()
        );
    }
    stop.fire();
    served.await.unwrap();
}

/// Waits until every hub copy's status is `want`.
async fn every_hub_copy(apps: &Api<Application>, what: &str, want: Value) {
    common::wait_all(
        apps,
        what,
        TIMEOUT,
        |a| status(a) == want,
        |a| format!("{}: {}", a.name_any(), status(a)),
    )
    .await;
}

/// Writes `status` onto each spoke Application, as its Argo CD does.
async fn set_spoke_status(env: &Env, names: &[String], status: Value) {
    let spoke = env.spoke_apps(0);
    futures::stream::iter(names)
        .for_each_concurrent(32, |name| {
            let (spoke, patch) = (spoke.clone(), json!({ "status": status }));
            async move {
                spoke
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .unwrap();
            }
        })
        .await;
}
