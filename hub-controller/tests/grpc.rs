//! The gRPC transport in managed mode, end to end on real API servers: a
//! hub and two managed clusters, the hub-controller binary, and a
//! spoke-agent per cluster. Create, update, status, sync, refresh, local
//! edit, delete; after each, both sides show what the hub wants.

use std::collections::BTreeMap;

use argocd_pull_apis::keys;
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use testenv::wait;

mod common;
mod grpc_env;
use common::{merge, set_source};
use grpc_env::{Env, TIMEOUT};

async fn spoke_field(env: &Env, i: usize, name: &str, pointer: &str) -> Result<Value, String> {
    let a = env
        .spoke_apps(i)
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("not on the spoke")?;
    let v = serde_json::to_value(&a).unwrap();
    v.pointer(pointer)
        .cloned()
        .ok_or_else(|| format!("{pointer} missing in {v}"))
}

async fn hub_field(env: &Env, name: &str, pointer: &str) -> Option<Value> {
    let a = env.hub_apps().get_opt(name).await.ok()??;
    serde_json::to_value(&a).unwrap().pointer(pointer).cloned()
}

#[tokio::test]
async fn managed_applications_flow_both_ways_and_converge() {
    let env = Env::managed(&["cluster1", "cluster2"]).await;
    let hub = env.hub_apps();

    // Create: one Application per cluster, and one with Argo CD's finalizer.
    for (name, i, extra) in [
        ("alpha", 0, json!({})),
        ("beta", 1, json!({})),
        (
            "gamma",
            0,
            json!({ "finalizers": [keys::RESOURCES_FINALIZER] }),
        ),
    ] {
        env.create(name, i, extra).await;
    }
    let mut expected: BTreeMap<String, usize> = [("alpha", 0), ("beta", 1), ("gamma", 0)]
        .map(|(n, i)| (n.to_string(), i))
        .into();
    // Converged alone also holds in the moment before the spokes' Argo CD
    // gives the new Applications a status (none on either side).
    wait::until(
        "created on the spokes, status on the hub",
        TIMEOUT,
        || async {
            env.converged(&expected).await?;
            for name in expected.keys() {
                if hub_field(&env, name, "/status/health/status")
                    .await
                    .is_none()
                {
                    return Err(format!("{name}: no health on the hub yet"));
                }
            }
            Ok(())
        },
    )
    .await;
    let delivered = env.spoke_apps(0).get("alpha").await.unwrap();
    assert_eq!(
        delivered
            .labels()
            .get(keys::HUB_MANAGED)
            .map(String::as_str),
        Some("true")
    );
    assert!(!delivered.annotations().contains_key(keys::SKIP_RECONCILE));
    assert!(!delivered.annotations().contains_key(keys::MANAGED_CLUSTER));
    assert_eq!(delivered.finalizers(), Vec::<String>::new());
    assert_eq!(
        env.spoke_apps(0).get("gamma").await.unwrap().finalizers(),
        vec![keys::RESOURCES_FINALIZER.to_string()]
    );
    assert_eq!(
        hub_field(&env, "alpha", "/status/health/status").await,
        Some(json!("Healthy"))
    );

    // Update on the hub: applied on the spoke.
    set_source(&hub, "alpha", "targetRevision", "v2").await;
    wait::until("the update on the spoke", TIMEOUT, || async {
        match spoke_field(&env, 0, "alpha", "/spec/source/targetRevision").await? {
            v if v == json!("v2") => Ok(()),
            v => Err(v.to_string()),
        }
    })
    .await;

    // Status changes on the spoke: on the hub copy.
    merge(
        &env.spoke_apps(1),
        "beta",
        json!({ "status": { "health": { "status": "Degraded", "message": "crash loop" } } }),
    )
    .await;
    wait::until("the spoke's status on the hub", TIMEOUT, || async {
        match hub_field(&env, "beta", "/status/health").await {
            Some(h) if h == json!({ "status": "Degraded", "message": "crash loop" }) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // A sync operation set on the hub runs once on the spoke and leaves the hub copy.
    merge(&hub, "alpha", json!({ "operation": { "sync": { "revision": "rev-1" }, "initiatedBy": { "username": "alice" } } })).await;
    wait::until(
        "the sync to run on the spoke and show on the hub",
        TIMEOUT,
        || async {
            let phase = hub_field(&env, "alpha", "/status/operationState/phase").await;
            let pending = hub_field(&env, "alpha", "/operation").await;
            match (phase, pending) {
                (Some(p), None) if p == json!("Succeeded") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(
        env.spokes[0].argocd.syncs_of("alpha"),
        vec!["rev-1".to_string()]
    );
    assert_eq!(
        hub_field(
            &env,
            "alpha",
            "/status/operationState/operation/initiatedBy/username"
        )
        .await,
        Some(json!("alice"))
    );

    // A refresh request set on the hub reaches the spoke once.
    merge(
        &hub,
        "gamma",
        json!({ "metadata": { "annotations": { keys::REFRESH: "hard" } } }),
    )
    .await;
    wait::until(
        "the refresh on the spoke, the request gone from the hub",
        TIMEOUT,
        || async {
            let refreshed = env.spokes[0].argocd.refreshes_of("gamma");
            let pending = hub_field(&env, "gamma", "/metadata/annotations").await;
            let pending = pending.is_some_and(|a| {
                a.get(keys::REFRESH).is_some() || a.get(keys::REFRESH_REQUEST).is_some()
            });
            if refreshed == 1 && !pending {
                Ok(())
            } else {
                Err(format!("refreshed {refreshed}, pending {pending}"))
            }
        },
    )
    .await;

    // A local edit on the spoke is reverted, an added field taken out.
    merge(
        &env.spoke_apps(0),
        "alpha",
        json!({ "spec": { "source": { "path": "edited" }, "revisionHistoryLimit": 3 } }),
    )
    .await;
    wait::until("the local edit reverted", TIMEOUT, || async {
        let spec = spoke_field(&env, 0, "alpha", "/spec").await?;
        if spec["source"]["path"] == json!("app") && spec.get("revisionHistoryLimit").is_none() {
            Ok(())
        } else {
            Err(spec.to_string())
        }
    })
    .await;

    // A local delete is undone: the hub owns the Application.
    env.spoke_apps(1)
        .delete("beta", &DeleteParams::default())
        .await
        .unwrap();
    wait::until("beta back on its spoke", TIMEOUT, || async {
        spoke_field(&env, 1, "beta", "/metadata/uid")
            .await
            .map(drop)
    })
    .await;

    // Delete with Argo CD's finalizer: gone from the spoke first, then from the hub.
    hub.delete("gamma", &DeleteParams::default()).await.unwrap();
    wait::until("gamma gone from both sides", TIMEOUT, || async {
        let spoke = env
            .spoke_apps(0)
            .get_opt("gamma")
            .await
            .map_err(|e| e.to_string())?;
        let hub = env
            .hub_apps()
            .get_opt("gamma")
            .await
            .map_err(|e| e.to_string())?;
        match (spoke, hub) {
            (None, None) => Ok(()),
            (s, h) => Err(format!(
                "spoke {:?} hub {:?}",
                s.map(|a| a.metadata.deletion_timestamp),
                h.map(|a| a.finalizers().to_vec())
            )),
        }
    })
    .await;
    // Without a finalizer: the spoke copy goes too.
    hub.delete("beta", &DeleteParams::default()).await.unwrap();
    expected.remove("gamma");
    expected.remove("beta");
    wait::until("converged after the deletes", TIMEOUT, || {
        env.converged(&expected)
    })
    .await;

    // Nothing ran twice.
    assert_eq!(
        env.spokes[0].argocd.syncs_of("alpha"),
        vec!["rev-1".to_string()]
    );
    assert_eq!(env.spokes[0].argocd.refreshes_of("gamma"), 1);
    let metrics = env.hub_process.as_ref().unwrap().metrics().await;
    assert!(
        metrics.contains("argocd_pull_hub_grpc_agent_connected{cluster=\"cluster1\"} 1"),
        "{metrics}"
    );
}
