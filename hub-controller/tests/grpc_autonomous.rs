//! Autonomous mode on real API servers: Applications are defined on the
//! managed cluster; the hub shows a read-only mirror of each in the
//! namespace named after the cluster, and may only ask for a sync or a
//! refresh, which run once on the spoke. Mirrors follow the spoke through
//! changes, deletions and a hub restart.

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_spoke_agent::Mode;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use testenv::wait;

mod common;
mod grpc_env;
use common::{merge, set_source};
use grpc_env::{Env, SPOKE_NS, TIMEOUT};

const AUTONOMOUS: usize = 1;

fn local_app(name: &str, path: &str) -> Application {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": SPOKE_NS, "labels": { "owner": "spoke-team" } },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://git.example/local.git", "path": path },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": name }
        }
    }))
    .unwrap()
}

fn mirrors(env: &Env) -> Api<Application> {
    Api::namespaced_with(env.hub_client.clone(), "cluster2", &application_resource())
}

/// Every Application of the autonomous spoke has a faithful mirror, and
/// there is no other mirror.
async fn mirrored(env: &Env) -> Result<(), String> {
    let spoke = common::by_name(&env.spoke_apps(AUTONOMOUS), &Default::default()).await?;
    let mirror_label = kube::api::ListParams::default().labels(keys::MIRROR_OF);
    let hub = common::by_name(&mirrors(env), &mirror_label).await?;
    if spoke.keys().collect::<Vec<_>>() != hub.keys().collect::<Vec<_>>() {
        return Err(format!(
            "spoke {:?}, mirrors {:?}",
            spoke.keys().collect::<Vec<_>>(),
            hub.keys().collect::<Vec<_>>()
        ));
    }
    for (name, s) in &spoke {
        let m = &hub[name];
        let mut spec = s.data["spec"].clone();
        spec["destination"] =
            json!({ "name": "cluster2", "namespace": spec["destination"]["namespace"] });
        if m.data["spec"] != spec {
            return Err(format!("{name}: mirror spec {} != {spec}", m.data["spec"]));
        }
        let status = s.data.get("status").cloned().unwrap_or(json!({}));
        if m.data.get("status").cloned().unwrap_or(json!({})) != status {
            return Err(format!(
                "{name}: mirror status {:?} != {status}",
                m.data.get("status")
            ));
        }
        if m.data.get("operation").is_some_and(|o| !o.is_null())
            || m.annotations().contains_key(keys::REFRESH)
        {
            return Err(format!("{name}: a command is pending on the mirror"));
        }
        if m.annotations()
            .get(keys::SKIP_RECONCILE)
            .map(String::as_str)
            != Some("true")
        {
            return Err(format!(
                "{name}: the hub's Argo CD would reconcile the mirror"
            ));
        }
    }
    Ok(())
}

async fn mirror_field(env: &Env, name: &str, pointer: &str) -> Option<Value> {
    let m = mirrors(env).get_opt(name).await.ok()??;
    serde_json::to_value(&m).unwrap().pointer(pointer).cloned()
}

#[tokio::test]
async fn the_hub_mirrors_an_autonomous_cluster_and_may_only_ask_for_syncs_and_refreshes() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    grpc_env::mode::configure(&env.hub_client, "cluster2", "autonomous").await;
    env.start_hub(&[]).await;
    env.start_agent(0, Mode::Managed);
    env.start_agent(AUTONOMOUS, Mode::Autonomous);
    env.wait_connected().await;
    let spoke = env.spoke_apps(AUTONOMOUS);
    for (name, path) in [("local-a", "a"), ("local-b", "b")] {
        common::create(&spoke, &local_app(name, path)).await;
    }
    wait::until("mirrors of the spoke's Applications", TIMEOUT, || {
        mirrored(&env)
    })
    .await;
    let m = mirrors(&env).get("local-a").await.unwrap();
    assert_eq!(
        m.labels().get("owner").map(String::as_str),
        Some("spoke-team")
    );
    assert_eq!(
        m.labels().get(keys::MIRROR_OF).map(String::as_str),
        Some("cluster2")
    );
    assert_eq!(
        m.annotations().get(keys::MIRROR_SOURCE).map(String::as_str),
        Some("argocd/local-a")
    );
    assert!(m.finalizers().is_empty());

    // The spoke changes its Application and its status: the mirror follows.
    merge(
        &spoke,
        "local-a",
        json!({ "spec": { "source": { "path": "a2" } },
                                  "status": { "health": { "status": "Degraded" } } }),
    )
    .await;
    wait::until("the mirror follows the spoke", TIMEOUT, || async {
        match mirror_field(&env, "local-a", "/spec/source/path").await {
            Some(p) if p == "a2" => mirrored(&env).await,
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The mirror is read-only: an edit on the hub is reverted.
    merge(
        &mirrors(&env),
        "local-a",
        json!({ "spec": { "source": { "path": "hub-edit" }, "revisionHistoryLimit": 1 } }),
    )
    .await;
    wait::until("the hub edit reverted", TIMEOUT, || async {
        match mirror_field(&env, "local-a", "/spec").await {
            Some(s) if s["source"]["path"] == "a2" && s.get("revisionHistoryLimit").is_none() => {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        spoke.get("local-a").await.unwrap().data["spec"]["source"]["path"],
        "a2",
        "the spoke never sees a hub edit"
    );

    // The hub may ask for a sync and a refresh; each runs once on the spoke.
    merge(
        &mirrors(&env),
        "local-b",
        json!({ "operation": { "sync": { "revision": "from-hub" } },
                                  "metadata": { "annotations": { keys::REFRESH: "normal" } } }),
    )
    .await;
    wait::until("the sync and refresh run on the spoke", TIMEOUT, || async {
        let syncs = env.spokes[AUTONOMOUS].argocd.syncs_of("local-b");
        let refreshes = env.spokes[AUTONOMOUS].argocd.refreshes_of("local-b");
        if syncs == ["from-hub"] && refreshes == 1 {
            mirrored(&env).await
        } else {
            Err(format!("syncs {syncs:?}, refreshes {refreshes}"))
        }
    })
    .await;
    assert_eq!(
        mirror_field(&env, "local-b", "/status/operationState/phase").await,
        Some(json!("Succeeded"))
    );

    // A pull-model Application cannot target an autonomous cluster.
    env.create("pushed", AUTONOMOUS, json!({})).await;
    wait::until("the refusal on pushed", TIMEOUT, || async {
        let a = env
            .hub_apps()
            .get("pushed")
            .await
            .map_err(|e| e.to_string())?;
        let s = a
            .data
            .get("status")
            .map(|s| s.to_string())
            .unwrap_or_default();
        if s.contains("AutonomousCluster") {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
    assert!(spoke.get_opt("pushed").await.unwrap().is_none());

    // The spoke deletes one: its mirror goes.
    spoke
        .delete("local-a", &DeleteParams::default())
        .await
        .unwrap();
    wait::until("local-a's mirror deleted", TIMEOUT, || mirrored(&env)).await;

    // While the hub is down the spoke deletes one and creates another.
    env.kill_hub().await;
    spoke
        .delete("local-b", &DeleteParams::default())
        .await
        .unwrap();
    common::create(&spoke, &local_app("local-c", "c")).await;
    env.start_hub(&[]).await;
    wait::until("mirrors caught up after the hub restart", TIMEOUT, || {
        mirrored(&env)
    })
    .await;
    assert_eq!(
        env.spokes[AUTONOMOUS].argocd.syncs_of("local-b"),
        vec!["from-hub".to_string()]
    );

    // Someone's own hub Application in the cluster's namespace is never
    // taken over by a mirror of the same name: it gets a Warning event and
    // stays as it is.
    let mut own = local_app("local-d", "hub-own");
    own.metadata.namespace = Some("cluster2".into());
    common::create(&mirrors(&env), &own).await;
    common::create(&spoke, &local_app("local-d", "spoke-d")).await;
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(env.hub_client.clone(), "cluster2");
    wait::warning(
        &events,
        "involvedObject.name=local-d",
        "MirrorNameTaken",
        TIMEOUT,
    )
    .await;
    let kept = mirrors(&env).get("local-d").await.unwrap();
    assert_eq!(kept.data["spec"]["source"]["path"], "hub-own");
    assert!(!kept.labels().contains_key(keys::MIRROR_OF));
}

/// The names of the mirrors of cluster2 on the hub.
async fn mirror_names(env: &Env) -> Vec<String> {
    mirrors(env)
        .list(&kube::api::ListParams::default().labels(keys::MIRROR_OF))
        .await
        .map(|l| l.items.iter().map(|a| a.name_any()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn an_autonomous_agent_cannot_make_the_hub_hold_more_than_its_limits() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    grpc_env::mode::configure(&env.hub_client, "cluster2", "autonomous").await;
    env.start_hub(&[
        "--grpc-max-mirrors-per-cluster=3",
        "--grpc-max-mirror-bytes-per-cluster=32768",
    ])
    .await;
    env.start_agent(AUTONOMOUS, Mode::Autonomous);
    env.wait_connected().await;
    let spoke = env.spoke_apps(AUTONOMOUS);
    let create = |app: Application| {
        let spoke = spoke.clone();
        async move { spoke.create(&PostParams::default(), &app).await.unwrap() }
    };
    let refused = |reason: &'static str| {
        let env = &env;
        async move {
            let m = env.hub_process.as_ref().unwrap().metrics().await;
            grpc_env::series::value(
                &m,
                &format!(
                    "argocd_pull_hub_grpc_refused_total{{cluster=\"cluster2\",reason=\"{reason}\"}}"
                ),
            )
        }
    };

    create(local_app("small-a", "a")).await;
    create(local_app("small-b", "b")).await;
    // Over the bytes limit on its own (a 40 KiB annotation).
    let mut big = local_app("big", "big");
    big.annotations_mut()
        .insert("example.com/notes".into(), "x".repeat(40 << 10));
    create(big).await;
    wait::until(
        "the big one refused over the bytes limit",
        TIMEOUT,
        || async {
            match refused("over-limit").await {
                n if n >= 1.0 => Ok(()),
                n => Err(n),
            }
        },
    )
    .await;
    create(local_app("small-c", "c")).await;
    wait::until("three mirrors, the limit", TIMEOUT, || async {
        match mirror_names(&env).await {
            n if n == ["small-a", "small-b", "small-c"] => Ok(()),
            n => Err(n),
        }
    })
    .await;
    let before = refused("over-limit").await;
    create(local_app("small-d", "d")).await;
    wait::until("the fourth refused over the count", TIMEOUT, || async {
        match refused("over-limit").await {
            n if n > before => Ok(()),
            n => Err(n),
        }
    })
    .await;
    env.assert_logged("over the limit (--grpc-max-mirror-bytes-per-cluster=32768)");
    env.assert_logged(
        "already has 3 Applications mirrored on the hub, the limit (--grpc-max-mirrors-per-cluster=3)",
    );
    assert_eq!(
        mirror_names(&env).await,
        ["small-a", "small-b", "small-c"],
        "nothing over the limits is mirrored"
    );
    // Nothing else stops: the agent stays connected, and a mirror within
    // the limits still follows its Application.
    assert!(env.spokes[AUTONOMOUS].agent.as_ref().unwrap().connected());
    set_source(&spoke, "small-a", "path", "a2").await;
    wait::until("the mirror follows its Application", TIMEOUT, || async {
        match mirror_field(&env, "small-a", "/spec/source/path").await {
            Some(p) if p == "a2" => Ok(()),
            other => Err(other),
        }
    })
    .await;
}
