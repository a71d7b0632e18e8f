//! A hostile tenant on real API servers: someone who may create
//! Applications in their own hub namespace and nothing else tries to
//! reach another team's or another cluster's share.

use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork};
use argocd_pull_hub_controller::render::work::work_name;
use argocd_pull_hub_controller::status::CONDITION;
use argocd_pull_spoke_agent::Mode;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use testenv::wait;

mod common;
mod grpc_env;
use common::merge;
use grpc_env::{Env, SPOKE_NS, TIMEOUT};

/// The mirror-version annotation the hub writes on its mirrors.
const MIRROR_VERSION: &str = "argocd-pull.io/observed-version";

/// An Application in the tenant's namespace dressed as a mirror of
/// `cluster`'s `argocd/<source>`.
fn forged_mirror(ns: &str, name: &str, cluster: &str, source: &str) -> Application {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": ns,
            "labels": { keys::MIRROR_OF: cluster, keys::PULL_LABEL: "true" },
            "annotations": {
                keys::MIRROR_SOURCE: format!("{SPOKE_NS}/{source}"),
                MIRROR_VERSION: "forged",
                keys::MANAGED_CLUSTER: cluster,
                keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NS,
            } },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://git.example/forged.git", "path": "x" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "x" }
        }
    }))
    .unwrap()
}

fn spoke_app(name: &str) -> Application {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": SPOKE_NS },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://git.example/local.git", "path": name },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": name }
        }
    }))
    .unwrap()
}

/// Hole 3: Applications a tenant labels `argocd-pull.io/mirror-of` in its
/// own namespace are not the cluster's mirrors: they do not count against
/// its mirror limit (a real Application of the cluster is mirrored) and
/// are neither mirrored over nor delivered anywhere.
#[tokio::test]
async fn a_tenants_forged_mirrors_do_not_count_against_a_cluster() {
    const LIMIT: usize = 3;
    let mut env = Env::new(&["cluster1"]).await;
    grpc_env::mode::configure(&env.hub_client, "cluster1", "autonomous").await;
    // The forgeries exist before the hub starts, as they would after a
    // restart: more than the cluster's whole mirror allowance.
    let hub_apps = env.hub_apps();
    for i in 0..LIMIT + 2 {
        let name = format!("forged-{i}");
        hub_apps
            .create(
                &PostParams::default(),
                &forged_mirror(&env.team, &name, "cluster1", &name),
            )
            .await
            .unwrap();
    }
    let limit = format!("--grpc-max-mirrors-per-cluster={LIMIT}");
    env.start_hub(&[&limit]).await;
    env.start_agent(0, Mode::Autonomous);
    env.wait_connected().await;
    env.spoke_apps(0)
        .create(&PostParams::default(), &spoke_app("real"))
        .await
        .unwrap();

    let mirrors = common::apps_api(&env.hub_client, "cluster1");
    wait::until(
        "the cluster's real Application mirrored",
        TIMEOUT,
        || async {
            match mirrors.get_opt("real").await {
                Ok(Some(m))
                    if m.labels().get(keys::MIRROR_OF).map(String::as_str) == Some("cluster1") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let log = env.hub_log();
    assert!(
        !log.contains("Applications mirrored on the hub, the limit"),
        "the forgeries counted against cluster1's limit:\n{log}"
    );
    // Nothing was made of the forgeries: no mirror in cluster1's
    // namespace, nothing delivered on the cluster, the objects untouched.
    assert_eq!(common::names(&mirrors).await.unwrap(), ["real"]);
    assert_eq!(common::names(&env.spoke_apps(0)).await.unwrap(), ["real"]);
    for i in 0..LIMIT + 2 {
        let f = hub_apps.get(&format!("forged-{i}")).await.unwrap();
        assert!(
            f.data.get("status").is_none_or(|s| s.is_null()),
            "forged-{i} was written to: {:?}",
            f.data.get("status")
        );
    }
}

/// How soon a refused claimant must show why: seconds, not the 40 s of
/// silence the issue saw.
const TOLD_WITHIN: Duration = Duration::from_secs(15);

/// The `PullDeliveryError` message on `app`, if any.
fn condition(app: &Application) -> Option<String> {
    app.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
        .and_then(|c| c["message"].as_str())
        .map(str::to_string)
}

async fn refused_naming(api: &Api<Application>, owner: &str) -> Application {
    wait::until(
        &format!("{:?} refused naming {owner}", api.resource_url()),
        TOLD_WITHIN,
        || async {
            let a = api.get("shared").await.map_err(|e| e.to_string())?;
            match condition(&a) {
                Some(m) if m.starts_with("SpokeConflict: ") && m.contains(owner) => Ok(a),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// No ManifestWork for `ns`/`name`: the refused one gets none.
async fn no_work(works: &Api<ManifestWork>, ns: &str, name: &str) {
    let work = works.get_opt(&work_name(ns, name)).await.unwrap();
    assert!(work.is_none(), "no work for the refused one");
}

/// A tenant namespace whose Placement selects cluster1, and its
/// Application `shared` aimed at cluster1's `argocd/shared` by
/// ManifestWork.
async fn manifestwork_claimant(env: &Env, prefix: &str) -> (String, Api<Application>) {
    let ns = env.hub.namespace(prefix).await.unwrap();
    common::placement_selects(&env.hub_client, &ns, &["cluster1"]).await;
    let api = common::apps_api(&env.hub_client, &ns);
    let mut app = env.app(
        "shared",
        0,
        json!({ "metadata": { "annotations": { keys::TRANSPORT: "manifestwork" } },
                "finalizers": ["resources-finalizer.argocd.argoproj.io"] }),
    );
    app.metadata.namespace = Some(ns.clone());
    api.create(&PostParams::default(), &app).await.unwrap();
    (ns, api)
}

/// The team's `shared` created for cluster1's `argocd/shared` over gRPC,
/// once the agent has applied it: its Applications API and uid.
async fn delivered_over_grpc(env: &Env) -> (Api<Application>, String) {
    let api = env.hub_apps();
    let app = api
        .create(&PostParams::default(), &env.app("shared", 0, json!({})))
        .await
        .unwrap();
    let uid = app.metadata.uid.clone().unwrap();
    let spoke = env.spoke_apps(0);
    wait::until("the copy applied by cluster1's agent", TIMEOUT, || async {
        match spoke.get_opt("shared").await {
            Ok(Some(a)) if a.annotations().get(keys::HUB_UID) == Some(&uid) => Ok(()),
            other => Err(format!(
                "{:?}",
                other.map(|a| a.map(|a| a.annotations().clone()))
            )),
        }
    })
    .await;
    (api, uid)
}

/// Hole 4 and one owner per spoke key: `argocd/shared` on cluster1 is
/// held over gRPC by the oldest hub Application; younger ones asking for it
/// by ManifestWork are told (`SpokeConflict` naming the owner) within
/// seconds and get no work; when the owner goes, the oldest of them takes
/// over and the other names it; deleting a refused one never touches the
/// owner's work.
#[tokio::test]
async fn one_owner_per_spoke_key_whatever_transport_asks() {
    let env = Env::managed(&["cluster1"]).await;
    let spoke = env.spoke_apps(0);
    let works: Api<ManifestWork> = Api::namespaced(env.hub_client.clone(), "cluster1");

    // The owner: delivered over gRPC.
    let (owner_api, owner_uid) = delivered_over_grpc(&env).await;
    // creationTimestamp has one-second resolution: the claimants come a
    // second later, so that the owner is the oldest by time, not by uid.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // A tenant asks for the same spoke Application by ManifestWork.
    let (ns_a, api_a) = manifestwork_claimant(&env, "aaa").await;
    let owner_ref = format!("{}/shared", env.team);
    refused_naming(&api_a, &owner_ref).await;
    no_work(&works, &ns_a, "shared").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Another one, younger still.
    let (ns_z, api_z) = manifestwork_claimant(&env, "zzz").await;
    refused_naming(&api_z, &owner_ref).await;
    let copy = spoke.get("shared").await.unwrap();
    assert_eq!(
        copy.annotations().get(keys::HUB_UID),
        Some(&owner_uid),
        "the owner keeps its copy"
    );

    // The owner goes: the oldest claimant left takes over (its work is
    // written) and the younger one now names it.
    owner_api
        .delete("shared", &DeleteParams::default())
        .await
        .unwrap();
    wait::exists(&works, &work_name(&ns_a, "shared"), TIMEOUT).await;
    refused_naming(&api_z, &format!("{ns_a}/shared")).await;
    no_work(&works, &ns_z, "shared").await;

    // Deleting the refused one (it holds Argo CD's finalizer) releases it
    // and never touches the owner's work.
    api_z
        .delete("shared", &DeleteParams::default())
        .await
        .unwrap();
    wait::gone(&api_z, "shared", TIMEOUT).await;
    let work = works.get(&work_name(&ns_a, "shared")).await.unwrap();
    assert!(
        work.metadata.deletion_timestamp.is_none(),
        "the owner's work stays"
    );
    let a = api_a.get("shared").await.unwrap();
    assert_eq!(
        condition(&a),
        None,
        "the new owner is not refused: {}",
        a.data["status"]
    );
}

/// A tenant namespace whose Placement selects cluster1, and its
/// Application `shared`, delivered by ManifestWork to cluster1 in another
/// spoke namespace than `argocd` (its work is written): the older claimant
/// of the tests below.
async fn older_elsewhere(env: &Env, works: &Api<ManifestWork>) -> (String, Api<Application>) {
    let ns = env.hub.namespace("old").await.unwrap();
    common::placement_selects(&env.hub_client, &ns, &["cluster1"]).await;
    let api = common::apps_api(&env.hub_client, &ns);
    let mut app = env.app(
        "shared",
        0,
        json!({ "metadata": { "annotations": {
            keys::TRANSPORT: "manifestwork",
            keys::MANAGED_CLUSTER_APP_NAMESPACE: "elsewhere",
        } } }),
    );
    app.metadata.namespace = Some(ns.clone());
    api.create(&PostParams::default(), &app).await.unwrap();
    wait::exists(works, &work_name(&ns, "shared"), TIMEOUT).await;
    // creationTimestamp has one-second resolution: what comes next is
    // younger by time, not by uid.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    (ns, api)
}

/// Moves `api`'s `shared` onto cluster1's `argocd/shared`.
async fn move_onto_shared(api: &Api<Application>) {
    merge(
        api,
        "shared",
        json!({ "metadata": { "annotations": {
            keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NS,
        } } }),
    )
    .await;
}

/// Asserts that `api`'s `shared` shows no condition of ours.
async fn not_refused(api: &Api<Application>) {
    let holder = api.get("shared").await.unwrap();
    assert_eq!(
        condition(&holder),
        None,
        "the holder is not refused: {}",
        holder.data["status"]
    );
}

/// An older hub Application moved onto a spoke Application that a younger
/// one's ManifestWork delivers takes nothing: when a claim begins is the
/// tenant's choice (it sets the annotations), the work on the cluster is
/// not. The mover is refused naming the holder, whose work stays and who is
/// not refused.
#[tokio::test]
async fn an_older_application_moved_onto_a_held_key_takes_nothing() {
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&[]).await;
    let works: Api<ManifestWork> = Api::namespaced(env.hub_client.clone(), "cluster1");
    let (_, api_old) = older_elsewhere(&env, &works).await;

    // The holder: younger, its work delivers `argocd/shared`.
    let (ns_new, api_new) = manifestwork_claimant(&env, "new").await;
    let held = work_name(&ns_new, "shared");
    wait::exists(&works, &held, TIMEOUT).await;

    move_onto_shared(&api_old).await;
    refused_naming(&api_old, &format!("{ns_new}/shared")).await;
    let work = works.get(&held).await.unwrap();
    assert!(
        work.metadata.deletion_timestamp.is_none(),
        "the holder's work stays"
    );
    not_refused(&api_new).await;
}

/// The same over gRPC: a younger hub Application's copy applied by the
/// cluster's agent is held (the hub records what each agent reported
/// applying, in a Lease of its own namespace that no tenant writes), and
/// an older one moved onto it by ManifestWork is refused naming the
/// holder: its work is removed, the agent's copy stays the holder's.
#[tokio::test]
async fn an_older_application_moved_onto_a_key_held_over_grpc_takes_nothing() {
    let env = Env::managed(&["cluster1"]).await;
    held_over_grpc_is_kept(&env).await;
}

/// The same with two replicas: the agent reports to one that does not
/// lead, and the leader's ManifestWork transport, which never hears the
/// agent, reads the record.
#[tokio::test]
async fn with_two_replicas_a_key_held_over_grpc_is_kept_by_the_leaders_manifestwork_side() {
    let (mut env, _service) = grpc_env::replicas::replicas_env(&["cluster1"]).await;
    let leader = env.start_replica("replica-leader", &[]).await;
    wait::until("the first replica leads", TIMEOUT, || async {
        leader.leads().await.then_some(()).ok_or("not yet")
    })
    .await;
    let server = env.start_replica("replica-server", &[]).await;
    env.grpc_addr = server.grpc;
    env.start_agent(0, Mode::Managed);
    wait::until(
        "the agent reports to the replica that does not lead",
        TIMEOUT,
        || async {
            (server.agents().await == ["cluster1"] && !server.leads().await)
                .then_some(())
                .ok_or("not yet")
        },
    )
    .await;
    held_over_grpc_is_kept(&env).await;
    assert!(
        leader.leads().await,
        "the leader decided the ManifestWork side"
    );
}

/// Cluster1's agent holds `argocd/shared` for a younger hub Application;
/// an older one moved onto it by ManifestWork takes nothing.
async fn held_over_grpc_is_kept(env: &Env) {
    let works: Api<ManifestWork> = Api::namespaced(env.hub_client.clone(), "cluster1");
    let (ns_old, api_old) = older_elsewhere(env, &works).await;

    // The holder: younger, delivered over gRPC, applied by the agent.
    let (holder_api, holder_uid) = delivered_over_grpc(env).await;
    let spoke = env.spoke_apps(0);
    // The hub records it (within a second or two of the agent's report).
    let leases: Api<Lease> = Api::namespaced(env.hub_client.clone(), "argocd-pull");
    wait::until(
        "the record of what cluster1's agent holds",
        TIMEOUT,
        || async {
            let l = leases
                .get_opt("argocd-pull-holders-cluster1")
                .await
                .map_err(|e| e.to_string())?;
            let record = l
                .as_ref()
                .and_then(|l| l.annotations().get("argocd-pull.io/holders").cloned())
                .unwrap_or_default();
            let want = format!(r#""{SPOKE_NS}/shared":"{holder_uid}""#);
            if record.contains(&want) {
                Ok(())
            } else {
                Err(record)
            }
        },
    )
    .await;

    move_onto_shared(&api_old).await;
    refused_naming(&api_old, &format!("{}/shared", env.team)).await;
    wait::until("the mover's work removed", TIMEOUT, || async {
        match works.get_opt(&work_name(&ns_old, "shared")).await {
            Ok(None) => Ok(()),
            Ok(Some(w)) if w.metadata.deletion_timestamp.is_some() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    not_refused(&holder_api).await;
    let copy = spoke.get("shared").await.unwrap();
    assert_eq!(
        copy.annotations().get(keys::HUB_UID),
        Some(&holder_uid),
        "the agent's copy stays the holder's"
    );

    // A cluster that leaves OCM takes its record along.
    let clusters: Api<ManagedCluster> = Api::all(env.hub_client.clone());
    clusters
        .delete("cluster1", &DeleteParams::default())
        .await
        .unwrap();
    wait::gone(&leases, "argocd-pull-holders-cluster1", TIMEOUT).await;
}
