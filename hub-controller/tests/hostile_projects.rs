//! Hostile tenants against the hub's AppProjects, on a
//! real API server: an Application the hub's Argo CD would refuse for its
//! project is refused before delivery, on both transports, with Argo CD's
//! words in the condition and a Warning Event; a project change decides its
//! Applications again within seconds; an Application its project stops
//! allowing is no longer updated on the cluster and is not deleted there.
//! What a cluster receives of projects and credentials follows from the
//! hub's record of what it authorized and delivered: a refused change of
//! project sends nothing of the new project, across a restart too, and a
//! project edit that no longer allows a kept copy withdraws its
//! credentials.

use std::collections::BTreeMap;
use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::status::CONDITION;
use argocd_pull_spoke_agent::Mode;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::argocd::appproject_resource;
use testenv::{Cluster, wait};

mod common;
mod grpc_env;
use common::{app, app_for, apps_api, managed_cluster, merge, placement_selects, run_controller};

const TIMEOUT: Duration = Duration::from_secs(30);
const ARGOCD: &str = "argocd";

/// Writes AppProject `name` in the Argo CD namespace with `spec`, as a
/// hub admin would (replacing the whole object).
async fn project(client: &kube::Client, name: &str, spec: Value) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ARGOCD, &appproject_resource());
    let p: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": { "name": name, "namespace": ARGOCD },
        "spec": spec,
    }))
    .unwrap();
    // Replaced whole (not applied: fields another manager set would stay).
    match api.get_opt(name).await.unwrap() {
        Some(current) => {
            let mut p = p;
            p.metadata.resource_version = current.metadata.resource_version;
            api.replace(name, &PostParams::default(), &p).await.unwrap();
        }
        None => {
            api.create(&PostParams::default(), &p).await.unwrap();
        }
    }
}

/// Argo CD's own `default` project as its API server creates it: any
/// repository, any destination, Applications of the control-plane
/// namespace only.
async fn argo_cds_default(client: &kube::Client) {
    project(
        client,
        "default",
        json!({ "sourceRepos": ["*"], "destinations": [{ "server": "*", "namespace": "*" }],
                "clusterResourceWhitelist": [{ "group": "*", "kind": "*" }] }),
    )
    .await;
}

/// The tenant project of the issue: Applications of `aaa-*` namespaces,
/// deploying to `aaa-*` namespaces, from `https://git.example/*`.
/// A project spec that admits Applications of namespace `ns`, from any
/// repository, to `destination`.
fn admitting(ns: &str, destination: Value) -> Value {
    json!({ "sourceNamespaces": [ns], "sourceRepos": ["*"], "destinations": [destination] })
}

fn aaa_spec(extra_namespaces: &[&str]) -> Value {
    let mut destinations = vec![json!({ "server": "*", "namespace": "aaa-*" })];
    destinations.extend(
        extra_namespaces
            .iter()
            .map(|n| json!({ "server": "*", "namespace": n })),
    );
    json!({ "sourceNamespaces": ["aaa-*"], "sourceRepos": ["https://git.example/*"],
            "destinations": destinations })
}

/// argocd-pull's condition on `name`, once it shows one containing `want`.
async fn refused_with(apps: &Api<Application>, name: &str, want: &str) -> String {
    wait::until(
        &format!("{name} refused with {want:?}"),
        TIMEOUT,
        || async {
            let a = apps.get(name).await.map_err(|e| e.to_string())?;
            let message = a
                .data
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
                .and_then(|c| c["message"].as_str().map(String::from))
                .ok_or_else(|| "no condition yet".to_string())?;
            if message.contains(want) {
                Ok(message)
            } else {
                Err(message)
            }
        },
    )
    .await
}

/// A Warning Event on `name` whose message contains `want`.
async fn warned(client: &kube::Client, ns: &str, name: &str, want: &str) {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let fields = format!("involvedObject.name={name}");
    wait::until(&format!("event on {name}"), TIMEOUT, || {
        wait::find_event(&events, &fields, |e| {
            wait::is_warning(e, "ProjectNotPermitted")
                && e.message.as_deref().is_some_and(|m| m.contains(want))
        })
    })
    .await;
}

fn no_condition(a: &Application) -> bool {
    a.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_none_or(|cs| cs.iter().all(|c| c["type"] != CONDITION))
}

/// A hub with the ManifestWork controller, cluster1 joined, Argo CD's own
/// `default` project, project `aaa`, and tenant namespaces `aaa-team-*` and
/// `bbb-team-*` whose Placements select cluster1 (so that only the
/// projects refuse).
struct Hub {
    _cluster: Cluster,
    client: kube::Client,
    _stop: argocd_pull_runtime::shutdown::Trigger,
    aaa: String,
    bbb: String,
}

async fn hub() -> Hub {
    let (cluster, client) = common::start_hub("hub").await;
    cluster.ensure_namespace(ARGOCD).await.unwrap();
    argo_cds_default(&client).await;
    project(&client, "aaa", aaa_spec(&[])).await;
    managed_cluster(&cluster, "cluster1").await;
    managed_cluster(&cluster, "cluster2").await;
    let aaa = cluster.namespace("aaa-team").await.unwrap();
    let bbb = cluster.namespace("bbb-team").await.unwrap();
    for ns in [&aaa, &bbb] {
        placement_selects(&client, ns, &["cluster1"]).await;
    }
    let (_ctx, stop) = run_controller(client.clone()).await;
    Hub {
        _cluster: cluster,
        client,
        _stop: stop,
        aaa,
        bbb,
    }
}

/// An Application of project `project` in `ns` for cluster1, deploying to
/// namespace `dest` from `repo`.
fn tenant_app(name: &str, ns: &str, project: &str, dest: &str, repo: &str) -> Application {
    let mut a = app(
        name,
        ns,
        json!({ keys::MANAGED_CLUSTER: "cluster1" }),
        json!({}),
    );
    a.data["spec"]["project"] = json!(project);
    a.data["spec"]["destination"]["namespace"] = json!(dest);
    a.data["spec"]["source"]["repoURL"] = json!(repo);
    a
}

const REPO: &str = "https://git.example/team.git";

#[tokio::test]
async fn manifestwork_refuses_what_the_project_does_not_allow() {
    let hub = hub().await;
    let works: Api<ManifestWork> = Api::namespaced(hub.client.clone(), "cluster1");
    let (aaa, bbb) = (
        apps_api(&hub.client, &hub.aaa),
        apps_api(&hub.client, &hub.bbb),
    );

    // A delivered one first: the controller works, and what follows is not
    // refused for anything else.
    aaa.create(
        &PostParams::default(),
        &tenant_app("good", &hub.aaa, "aaa", "aaa-web", REPO),
    )
    .await
    .unwrap();
    wait::exists(&works, &format!("{}.good", hub.aaa), TIMEOUT).await;

    // 1. `default` from a tenant namespace (its sourceNamespaces is empty).
    bbb.create(
        &PostParams::default(),
        &tenant_app("sneaky", &hub.bbb, "default", "bbb-web", REPO),
    )
    .await
    .unwrap();
    let want = format!(
        "application 'sneaky' in namespace '{}' is not allowed to use project default",
        hub.bbb
    );
    let m = refused_with(&bbb, "sneaky", &want).await;
    assert!(m.starts_with("ProjectNotPermitted: "), "{m}");
    warned(&hub.client, &hub.bbb, "sneaky", &want).await;

    // 2. A destination namespace outside `aaa-*`.
    aaa.create(
        &PostParams::default(),
        &tenant_app("escape", &hub.aaa, "aaa", "kube-system", REPO),
    )
    .await
    .unwrap();
    let want = "application destination server 'https://kubernetes.default.svc' and namespace 'kube-system' do not match any of the allowed destinations in project 'aaa'";
    refused_with(&aaa, "escape", want).await;
    warned(&hub.client, &hub.aaa, "escape", want).await;

    // 3. A repository outside sourceRepos (one of several sources).
    let mut multi = tenant_app("foreign", &hub.aaa, "aaa", "aaa-web", REPO);
    multi.data["spec"]["sources"] = json!([
        { "repoURL": REPO, "path": "a" },
        { "repoURL": "https://evil.example/x.git", "path": "b" }]);
    aaa.create(&PostParams::default(), &multi).await.unwrap();
    let want = "application repo https://evil.example/x.git is not permitted in project 'aaa'";
    refused_with(&aaa, "foreign", want).await;
    warned(&hub.client, &hub.aaa, "foreign", want).await;

    // 4. A project that does not exist.
    aaa.create(
        &PostParams::default(),
        &tenant_app("orphan", &hub.aaa, "nope", "aaa-web", REPO),
    )
    .await
    .unwrap();
    refused_with(
        &aaa,
        "orphan",
        "Application referencing project nope which does not exist",
    )
    .await;

    // None of them was delivered.
    for name in ["sneaky", "escape", "foreign", "orphan"] {
        let ns = if name == "sneaky" { &hub.bbb } else { &hub.aaa };
        assert!(
            works
                .get_opt(&format!("{ns}.{name}"))
                .await
                .unwrap()
                .is_none(),
            "{name} was delivered"
        );
    }

    // The project now allows kube-system: delivered within seconds, and
    // its condition goes.
    project(&hub.client, "aaa", aaa_spec(&["kube-system"])).await;
    wait::exists(&works, &format!("{}.escape", hub.aaa), TIMEOUT).await;
    wait::until("escape's condition gone", TIMEOUT, || async {
        let a = aaa.get("escape").await.map_err(|e| e.to_string())?;
        no_condition(&a)
            .then_some(())
            .ok_or("still refused".to_string())
    })
    .await;
}

#[tokio::test]
async fn an_application_its_project_stops_allowing_stays_on_the_cluster_unchanged() {
    let hub = hub().await;
    let works: Api<ManifestWork> = Api::namespaced(hub.client.clone(), "cluster1");
    let aaa = apps_api(&hub.client, &hub.aaa);
    project(&hub.client, "aaa", aaa_spec(&["shared-*"])).await;
    aaa.create(
        &PostParams::default(),
        &tenant_app("web", &hub.aaa, "aaa", "shared-web", REPO),
    )
    .await
    .unwrap();
    let work_name = format!("{}.web", hub.aaa);
    wait::exists(&works, &work_name, TIMEOUT).await;
    wait::exists(&works, "argocd-pull-project-aaa", TIMEOUT).await;
    let before = works.get(&work_name).await.unwrap();

    // The project stops allowing shared-*: the refusal is recorded ...
    project(&hub.client, "aaa", aaa_spec(&[])).await;
    refused_with(
        &aaa,
        "web",
        "namespace 'shared-web' do not match any of the allowed destinations in project 'aaa'",
    )
    .await;
    // ... and a later change of the hub copy is decided (its refusal names
    // the new namespace) but not delivered.
    merge(
        &aaa,
        "web",
        json!({ "spec": { "destination": { "namespace": "shared-other" } } }),
    )
    .await;
    refused_with(&aaa, "web", "namespace 'shared-other' do not match").await;
    let after = works
        .get_opt(&work_name)
        .await
        .unwrap()
        .expect("the work is not deleted");
    assert_eq!(
        (
            after.metadata.resource_version,
            after.metadata.generation,
            after.metadata.deletion_timestamp
        ),
        (
            before.metadata.resource_version,
            before.metadata.generation,
            None
        ),
        "the work changed after its Application stopped being allowed"
    );
    // Its project (and credentials) stay with it: once a later pass has
    // delivered another project to cluster1, aaa's work is still there.
    project(
        &hub.client,
        "aaa-later",
        admitting(&hub.aaa, json!({ "name": "*", "namespace": "*" })),
    )
    .await;
    aaa.create(
        &PostParams::default(),
        &tenant_app("later", &hub.aaa, "aaa-later", "anywhere", REPO),
    )
    .await
    .unwrap();
    wait::exists(&works, "argocd-pull-project-aaa-later", TIMEOUT).await;
    let kept = works
        .get_opt("argocd-pull-project-aaa")
        .await
        .unwrap()
        .expect("the refused Application's project stays on the cluster");
    assert!(kept.metadata.deletion_timestamp.is_none());
}

#[tokio::test]
async fn grpc_refuses_what_the_project_does_not_allow_and_delivers_it_once_allowed() {
    let mut env = grpc_env::Env::new(&["cluster1"]).await;
    // The harness's default project admits every namespace; make it Argo
    // CD's own.
    env.hub.ensure_namespace(ARGOCD).await.unwrap();
    argo_cds_default(&env.hub_client).await;
    env.start_hub(&[]).await;
    env.connect_agent(0).await;
    let apps = env.hub_apps();
    // Allowed (the control-plane namespace is not the team's, so this one
    // uses a project admitting the team namespace).
    project(
        &env.hub_client,
        "team",
        admitting(&env.team, json!({ "name": "cluster1", "namespace": "*" })),
    )
    .await;
    let mut ok = env.app("alpha", 0, json!({}));
    ok.data["spec"]["project"] = json!("team");
    apps.create(&PostParams::default(), &ok).await.unwrap();
    let expected: BTreeMap<String, usize> = [("alpha".to_string(), 0)].into();
    wait::until("alpha delivered", grpc_env::TIMEOUT, || {
        env.converged(&expected)
    })
    .await;

    // `default` from the team namespace: refused, nothing on the spoke.
    env.create("sneaky", 0, json!({})).await;
    let want = format!(
        "application 'sneaky' in namespace '{}' is not allowed to use project default",
        env.team
    );
    refused_with(&apps, "sneaky", &want).await;
    warned(&env.hub_client, &env.team, "sneaky", &want).await;
    assert!(
        env.spoke_apps(0).get_opt("sneaky").await.unwrap().is_none(),
        "sneaky reached the cluster"
    );

    // The project admits the namespace: delivered within seconds.
    project(
        &env.hub_client,
        "default",
        admitting(&env.team, json!({ "server": "*", "namespace": "*" })),
    )
    .await;
    wait::exists(&env.spoke_apps(0), "sneaky", TIMEOUT).await;
}

/// The ManifestWork `name` in `cluster` once `check` holds for it.
async fn work_where(
    works: &Api<ManifestWork>,
    name: &str,
    what: &str,
    check: impl Fn(&ManifestWork) -> Result<(), String>,
) -> ManifestWork {
    wait::until(what, TIMEOUT, || async {
        let w = works
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no work {name}"))?;
        check(&w).map(|_| w)
    })
    .await
}

/// The manifests of a work, by kind/name.
fn manifests(w: &ManifestWork) -> BTreeMap<String, Value> {
    w.spec
        .workload
        .as_ref()
        .and_then(|wl| wl.manifests.as_ref())
        .into_iter()
        .flatten()
        .map(|m| {
            let v = serde_json::to_value(m).unwrap();
            (
                format!(
                    "{}/{}",
                    v["kind"].as_str().unwrap_or_default(),
                    v["metadata"]["name"].as_str().unwrap_or_default()
                ),
                v,
            )
        })
        .collect()
}

/// Creates Application `web` of project `aaa` in the aaa team's namespace;
/// that namespace's Applications.
async fn aaa_web(hub: &Hub) -> Api<Application> {
    let aaa = apps_api(&hub.client, &hub.aaa);
    aaa.create(
        &PostParams::default(),
        &tenant_app("web", &hub.aaa, "aaa", "aaa-web", REPO),
    )
    .await
    .unwrap();
    aaa
}

/// A check that a work holds exactly `want` (`Kind/name`, in order).
fn has(want: &'static [&'static str]) -> impl Fn(&ManifestWork) -> Result<(), String> {
    move |w: &ManifestWork| {
        let got: Vec<String> = manifests(w).into_keys().collect();
        (got == want).then_some(()).ok_or(format!("{got:?}"))
    }
}

async fn repo_secret(client: &kube::Client, name: &str, project: Option<&str>, password: &str) {
    let mut data = json!({ "url": "https://git.example/team.git", "password": password });
    if let Some(p) = project {
        data["project"] = json!(p);
    }
    let s: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": ARGOCD,
                      "labels": { keys::ARGOCD_SECRET_TYPE: "repository" } },
        "stringData": data,
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ARGOCD)
        .patch(
            name,
            &PatchParams::apply("hub-admin").force(),
            &Patch::Apply(&s),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn the_project_and_its_credentials_reach_only_the_clusters_of_its_applications() {
    let hub = hub().await;
    let c1: Api<ManifestWork> = Api::namespaced(hub.client.clone(), "cluster1");
    let c2: Api<ManifestWork> = Api::namespaced(hub.client.clone(), "cluster2");
    repo_secret(&hub.client, "aaa-repo", Some("aaa"), "s3cret").await;
    repo_secret(&hub.client, "global-repo", None, "global").await;
    repo_secret(&hub.client, "other-repo", Some("other"), "other").await;
    // cluster2 gets an Application of `default` from the Argo CD namespace:
    // its project work is the sign that cluster2's were decided.
    placement_selects(&hub.client, ARGOCD, &["cluster2"]).await;
    common::create(
        &apps_api(&hub.client, ARGOCD),
        &app_for("ops", ARGOCD, "cluster2"),
    )
    .await;
    let aaa = aaa_web(&hub).await;

    let w = work_where(
        &c1,
        "argocd-pull-project-aaa",
        "project aaa on cluster1 with its credential",
        has(&["AppProject/aaa", "Secret/aaa-repo"]),
    )
    .await;
    let m = manifests(&w);
    assert_eq!(m["AppProject/aaa"]["metadata"]["namespace"], "argocd");
    assert_eq!(
        m["AppProject/aaa"]["spec"]["destinations"],
        json!([{ "name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "aaa-*" }])
    );
    work_where(
        &c2,
        "argocd-pull-project-default",
        "project default on cluster2",
        has(&["AppProject/default"]),
    )
    .await;
    // Nothing of aaa on cluster2, nothing of default on cluster1, and the
    // unscoped and other project's credentials nowhere.
    assert!(
        c2.get_opt("argocd-pull-project-aaa")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        c1.get_opt("argocd-pull-project-default")
            .await
            .unwrap()
            .is_none()
    );
    for w in c1
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .chain(c2.list(&Default::default()).await.unwrap().items.iter())
    {
        for k in manifests(w).keys() {
            assert!(
                k != "Secret/global-repo" && k != "Secret/other-repo",
                "{k} delivered"
            );
        }
    }

    // An update follows within seconds ...
    repo_secret(&hub.client, "aaa-repo", Some("aaa"), "rotated").await;
    work_where(
        &c1,
        "argocd-pull-project-aaa",
        "the rotated password delivered",
        |w| {
            let pw = manifests(w)["Secret/aaa-repo"]["data"]["password"].clone();
            (pw == json!("cm90YXRlZA=="))
                .then_some(())
                .ok_or(format!("{pw}"))
        },
    )
    .await;
    // ... and so does a deletion.
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(hub.client.clone(), ARGOCD)
        .delete("aaa-repo", &Default::default())
        .await
        .unwrap();
    work_where(
        &c1,
        "argocd-pull-project-aaa",
        "the credential removed",
        has(&["AppProject/aaa"]),
    )
    .await;

    // The last Application of aaa leaves cluster1: its project goes too.
    aaa.delete("web", &Default::default()).await.unwrap();
    wait::gone(&c1, "argocd-pull-project-aaa", TIMEOUT).await;
}

/// A delivered object on spoke `i`'s cluster once `check` holds for it.
async fn on_spoke<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    check: impl Fn(&K) -> Result<(), String>,
) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait::until(what, TIMEOUT, || async {
        let o = api
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no {name}"))?;
        check(&o).map(|_| o)
    })
    .await
}

/// The repository credential's password is `want`.
fn password_is(s: &k8s_openapi::api::core::v1::Secret, want: &str) -> Result<(), String> {
    let pw = common::addon::secret_text(s, "password");
    (pw == want).then_some(()).ok_or(pw)
}

fn kept_by_agent(o: &impl kube::Resource) -> Result<(), String> {
    (o.meta()
        .labels
        .as_ref()
        .and_then(|l| l.get("argocd-pull.io/project-set"))
        .map(String::as_str)
        == Some("true"))
    .then_some(())
    .ok_or_else(|| "not kept by the agent".to_string())
}

#[tokio::test]
async fn over_grpc_the_project_and_its_credentials_reach_only_the_clusters_of_its_applications() {
    use k8s_openapi::api::core::v1::Secret;
    let mut env = grpc_env::Env::new(&["cluster1", "cluster2"]).await;
    env.hub.ensure_namespace(ARGOCD).await.unwrap();
    repo_secret(&env.hub_client, "team-repo", Some("team"), "s3cret").await;
    repo_secret(&env.hub_client, "global-repo", None, "global").await;
    repo_secret(&env.hub_client, "other-repo", Some("other"), "other").await;
    project(
        &env.hub_client,
        "team",
        admitting(
            &env.team,
            json!({ "name": "cluster1", "namespace": "team-*" }),
        ),
    )
    .await;
    env.start_hub(&["--project-credentials"]).await;
    env.start_agent(0, Mode::Managed);
    env.connect_agent(1).await;
    let apps = env.hub_apps();
    let mut alpha = env.app("alpha", 0, json!({}));
    alpha.data["spec"]["project"] = json!("team");
    alpha.data["spec"]["destination"]["namespace"] = json!("team-web");
    apps.create(&PostParams::default(), &alpha).await.unwrap();
    // cluster2 gets an Application of `default`: its project there is the
    // sign that cluster2's set was decided.
    env.create("beta", 1, json!({})).await;

    let projects = |i: usize| -> Api<DynamicObject> {
        Api::namespaced_with(
            env.spokes[i].client.clone(),
            grpc_env::SPOKE_NS,
            &appproject_resource(),
        )
    };
    let secrets = |i: usize| -> Api<Secret> {
        Api::namespaced(env.spokes[i].client.clone(), grpc_env::SPOKE_NS)
    };
    let team = on_spoke(
        &projects(0),
        "team",
        "project team on cluster1",
        kept_by_agent,
    )
    .await;
    // Rewritten to the cluster's own view of itself, as over ManifestWork.
    assert_eq!(
        team.data["spec"]["destinations"],
        json!([{ "name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "team-*" }])
    );
    on_spoke(
        &secrets(0),
        "team-repo",
        "team's credential on cluster1",
        |s: &Secret| {
            kept_by_agent(s)?;
            password_is(s, "s3cret")
        },
    )
    .await;
    on_spoke(
        &projects(1),
        "default",
        "project default on cluster2",
        kept_by_agent,
    )
    .await;
    // Nothing of team on cluster2, and the unscoped and other project's
    // credentials nowhere.
    assert!(projects(1).get_opt("team").await.unwrap().is_none());
    for i in [0, 1] {
        for name in ["global-repo", "other-repo"] {
            assert!(
                secrets(i).get_opt(name).await.unwrap().is_none(),
                "{name} on spoke {i}"
            );
        }
    }
    assert!(secrets(1).get_opt("team-repo").await.unwrap().is_none());

    // A rotation follows within seconds ...
    repo_secret(&env.hub_client, "team-repo", Some("team"), "rotated").await;
    on_spoke(
        &secrets(0),
        "team-repo",
        "the rotated password on cluster1",
        |s: &Secret| password_is(s, "rotated"),
    )
    .await;
    // ... and so does the last Application of the project leaving: its
    // credential goes, its project stays (as over ManifestWork).
    apps.delete("alpha", &Default::default()).await.unwrap();
    wait::gone(&secrets(0), "team-repo", TIMEOUT).await;
    assert!(projects(0).get_opt("team").await.unwrap().is_some());
}

/// Project `team` admitting the team namespace to namespaces `dest`, with
/// a description that marks each edit: the sign that a set sent after the
/// edit reached the cluster.
/// Projects `team` (for namespace `team`, destinations `team-*`,
/// description `first`) and `ccc` (for `ccc-*` only, anywhere), each with
/// a repository credential scoped to it.
async fn team_and_ccc(client: &kube::Client, team: &str) {
    repo_secret(client, "team-repo", Some("team"), "s3cret").await;
    repo_secret(client, "ccc-repo", Some("ccc"), "ccc-s3cret").await;
    project(client, "team", team_spec(team, "team-*", "first")).await;
    project(
        client,
        "ccc",
        admitting("ccc-*", json!({ "server": "*", "namespace": "*" })),
    )
    .await;
}

fn team_spec(team: &str, dest: &str, description: &str) -> Value {
    let mut spec = admitting(team, json!({ "server": "*", "namespace": dest }));
    spec["description"] = json!(description);
    spec
}

/// Project `team` on spoke 0 once its description is `want`: the agent
/// applies a set in order and `team` sorts after `ccc`, so whatever of
/// `ccc` that set held is on the cluster by then.
async fn team_on_spoke(env: &grpc_env::Env, want: &str) {
    let projects: Api<DynamicObject> = Api::namespaced_with(
        env.spokes[0].client.clone(),
        grpc_env::SPOKE_NS,
        &appproject_resource(),
    );
    on_spoke(
        &projects,
        "team",
        &format!("team {want} on cluster1"),
        |p| {
            let d = p.data["spec"]["description"].clone();
            (d == json!(want)).then_some(()).ok_or(format!("{d}"))
        },
    )
    .await;
}

/// Fails when anything of project `ccc` is on spoke 0.
async fn nothing_of_ccc(env: &grpc_env::Env, when: &str) {
    use k8s_openapi::api::core::v1::Secret;
    let projects: Api<DynamicObject> = Api::namespaced_with(
        env.spokes[0].client.clone(),
        grpc_env::SPOKE_NS,
        &appproject_resource(),
    );
    let secrets: Api<Secret> = Api::namespaced(env.spokes[0].client.clone(), grpc_env::SPOKE_NS);
    assert!(
        projects.get_opt("ccc").await.unwrap().is_none(),
        "{when}: AppProject ccc, which refused the Application, is on cluster1"
    );
    assert!(
        secrets.get_opt("ccc-repo").await.unwrap().is_none(),
        "{when}: ccc's credential is on cluster1"
    );
}

/// A tenant switches a delivered Application to a project that does not
/// admit its namespace: refused, its copy kept with the project it was
/// delivered with; nothing of the new project reaches the cluster at the
/// next sets (a project edit, a hub-controller restart). A project edit
/// that no longer allows the kept copy's recorded destination takes its
/// credentials away, and leaves the copy and the project there.
#[tokio::test]
async fn over_grpc_a_refused_project_change_sends_nothing_of_the_new_project() {
    use k8s_openapi::api::core::v1::Secret;
    let mut env = grpc_env::Env::new(&["cluster1"]).await;
    env.hub.ensure_namespace(ARGOCD).await.unwrap();
    team_and_ccc(&env.hub_client, &env.team).await;
    let args = ["--project-credentials"];
    env.start_hub(&args).await;
    env.connect_agent(0).await;
    let apps = env.hub_apps();
    // Two Applications of team: beta keeps team in the cluster's set
    // whatever alpha does.
    for (name, dest) in [("alpha", "team-web"), ("beta", "team-api")] {
        let mut a = env.app(name, 0, json!({}));
        a.data["spec"]["project"] = json!("team");
        a.data["spec"]["destination"]["namespace"] = json!(dest);
        apps.create(&PostParams::default(), &a).await.unwrap();
    }
    let secrets: Api<Secret> = Api::namespaced(env.spokes[0].client.clone(), grpc_env::SPOKE_NS);
    team_on_spoke(&env, "first").await;
    on_spoke(
        &secrets,
        "team-repo",
        "team's credential on cluster1",
        |s| password_is(s, "s3cret"),
    )
    .await;

    // The tenant switches it to ccc: refused, the copy stays as delivered.
    merge(&apps, "alpha", json!({ "spec": { "project": "ccc" } })).await;
    refused_with(
        &apps,
        "alpha",
        &format!(
            "application 'alpha' in namespace '{}' is not allowed to use project ccc",
            env.team
        ),
    )
    .await;
    let kept = env.spoke_apps(0).get("alpha").await.unwrap();
    assert_eq!(
        kept.data["spec"]["project"], "team",
        "the kept copy changed"
    );

    // The next set (a project edit) sends team again, and nothing of ccc.
    project(
        &env.hub_client,
        "team",
        team_spec(&env.team, "team-*", "touched"),
    )
    .await;
    team_on_spoke(&env, "touched").await;
    nothing_of_ccc(&env, "after a project edit").await;

    // beta goes: alpha's kept copy alone keeps team and its credential.
    apps.delete("beta", &Default::default()).await.unwrap();
    wait::gone(&env.spoke_apps(0), "beta", TIMEOUT).await;
    project(
        &env.hub_client,
        "team",
        team_spec(&env.team, "team-*", "alone"),
    )
    .await;
    team_on_spoke(&env, "alone").await;
    nothing_of_ccc(&env, "with alpha alone").await;
    assert!(
        secrets.get_opt("team-repo").await.unwrap().is_some(),
        "the kept copy's credential left"
    );

    // A restarted hub-controller knows only the current hub copy (project
    // ccc) and its record: the kept copy keeps team and its credential.
    env.kill_hub().await;
    env.start_hub(&args).await;
    env.wait_connected().await;
    project(
        &env.hub_client,
        "team",
        team_spec(&env.team, "team-*", "after a restart"),
    )
    .await;
    team_on_spoke(&env, "after a restart").await;
    nothing_of_ccc(&env, "after a restart").await;
    on_spoke(
        &secrets,
        "team-repo",
        "team's credential kept across the restart",
        |s| password_is(s, "s3cret"),
    )
    .await;

    // team stops allowing the recorded destination (team-web): the
    // credential goes within seconds; the project's new content reaches
    // the cluster (whose Argo CD then refuses the copy as the hub does)
    // and the copy is not deleted.
    project(
        &env.hub_client,
        "team",
        team_spec(&env.team, "elsewhere-*", "withdrawn"),
    )
    .await;
    team_on_spoke(&env, "withdrawn").await;
    wait::gone(&secrets, "team-repo", TIMEOUT).await;
    nothing_of_ccc(&env, "after the withdrawal").await;
    assert!(env.spoke_apps(0).get_opt("alpha").await.unwrap().is_some());
}

/// Two replicas: the leader keeps the record, another serves cluster1's
/// agent. After a refused switch, the serving replica is killed and one
/// that never delivered the copy takes the agent: it sends the project
/// the copy was delivered with (from the leader's record), and nothing of
/// the project that refused it.
#[tokio::test]
async fn a_replica_that_never_delivered_a_kept_copy_sends_only_its_recorded_project() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Secret;
    let (mut env, service) = grpc_env::replicas::replicas_env(&["cluster1"]).await;
    team_and_ccc(&env.hub_client, &env.team).await;
    let args = ["--project-credentials"];
    let leader = env.start_replica("replica-leader", &args).await;
    wait::until("the first replica leads", TIMEOUT, || async {
        leader.leads().await.then_some(()).ok_or("not yet")
    })
    .await;
    let first = env.start_replica("replica-first", &args).await;
    service.set(&[first.grpc]);
    let config = env.agent_config(0, &service.address(), Mode::Managed);
    env.start_agent_with(0, config);
    wait::until(
        "the agent on the replica that does not lead",
        TIMEOUT,
        || serves(&first),
    )
    .await;

    let apps = env.hub_apps();
    let mut alpha = env.app("alpha", 0, json!({}));
    alpha.data["spec"]["project"] = json!("team");
    alpha.data["spec"]["destination"]["namespace"] = json!("team-web");
    let uid = apps
        .create(&PostParams::default(), &alpha)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    team_on_spoke(&env, "first").await;
    merge(&apps, "alpha", json!({ "spec": { "project": "ccc" } })).await;
    refused_with(&apps, "alpha", "is not allowed to use project ccc").await;
    // The leader's record keeps alpha's grant of team.
    let leases: Api<Lease> = Api::namespaced(env.hub_client.clone(), "argocd-pull");
    wait::until("the leader's record of cluster1", TIMEOUT, || async {
        let l = leases
            .get_opt("argocd-pull-authorized-cluster1")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no record yet".to_string())?;
        let record = l
            .metadata
            .annotations
            .and_then(|a| a.get("argocd-pull.io/authorized").cloned())
            .unwrap_or_default();
        let grant: Value = serde_json::from_str(&record).map_err(|e| e.to_string())?;
        let g = &grant[format!("{}/alpha", grpc_env::SPOKE_NS)];
        (g["owner"] == json!(uid) && g["project"] == "team" && g["transport"] == "grpc")
            .then_some(())
            .ok_or(record)
    })
    .await;

    first.kill().await;
    let second = env.start_replica("replica-second", &args).await;
    service.set(&[second.grpc]);
    wait::until(
        "the agent on a replica that never delivered alpha",
        TIMEOUT,
        || serves(&second),
    )
    .await;
    project(
        &env.hub_client,
        "team",
        team_spec(&env.team, "team-*", "second"),
    )
    .await;
    team_on_spoke(&env, "second").await;
    nothing_of_ccc(&env, "on the second replica").await;
    let secrets: Api<Secret> = Api::namespaced(env.spokes[0].client.clone(), grpc_env::SPOKE_NS);
    assert!(
        secrets.get_opt("team-repo").await.unwrap().is_some(),
        "the kept copy's credential left"
    );
    assert!(!second.leads().await && leader.leads().await);
}

/// Whether cluster1's agent is connected to replica `r`.
async fn serves(r: &grpc_env::replicas::Replica) -> Result<(), &'static str> {
    (r.agents().await == ["cluster1"])
        .then_some(())
        .ok_or("not yet")
}

/// A grant records the source repositories the project allowed: a project
/// edit removing the Application's repository from `spec.sourceRepos`, or
/// adding a `!` entry that denies it, takes the project's credentials off
/// the cluster within seconds (ManifestWork); the project stays.
#[tokio::test]
async fn manifestwork_a_source_the_project_no_longer_allows_withdraws_its_credentials() {
    let hub = hub().await;
    let c1: Api<ManifestWork> = Api::namespaced(hub.client.clone(), "cluster1");
    repo_secret(&hub.client, "aaa-repo", Some("aaa"), "s3cret").await;
    let aaa = aaa_web(&hub).await;
    let with_credential: &[&str] = &["AppProject/aaa", "Secret/aaa-repo"];
    work_where(
        &c1,
        "argocd-pull-project-aaa",
        "project aaa on cluster1 with its credential",
        has(with_credential),
    )
    .await;
    let repos = |repos: Value| {
        let mut spec = aaa_spec(&[]);
        spec["sourceRepos"] = repos;
        spec
    };
    // (sourceRepos now, what the project work holds)
    let edits: [(Value, &'static [&'static str]); 3] = [
        (json!(["*", format!("!{REPO}")]), &["AppProject/aaa"]),
        (json!(["https://git.example/*"]), with_credential),
        (json!(["https://git.example/other/*"]), &["AppProject/aaa"]),
    ];
    for (source_repos, want) in edits {
        project(&hub.client, "aaa", repos(source_repos.clone())).await;
        work_where(
            &c1,
            "argocd-pull-project-aaa",
            &format!("project aaa on cluster1 as {want:?} under sourceRepos {source_repos}"),
            has(want),
        )
        .await;
    }
    // Refused as the cluster's Argo CD will refuse it; its work stays.
    refused_with(
        &aaa,
        "web",
        &format!("application repo {REPO} is not permitted in project 'aaa'"),
    )
    .await;
    assert!(
        c1.get_opt(&format!("{}.web", hub.aaa))
            .await
            .unwrap()
            .is_some()
    );
}

/// As above, over gRPC: the credential leaves the cluster and the project
/// and the kept copy stay.
#[tokio::test]
async fn over_grpc_a_source_the_project_no_longer_allows_withdraws_its_credentials() {
    use k8s_openapi::api::core::v1::Secret;
    let mut env = grpc_env::Env::new(&["cluster1"]).await;
    env.hub.ensure_namespace(ARGOCD).await.unwrap();
    team_and_ccc(&env.hub_client, &env.team).await;
    env.start_hub(&["--project-credentials"]).await;
    env.connect_agent(0).await;
    let apps = env.hub_apps();
    let mut alpha = env.app("alpha", 0, json!({}));
    alpha.data["spec"]["project"] = json!("team");
    alpha.data["spec"]["destination"]["namespace"] = json!("team-web");
    alpha.data["spec"]["source"]["repoURL"] = json!(REPO);
    apps.create(&PostParams::default(), &alpha).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(env.spokes[0].client.clone(), grpc_env::SPOKE_NS);
    let credential = || {
        on_spoke(
            &secrets,
            "team-repo",
            "team's credential on cluster1",
            |s| password_is(s, "s3cret"),
        )
    };
    credential().await;
    let edit = |source_repos: Value, description: &'static str| {
        let mut spec = team_spec(&env.team, "team-*", description);
        spec["sourceRepos"] = source_repos;
        project(&env.hub_client, "team", spec)
    };

    // A `!` entry denying the repository, whatever else allows.
    edit(json!(["*", format!("!{REPO}")]), "denied").await;
    team_on_spoke(&env, "denied").await;
    wait::gone(&secrets, "team-repo", TIMEOUT).await;
    // Allowed again: delivered again, with its credential.
    edit(json!(["*"]), "allowed").await;
    credential().await;
    // The repository no longer listed.
    edit(json!(["https://git.example/other/*"]), "removed").await;
    team_on_spoke(&env, "removed").await;
    wait::gone(&secrets, "team-repo", TIMEOUT).await;
    refused_with(
        &apps,
        "alpha",
        &format!("application repo {REPO} is not permitted in project 'team'"),
    )
    .await;
    assert!(env.spoke_apps(0).get_opt("alpha").await.unwrap().is_some());
}
