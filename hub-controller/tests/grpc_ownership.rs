//! One owner per spoke Application, on real API servers: two hub
//! Applications from two teams, each authorized for the cluster, name the
//! same Application on it (same name, `ocm-managed-cluster-app-namespace`
//! pointing both at `argocd`). The one delivered first keeps it; the later
//! one is refused with a condition and an Event naming the holder, never
//! shows the holder's status, and deleting it leaves the spoke alone. The
//! later one's namespace sorts first, so a rule of "first by name" (the
//! old one) fails here.

use argocd_pull_hub_controller::status::CONDITION;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::wait;

mod common;
mod grpc_env;
use grpc_env::{Env, TIMEOUT};

fn spec(path: &str) -> Value {
    json!({ "spec": {
        "project": "default",
        "source": { "repoURL": "https://git.example/repo.git", "path": path, "targetRevision": "HEAD" },
        "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" }
    } })
}

#[tokio::test]
async fn the_first_delivered_keeps_the_spoke_application() {
    let env = Env::managed(&["cluster1"]).await;
    let spoke = env.spoke_apps(0);

    // Team A delivers `shared` first.
    let hub_a = env.hub_apps();
    env.create("shared", 0, spec("team-a")).await;
    let path_on_spoke = |want: &'static str| {
        let spoke = spoke.clone();
        async move {
            let a = spoke.get_opt("shared").await.map_err(|e| e.to_string())?;
            match a {
                Some(a) if a.data["spec"]["source"]["path"] == want => Ok(a),
                other => Err(format!(
                    "{:?}",
                    other.map(|a| a.data["spec"]["source"].clone())
                )),
            }
        }
    };
    let first = wait::until("team A's Application on the spoke", TIMEOUT, || {
        path_on_spoke("team-a")
    })
    .await;
    wait::until(
        "team A's hub copy shows the spoke's health",
        TIMEOUT,
        || async {
            let a = hub_a.get("shared").await.map_err(|e| e.to_string())?;
            if a.data["status"]["health"]["status"].is_string() {
                Ok(())
            } else {
                Err(a.data["status"].to_string())
            }
        },
    )
    .await;

    // Team B, in a namespace that sorts first, asks for the same one.
    let ns_b = env.hub.namespace("aaa").await.unwrap();
    assert!(ns_b < env.team, "{ns_b} sorts before {}", env.team);
    common::placement_selects(&env.hub_client, &ns_b, &["cluster1"]).await;
    let hub_b = common::apps_api(&env.hub_client, &ns_b);
    let mut b = env.app("shared", 0, spec("team-b"));
    b.metadata.namespace = Some(ns_b.clone());
    hub_b.create(&PostParams::default(), &b).await.unwrap();

    let holder = format!("{}/shared", env.team);
    let refused = wait::until("team B refused, naming the holder", TIMEOUT, || async {
        let b = hub_b.get("shared").await.map_err(|e| e.to_string())?;
        let condition = b.data["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
            .and_then(|c| c["message"].as_str())
            .map(str::to_string);
        match condition {
            Some(m) if m.starts_with("SpokeConflict: ") && m.contains(&holder) => Ok(b),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let status = &refused.data["status"];
    assert!(
        status.get("health").is_none() && status.get("sync").is_none(),
        "the refused Application never shows the holder's status: {status}"
    );
    // The Event follows the condition's write: wait for it.
    let events: Api<Event> = Api::namespaced(env.hub_client.clone(), &ns_b);
    let conflict = wait::warning(
        &events,
        "involvedObject.name=shared",
        "SpokeConflict",
        TIMEOUT,
    )
    .await;
    assert!(conflict.message.unwrap_or_default().contains(&holder));
    // The spoke still has team A's, the same object.
    let now = path_on_spoke("team-a").await.expect("still team A's");
    assert_eq!(now.metadata.uid, first.metadata.uid);

    // Deleting the refused one leaves the spoke alone; team A keeps going.
    hub_b
        .delete("shared", &DeleteParams::default())
        .await
        .unwrap();
    wait::gone(&hub_b, "shared", TIMEOUT).await;
    hub_a
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(spec("team-a2")),
        )
        .await
        .unwrap();
    let later = wait::until("team A's change on the spoke", TIMEOUT, || {
        path_on_spoke("team-a2")
    })
    .await;
    assert_eq!(
        later.metadata.uid, first.metadata.uid,
        "never deleted on the spoke"
    );
    let a = hub_a.get("shared").await.unwrap();
    assert!(
        a.data["status"]["conditions"]
            .as_array()
            .is_none_or(|cs| cs.iter().all(|c| c["type"] != CONDITION)),
        "team A never refused: {}",
        a.data["status"]
    );
}

/// Commands follow the hub's record of what it authorized: a sync set on
/// a hub Application refused for a spoke Application another one holds is
/// never sent (its hub copy is not even stamped), while the holder's
/// reaches the cluster.
#[tokio::test]
async fn only_the_hub_application_the_spoke_copy_was_granted_to_gets_its_sync_sent() {
    let env = Env::managed(&["cluster1"]).await;
    // Nothing runs the operations on the spoke: they stay where they land.
    env.spokes[0].argocd.stop();
    let spoke = env.spoke_apps(0);
    let hub_a = env.hub_apps();
    env.create("shared", 0, spec("team-a")).await;
    wait::until("team A's Application on the spoke", TIMEOUT, || async {
        spoke
            .get_opt("shared")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let ns_b = env.hub.namespace("bbb").await.unwrap();
    common::placement_selects(&env.hub_client, &ns_b, &["cluster1"]).await;
    let hub_b = common::apps_api(&env.hub_client, &ns_b);
    let mut b = env.app("shared", 0, spec("team-b"));
    b.metadata.namespace = Some(ns_b.clone());
    hub_b.create(&PostParams::default(), &b).await.unwrap();
    wait::until("team B refused", TIMEOUT, || async {
        let b = hub_b.get("shared").await.map_err(|e| e.to_string())?;
        let refused = b.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == CONDITION
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("SpokeConflict: "))
            });
        refused.then_some(()).ok_or(b.data["status"].to_string())
    })
    .await;

    let sync = |revision: &str| json!({ "operation": { "sync": { "revision": revision } } });
    common::merge(&hub_b, "shared", sync("from-b")).await;
    common::merge(&hub_a, "shared", sync("from-a")).await;
    wait::until("team A's sync on the spoke", TIMEOUT, || async {
        let a = spoke.get("shared").await.map_err(|e| e.to_string())?;
        let revision = a.data.pointer("/operation/sync/revision").cloned();
        (revision == Some(json!("from-a")))
            .then_some(())
            .ok_or(format!("{revision:?}"))
    })
    .await;
    let b = hub_b.get("shared").await.unwrap();
    assert_eq!(
        b.data["operation"],
        sync("from-b")["operation"],
        "team B's sync was stamped for sending: {}",
        b.data["operation"]
    );
}
