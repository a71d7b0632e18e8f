//! Restarts of the hub-controller binary mid-flight, with leader election
//! on as in production: a replacement converges on exactly one work per
//! Application, hands each operation over once, and a restart with nothing
//! to do writes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::render::work::{MANAGED_BY, MANAGED_BY_LABEL};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use testenv::{net, wait};

mod common;
use common::{Binary, app, apps_api, feed_back, managed_cluster, placement_selects};

const CLUSTERS: [&str; 3] = ["r1", "r2", "r3"];
const APPS: usize = 90;

async fn our_works(client: &kube::Client) -> Vec<ManifestWork> {
    Api::<ManifestWork>::all(client.clone())
        // Application works only: a cluster's project works (label
        // argocd-pull.io/project) deliver no Application.
        .list(&ListParams::default().labels(&format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY},!argocd-pull.io/project"
        )))
        .await
        .unwrap()
        .items
}

#[tokio::test]
async fn a_replacement_converges_without_duplicates_and_a_restart_writes_nothing() {
    let (hub, client) = common::start_hub("hub").await;
    for c in CLUSTERS {
        managed_cluster(&hub, c).await;
    }
    let ns = hub.namespace("team").await.unwrap();
    placement_selects(&client, &ns, &CLUSTERS).await;
    // The default Lease namespace, as deploy/ creates it.
    hub.ensure_namespace("argocd-pull").await.unwrap();
    let apps = apps_api(&client, &ns);

    let mut first = Binary::start(&hub, &[]);
    wait::until(
        "the first replica to lead",
        Duration::from_secs(60),
        || async {
            match first.metric("argocd_pull_hub_leader").await {
                Some(1.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // Every third Application asks for a sync.
    futures::stream::iter(0..APPS)
        .for_each_concurrent(8, |i| {
            let apps = apps.clone();
            let ns = ns.clone();
            async move {
                let extra = if i.is_multiple_of(3) {
                    json!({ "operation": { "sync": { "revision": "HEAD" } } })
                } else {
                    json!({})
                };
                let cluster = CLUSTERS[i % CLUSTERS.len()];
                apps.create(
                    &PostParams::default(),
                    &app(
                        &format!("app-{i}"),
                        &ns,
                        json!({ keys::MANAGED_CLUSTER: cluster }),
                        extra,
                    ),
                )
                .await
                .unwrap();
            }
        })
        .await;
    // Kill the leader mid-flight: no graceful release of its Lease.
    wait::until("some works", Duration::from_secs(60), || async {
        let n = our_works(&client).await.len();
        if n >= 5 { Ok(n) } else { Err(n) }
    })
    .await;
    first.child.start_kill().unwrap();
    first.child.wait().await.unwrap();
    let at_kill = our_works(&client).await.len();
    eprintln!("killed the first replica with {at_kill}/{APPS} works delivered");

    // The replacement waits for the abandoned Lease to expire, then finishes.
    let second = Binary::start(&hub, &[]);
    let works = wait::until(
        "a work per Application",
        Duration::from_secs(90),
        || async {
            let works = our_works(&client).await;
            if works.len() >= APPS {
                Ok(works)
            } else {
                Err(works.len())
            }
        },
    )
    .await;

    // Exactly one work per Application, in its cluster's namespace.
    let owners: BTreeSet<(String, String)> = works
        .iter()
        .map(|w| {
            let a = w.annotations();
            (a[keys::HUB_APP_NAME].clone(), w.namespace().unwrap())
        })
        .collect();
    assert_eq!(works.len(), APPS, "duplicated works");
    assert_eq!(owners.len(), APPS);
    for (name, cluster) in &owners {
        let i: usize = name.trim_start_matches("app-").parse().unwrap();
        assert_eq!(cluster, CLUSTERS[i % CLUSTERS.len()], "{name}");
    }

    // Play the work agent: every Application is Healthy and Synced on its
    // spoke; the status reaches every hub copy.
    for w in &works {
        let api: Api<ManifestWork> = Api::namespaced(client.clone(), &w.namespace().unwrap());
        let name = w.annotations()[keys::HUB_APP_NAME].clone();
        feed_back(
            &api,
            &w.name_any(),
            &ns,
            &name,
            &[("healthStatus", "Healthy"), ("syncStatus", "Synced")],
        )
        .await;
    }
    common::wait_all(
        &apps,
        "status on every hub copy",
        Duration::from_secs(90),
        |a| a.data.pointer("/status/health/status") == Some(&json!("Healthy")),
        |a| a.name_any(),
    )
    .await;

    // Each sync was handed over exactly once: gone from the hub copy,
    // carried by the work.
    let works = our_works(&client).await;
    assert_eq!(works.len(), APPS);
    for w in &works {
        let name = w.annotations()[keys::HUB_APP_NAME].clone();
        let i: usize = name.trim_start_matches("app-").parse().unwrap();
        let manifest = common::first_manifest(w);
        assert_eq!(
            manifest.get("operation").is_some(),
            i.is_multiple_of(3),
            "{name}"
        );
        let hub_copy = apps.get(&name).await.unwrap();
        assert!(
            hub_copy.data.get("operation").is_none_or(Value::is_null),
            "{name} still carries its operation on the hub"
        );
    }

    // A graceful restart hands the Lease over at once, and the new leader,
    // finding everything delivered, writes nothing.
    let versions: BTreeSet<(String, String)> = works
        .iter()
        .map(|w| (w.name_any(), w.resource_version().unwrap()))
        .collect();
    let apps_before = app_versions(&apps).await;
    let mut second = second;
    let status = net::terminate(&mut second.child, Duration::from_secs(15)).await;
    assert!(status.success(), "{status:?}");
    let third = Binary::start(&hub, &[]);
    wait::until(
        "the third replica to reconcile everything",
        Duration::from_secs(30),
        || async {
            // Finished reconciles (the latency histogram's count).
            match third
                .metric("argocd_pull_hub_application_reconcile_duration_seconds_count")
                .await
            {
                Some(n) if n >= APPS as f64 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let after: BTreeSet<(String, String)> = our_works(&client)
        .await
        .iter()
        .map(|w| (w.name_any(), w.resource_version().unwrap()))
        .collect();
    assert_eq!(after, versions, "a restart rewrote works");
    assert_eq!(
        app_versions(&apps).await,
        apps_before,
        "a restart rewrote hub Applications"
    );
}

async fn app_versions(
    apps: &Api<argocd_pull_apis::argocd::Application>,
) -> BTreeSet<(String, String)> {
    apps.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|a| (a.name_any(), a.resource_version().unwrap()))
        .collect()
}
