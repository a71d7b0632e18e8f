//! A hostile managed cluster against the projects the hub delivers, on
//! real OCM: OCM's work role lets a cluster's klusterlet identity update
//! and patch the ManifestWorks of its own namespace, so a work's content
//! is the cluster's to write once delivered. An admin of cluster2, with
//! its klusterlet's real hub credentials, rewrites the project inside the
//! work of a refused Application (whose copy the hub keeps on the
//! cluster): the hub never delivers a project because a work names it.
//! What a cluster gets follows from the hub's record of what it
//! authorized and delivered.

use std::time::Duration;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::render::work::work_name;
use argocd_pull_hub_controller::status::CONDITION;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::argocd::appproject_resource;
use testenv::ocm::{Fleet, JoinOptions};
use testenv::{paths, wait};

mod common;
use common::addon::run;
use common::ocm::place_everywhere;
use common::{app, apps_api, merge, run_controller};

const TIMEOUT: Duration = Duration::from_secs(120);
const ARGOCD: &str = "argocd";
const CLUSTER: &str = "cluster2";

/// Applies AppProject `name` with `spec` in the hub's Argo CD namespace,
/// as a hub admin would.
async fn project(client: &kube::Client, name: &str, spec: Value) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ARGOCD, &appproject_resource());
    let p: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": { "name": name, "namespace": ARGOCD }, "spec": spec,
    }))
    .unwrap();
    api.patch(
        name,
        &PatchParams::apply("hub-admin").force(),
        &Patch::Apply(&p),
    )
    .await
    .unwrap();
}

/// Project `team`: Applications of `ns`, anywhere, with `description`.
fn team(ns: &str, description: &str) -> Value {
    json!({ "sourceNamespaces": [ns], "sourceRepos": ["*"], "description": description,
            "destinations": [{ "server": "*", "namespace": "*" }] })
}

/// The AppProject inside work `argocd-pull-project-<name>` once its
/// description is `want`.
async fn project_work_says(works: &Api<ManifestWork>, name: &str, want: &str) {
    let work = format!("argocd-pull-project-{name}");
    wait::until(&format!("{work} with {want:?}"), TIMEOUT, || async {
        let w = works
            .get_opt(&work)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no work {work}"))?;
        let manifests = w
            .spec
            .workload
            .and_then(|wl| wl.manifests)
            .unwrap_or_default();
        let d = manifests
            .first()
            .map(|m| serde_json::to_value(m).unwrap()["spec"]["description"].clone());
        (d == Some(json!(want)))
            .then_some(())
            .ok_or(format!("{d:?}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_project_a_cluster_writes_into_a_work_is_never_delivered() {
    testenv::init_tracing();
    let fleet = Fleet::start("hub", &[(CLUSTER, JoinOptions::default())])
        .await
        .expect("the hub starts and the cluster joins");
    let hub = fleet.hub.cluster();
    let client = hub.client().await.unwrap();
    hub.ensure_namespace(ARGOCD).await.unwrap();
    let managed = fleet.cluster(CLUSTER);
    managed.ensure_namespace(ARGOCD).await.unwrap();
    let ns = hub.namespace("aaa-team").await.unwrap();
    place_everywhere(&client, &ns).await;
    project(&client, "team", team(&ns, "first")).await;
    // A project that does not admit the tenant, with a credential.
    project(
        &client,
        "ccc",
        json!({ "sourceNamespaces": ["ccc-*"], "sourceRepos": ["*"],
                "destinations": [{ "server": "*", "namespace": "*" }] }),
    )
    .await;
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "ccc-repo", "namespace": ARGOCD,
                      "labels": { keys::ARGOCD_SECRET_TYPE: "repository" } },
        "stringData": { "url": "https://git.example/ccc.git", "password": "ccc", "project": "ccc" },
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ARGOCD)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let (_ctx, _stop) = run_controller(client.clone()).await;

    // Two Applications of team on cluster2, delivered through the real
    // work agent with their project.
    let apps = apps_api(&client, &ns);
    for name in ["web", "api"] {
        let mut a = app(
            name,
            &ns,
            json!({ keys::MANAGED_CLUSTER: CLUSTER }),
            json!({}),
        );
        a.data["spec"]["project"] = json!("team");
        a.data["spec"]["destination"]["namespace"] = json!("aaa-web");
        apps.create(&PostParams::default(), &a).await.unwrap();
    }
    let works: Api<ManifestWork> = Api::namespaced(client.clone(), CLUSTER);
    let web = work_name(&ns, "web");
    wait::exists(&works, &web, TIMEOUT).await;
    let spoke_projects: Api<DynamicObject> = Api::namespaced_with(
        managed.client().await.unwrap(),
        ARGOCD,
        &appproject_resource(),
    );
    wait::exists(&spoke_projects, "team", TIMEOUT).await;

    // web is refused (its project does not exist); its work stays.
    merge(&apps, "web", json!({ "spec": { "project": "missing" } })).await;
    wait::until("web refused", TIMEOUT, || async {
        let a = apps.get("web").await.map_err(|e| e.to_string())?;
        let refused = a
            .data
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["type"] == CONDITION
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains("project missing which does not exist"))
                })
            });
        refused.then_some(()).ok_or("not refused yet".to_string())
    })
    .await;

    // cluster2's admin, as its klusterlet, names ccc in web's work.
    let klusterlet = managed.dir().join("klusterlet/hub-kubeconfig/kubeconfig");
    let kubeconfig = klusterlet.to_str().unwrap();
    let kubectl = paths::bin_dir().join("kubectl");
    let whoami = run(&kubectl, &["--kubeconfig", kubeconfig, "auth", "whoami"]).await;
    assert!(
        whoami.contains(&format!("system:open-cluster-management:{CLUSTER}:")),
        "the klusterlet's hub identity: {whoami}"
    );
    run(
        &kubectl,
        &[
            "--kubeconfig",
            kubeconfig,
            "-n",
            CLUSTER,
            "patch",
            "manifestwork",
            &web,
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/workload/manifests/0/spec/project","value":"ccc"}]"#,
        ],
    )
    .await;
    let edited = works.get(&web).await.unwrap();
    let manifest =
        serde_json::to_value(&edited.spec.workload.unwrap().manifests.unwrap()[0]).unwrap();
    assert_eq!(
        manifest["spec"]["project"], "ccc",
        "the klusterlet's edit took"
    );

    // The sign that the hub decided every cluster's projects since: a pass
    // writes the projects of a cluster in name order, and team's edit is
    // on cluster2 only after whatever that pass wrote of ccc.
    project(&client, "team", team(&ns, "touched")).await;
    project_work_says(&works, "team", "touched").await;
    assert!(
        works
            .get_opt("argocd-pull-project-ccc")
            .await
            .unwrap()
            .is_none(),
        "the hub delivered project ccc because cluster2 named it in a work"
    );
    assert!(spoke_projects.get_opt("ccc").await.unwrap().is_none());
}
