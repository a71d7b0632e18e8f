//! Which transport delivers an Application, and switching between them, on
//! real API servers: a cluster with the argocd-pull addon gets gRPC, one
//! without gets ManifestWork, an annotation forces either; moving an
//! Application from one transport to the other never deletes it on the
//! spoke (its uid there never changes). The test plays the OCM work agent
//! where a ManifestWork is involved.

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::render::work::work_name;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use testenv::wait;

mod common;
mod grpc_env;
use common::{merge, set_source};
use grpc_env::{Env, TIMEOUT, disable_addon};

/// What the work agent does with a new work: applies its Application on
/// the spoke, and holds the work with its finalizer until it has cleaned up.
async fn play_work_agent(env: &Env, spoke: usize, work: &ManifestWork) {
    let manifest = common::first_manifest(work).clone();
    env.spoke_apps(spoke)
        .patch(
            manifest["metadata"]["name"].as_str().unwrap(),
            &PatchParams::apply("work-agent").force(),
            &Patch::Apply(&manifest),
        )
        .await
        .unwrap();
    let works = Api::<ManifestWork>::namespaced(env.hub_client.clone(), &env.spokes[spoke].name);
    merge(
        &works,
        &work.name_any(),
        json!({ "metadata": { "finalizers": ["cluster.open-cluster-management.io/manifest-work-cleanup"] } }),
    )
    .await;
}

async fn work(env: &Env, spoke: usize, app: &str) -> Option<ManifestWork> {
    Api::<ManifestWork>::namespaced(env.hub_client.clone(), &env.spokes[spoke].name)
        .get_opt(&work_name(&env.team, app))
        .await
        .unwrap()
}

async fn spoke_uid(env: &Env, spoke: usize, app: &str) -> Option<String> {
    env.spoke_apps(spoke)
        .get_opt(app)
        .await
        .unwrap()
        .and_then(|a| a.metadata.uid)
}

async fn hub_managed(env: &Env, spoke: usize, app: &str) -> Option<bool> {
    let a = env.spoke_apps(spoke).get_opt(app).await.unwrap()?;
    Some(a.labels().get(keys::HUB_MANAGED).map(String::as_str) == Some("true"))
}

/// Waits until the agent of spoke `i` has released `app` and a work
/// delivers it, the spoke's copy still the one of uid `uid` (handed over,
/// not deleted and made again).
async fn handed_to_a_work(env: &Env, i: usize, app: &str, uid: String) {
    wait::until(
        &format!("{app} released by the agent, delivered by a work"),
        TIMEOUT,
        || async {
            let released = hub_managed(env, i, app).await == Some(false);
            let work = work(env, i, app).await.is_some();
            if released && work {
                Ok(())
            } else {
                Err(format!("released {released}, work {work}"))
            }
        },
    )
    .await;
    assert_eq!(spoke_uid(env, i, app).await, Some(uid));
}

#[tokio::test]
async fn each_cluster_gets_its_transport_and_switching_deletes_nothing() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    // cluster2 starts without the addon: a ManifestWork cluster.
    disable_addon(&env.hub_client, "cluster2").await;
    env.start_hub(&[]).await;
    env.connect_agent(0).await;
    let hub = env.hub_apps();

    // The addon decides; the annotation overrides.
    for (name, spoke, extra) in [
        ("by-grpc", 0, json!({})),
        ("by-work", 1, json!({})),
        (
            "forced-work",
            0,
            json!({ "metadata": { "annotations": { keys::TRANSPORT: "manifestwork" } } }),
        ),
    ] {
        env.create(name, spoke, extra).await;
    }
    wait::until("by-grpc applied by the agent", TIMEOUT, || async {
        match hub_managed(&env, 0, "by-grpc").await {
            Some(true) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        work(&env, 0, "by-grpc").await.is_none(),
        "no work for a gRPC Application"
    );
    let by_work = wait::until("a work for by-work", TIMEOUT, || async {
        work(&env, 1, "by-work").await.ok_or("none")
    })
    .await;
    let forced = wait::until("a work for forced-work", TIMEOUT, || async {
        work(&env, 0, "forced-work").await.ok_or("none")
    })
    .await;
    play_work_agent(&env, 1, &by_work).await;
    play_work_agent(&env, 0, &forced).await;
    // The agent leaves the work's Application alone: once a later change
    // of another Application has reached it, forced-work is still not its.
    set_source(&hub, "by-grpc", "targetRevision", "later").await;
    wait::until("the later change on cluster1", TIMEOUT, || async {
        let a = env
            .spoke_apps(0)
            .get("by-grpc")
            .await
            .map_err(|e| e.to_string())?;
        match a.data.pointer("/spec/source/targetRevision") {
            Some(r) if r == "later" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(hub_managed(&env, 0, "forced-work").await, Some(false));

    // ManifestWork -> gRPC: the addon is enabled on cluster2 and its agent
    // starts. The work is deleted with the Application orphaned, and the
    // agent takes the very same Application over.
    let uid = spoke_uid(&env, 1, "by-work").await.unwrap();
    grpc_env::enable_addon(&env.hub_client, "cluster2").await;
    env.connect_agent(1).await;
    let orphaned = wait::until(
        "the work deleted with orphan propagation",
        TIMEOUT,
        || async {
            match work(&env, 1, "by-work").await {
                Some(w) if w.metadata.deletion_timestamp.is_some() => Ok(w),
                other => Err(format!("{:?}", other.map(|w| w.spec.delete_option))),
            }
        },
    )
    .await;
    let policy = orphaned
        .spec
        .delete_option
        .clone()
        .and_then(|d| d.propagation_policy);
    assert_eq!(format!("{policy:?}"), "Some(Orphan)");
    // The work agent orphans, so it does not delete the Application.
    Api::<ManifestWork>::namespaced(env.hub_client.clone(), "cluster2")
        .patch(
            &orphaned.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    wait::until("by-work managed by the agent", TIMEOUT, || async {
        match hub_managed(&env, 1, "by-work").await {
            Some(true) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(spoke_uid(&env, 1, "by-work").await, Some(uid.clone()));
    wait::until(
        "by-work's status on the hub, from the agent",
        TIMEOUT,
        || async {
            let a = hub.get("by-work").await.map_err(|e| e.to_string())?;
            match a.data.pointer("/status/health/status") {
                Some(s) if s == "Healthy" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // gRPC -> ManifestWork, by annotation: the agent lets go, a work takes
    // over, the Application stays.
    merge(
        &hub,
        "by-work",
        json!({ "metadata": { "annotations": { keys::TRANSPORT: "manifestwork" } } }),
    )
    .await;
    handed_to_a_work(&env, 1, "by-work", uid).await;

    // gRPC -> ManifestWork for a whole cluster: its addon is disabled.
    let uid = spoke_uid(&env, 0, "by-grpc").await.unwrap();
    disable_addon(&env.hub_client, "cluster1").await;
    handed_to_a_work(&env, 0, "by-grpc", uid).await;

    // A bad transport annotation is refused with a condition saying what to write.
    env.create(
        "typo",
        0,
        json!({ "metadata": { "annotations": { keys::TRANSPORT: "carrier-pigeon" } } }),
    )
    .await;
    wait::until("the refusal on typo", TIMEOUT, || async {
        let a = hub.get("typo").await.map_err(|e| e.to_string())?;
        let s = a
            .data
            .get("status")
            .map(|s| s.to_string())
            .unwrap_or_default();
        if s.contains("InvalidAnnotation") && s.contains("use grpc or manifestwork") {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
}
