//! The hub's AppProject check against the real stack, for the destination
//! forms users write: real OCM (its work agent delivers), and the managed
//! cluster's real Argo CD, which decides with the project it was sent.
//!
//! An Application of Argo CD's stock `default` project (`server: '*'`)
//! whose delivered copy names its destination `in-cluster` (annotation
//! `destination-name`, as argocd-pull-integration users write it) is
//! delivered, and the cluster's Argo CD deploys it: the hub resolves the
//! name as Argo CD does before matching. One naming a cluster only the
//! cluster's Argo CD could know is refused on the hub, with the annotation
//! to change. The rule itself is compared with Argo CD's own code case by
//! case in `core/tests/project_rule.rs`.

use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::status::CONDITION;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::argocd::{GitServer, Spoke, SpokeOptions, appproject_resource};
use testenv::ocm::{Fleet, JoinOptions};
use testenv::wait;

mod common;
use common::ocm::place_everywhere;
use common::{app, apps_api, first_manifest, merge, run_controller};

/// Real OCM and a real Argo CD on two shared cores.
const TIMEOUT: Duration = Duration::from_secs(180);
const ARGOCD: &str = "argocd";

/// The condition argocd-pull puts on a refused Application, if any.
fn refusal(a: &Application) -> Option<String> {
    a.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
        .and_then(|c| c["message"].as_str().map(String::from))
}

/// Argo CD's `default` project exactly as its API server creates it.
async fn stock_default_project(client: &kube::Client) {
    let projects: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ARGOCD, &appproject_resource());
    projects
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": {
                "sourceNamespaces": null,
                "sourceRepos": ["*"],
                "destinations": [{ "server": "*", "namespace": "*" }],
                "clusterResourceWhitelist": [{ "group": "*", "kind": "*" }] } })),
        )
        .await
        .unwrap();
}

/// `argocd/<name>` for cluster1 over ManifestWork, of project `default`,
/// deploying `repo`'s `app` folder to namespace `guestbook` of the cluster
/// the annotation `destination-name` names.
fn named_destination_app(name: &str, repo: &str, destination_name: &str) -> Application {
    let mut a = app(
        name,
        ARGOCD,
        json!({ keys::MANAGED_CLUSTER: "cluster1",
                keys::DESTINATION_NAME: destination_name,
                keys::TRANSPORT: "manifestwork" }),
        json!({}),
    );
    a.data["spec"]["source"] = json!({ "repoURL": repo, "path": "app", "targetRevision": "main" });
    a.data["spec"]["syncPolicy"] = json!({ "automated": {} });
    a
}

#[tokio::test]
async fn a_destination_named_in_cluster_is_delivered_under_the_stock_default_project() {
    testenv::init_tracing();
    let fleet = Fleet::start("hub", &[("cluster1", JoinOptions::default())])
        .await
        .expect("the hub starts and cluster1 joins");
    let hub = fleet.hub.cluster();
    let managed = fleet.cluster("cluster1");
    let client = hub.client().await.unwrap();
    let spoke_client = managed.client().await.unwrap();
    hub.ensure_namespace(ARGOCD).await.unwrap();
    managed.ensure_namespace("guestbook").await.unwrap();
    stock_default_project(&client).await;
    place_everywhere(&client, ARGOCD).await;
    let (spoke, git) = tokio::join!(
        Spoke::start(managed, SpokeOptions::default()),
        GitServer::start()
    );
    let (_spoke, git) = (
        spoke.expect("Argo CD starts on cluster1"),
        git.expect("the Git server starts"),
    );
    let repo = git.create_repo("multi").unwrap();
    repo.commit(
        "a ConfigMap",
        &[(
            "app/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: multi\ndata:\n  colour: teal\n",
        )],
    )
    .unwrap();
    let (_ctx, _stop) = run_controller(client.clone()).await;

    let apps = apps_api(&client, ARGOCD);
    apps.create(
        &PostParams::default(),
        &named_destination_app("multi", repo.url(), "in-cluster"),
    )
    .await
    .unwrap();

    // Delivered (not refused): its work, with the destination by name.
    let works: Api<ManifestWork> = Api::namespaced(client.clone(), "cluster1");
    let work = wait::until("argocd.multi delivered or refused", TIMEOUT, || async {
        if let Some(w) = works
            .get_opt("argocd.multi")
            .await
            .map_err(|e| e.to_string())?
        {
            return Ok(w);
        }
        let a = apps.get("multi").await.map_err(|e| e.to_string())?;
        match refusal(&a) {
            Some(m) => panic!("argocd/multi was refused: {m}"),
            None => Err("neither yet".to_string()),
        }
    })
    .await;
    assert_eq!(
        first_manifest(&work)["spec"]["destination"],
        json!({ "name": "in-cluster", "namespace": "guestbook" })
    );

    // The cluster's Argo CD, with the project it was sent, deploys it.
    let configmaps: Api<ConfigMap> = Api::namespaced(spoke_client.clone(), "guestbook");
    let cm = wait::until(
        "Argo CD on cluster1 deploys ConfigMap multi",
        TIMEOUT,
        || async {
            configmaps
                .get_opt("multi")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    assert_eq!(cm.data.unwrap()["colour"], "teal");
    let projects: Api<DynamicObject> =
        Api::namespaced_with(spoke_client.clone(), ARGOCD, &appproject_resource());
    let sent = projects.get("default").await.unwrap();
    assert_eq!(
        sent.data["spec"]["destinations"],
        json!([{ "name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "*" }])
    );
    let spoke_apps: Api<Application> =
        Api::namespaced_with(spoke_client.clone(), ARGOCD, &application_resource());
    wait::until("Synced on cluster1", TIMEOUT, || async {
        let a = spoke_apps.get("multi").await.map_err(|e| e.to_string())?;
        match a.data["status"]["sync"]["status"].as_str() {
            Some("Synced") => Ok(()),
            _ => Err(a.data["status"].to_string()),
        }
    })
    .await;
    assert!(
        refusal(&apps.get("multi").await.unwrap()).is_none(),
        "argocd/multi has a refusal"
    );

    // A name only the cluster's Argo CD could resolve is refused on the
    // hub, with the annotation to change; naming in-cluster again
    // delivers it.
    apps.create(
        &PostParams::default(),
        &named_destination_app("elsewhere", repo.url(), "spoke-local"),
    )
    .await
    .unwrap();
    let message = wait::until("argocd/elsewhere refused", TIMEOUT, || async {
        let a = apps.get("elsewhere").await.map_err(|e| e.to_string())?;
        refusal(&a).ok_or_else(|| "no refusal yet".to_string())
    })
    .await;
    assert!(
        message.starts_with("ProjectNotPermitted: application destination name \"spoke-local\"")
            && message.contains(keys::DESTINATION_NAME),
        "{message}"
    );
    assert!(works.get_opt("argocd.elsewhere").await.unwrap().is_none());
    merge(
        &apps,
        "elsewhere",
        json!({ "metadata": { "annotations": { keys::DESTINATION_NAME: "in-cluster" } } }),
    )
    .await;
    wait::exists(&works, "argocd.elsewhere", TIMEOUT).await;
}
