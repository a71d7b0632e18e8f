//! Real Argo CD in the harness: a managed cluster's own application-controller
//! and repo-server deploy ConfigMaps from a local Git repository to their own
//! API server and report Synced/Healthy, follow new commits on refresh, and
//! run sync operations; the hub's applicationset-controller generates
//! Applications from a list and from OCM PlacementDecisions; and nothing is
//! left running when the harness lets go.

use std::time::Duration;

use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::ocm::placement_decision_resource;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::argocd::{
    self, GitServer, HubOptions, IN_CLUSTER, NAMESPACE, Repo, Spoke, SpokeOptions,
    applicationset_resource,
};
use testenv::{Cluster, ClusterConfig, CrdSet, wait};
use tokio::sync::OnceCell;

/// Argo CD on a busy two-core machine: a sync takes seconds, not minutes.
const TIMEOUT: Duration = Duration::from_secs(120);
const REFRESH: &str = "argocd.argoproj.io/refresh";

/// One managed cluster with its Argo CD, and one Git server, shared by the
/// tests of this binary; each test uses its own repository, namespace and
/// Application.
struct Env {
    cluster: &'static Cluster,
    spoke: Spoke,
    git: GitServer,
}

async fn env() -> &'static Env {
    static ENV: OnceCell<Env> = OnceCell::const_new();
    ENV.get_or_init(|| async {
        testenv::init_tracing();
        let cluster = testenv::shared("spoke", CrdSet::Managed)
            .await
            .expect("the managed cluster starts");
        let (spoke, git) = tokio::join!(
            Spoke::start(cluster, SpokeOptions::default()),
            GitServer::start()
        );
        Env {
            cluster,
            spoke: spoke.expect("Argo CD starts on the managed cluster"),
            git: git.expect("the Git server starts"),
        }
    })
    .await
}

fn config_map(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: {value:?}\n"
    )
}

fn application(name: &str, repo: &Repo, namespace: &str, automated: bool) -> DynamicObject {
    let mut app = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "project": argocd::DEFAULT_PROJECT,
            "source": { "repoURL": repo.url(), "targetRevision": "main", "path": "app" },
            "destination": { "server": IN_CLUSTER, "namespace": namespace },
        },
    });
    if automated {
        app["spec"]["syncPolicy"] = json!({ "automated": { "prune": true, "selfHeal": true } });
    }
    serde_json::from_value(app).expect("a valid Application")
}

/// Asks Argo CD for a normal refresh of `name`, as `argocd app get
/// --refresh` does.
async fn refresh(apps: &Api<DynamicObject>, name: &str) {
    let refresh = json!({ "metadata": { "annotations": { REFRESH: "normal" } } });
    apps.patch(name, &PatchParams::default(), &Patch::Merge(refresh))
        .await
        .unwrap();
}

fn applications(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NAMESPACE, &application_resource())
}

/// Waits until the Application's status satisfies `check`, and returns it.
async fn status_until(
    env: &Env,
    apps: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    wait::until(what, TIMEOUT, || async {
        let app = apps.get(name).await.map_err(|e| e.to_string())?;
        let app = serde_json::to_value(&app).expect("serializable");
        if check(&app) {
            Ok(app)
        } else {
            Err(format!(
                "{}\napplication-controller:\n{}\nrepo-server:\n{}",
                json!({
                    "annotations": app["metadata"]["annotations"],
                    "operation": app["operation"],
                    "status": app["status"],
                }),
                env.spoke.log_tail("application-controller", 5),
                env.spoke.log_tail("repo-server", 5),
            ))
        }
    })
    .await
}

fn synced_healthy_at(app: &Value, revision: &str) -> bool {
    app["status"]["sync"]["status"] == "Synced"
        && app["status"]["health"]["status"] == "Healthy"
        && app["status"]["sync"]["revision"] == revision
}

/// Synced and Healthy at `revision`, by a finished sync of that revision
/// (the sync status can turn Synced before the operation is recorded).
fn deployed(app: &Value, revision: &str) -> bool {
    let op = &app["status"]["operationState"];
    synced_healthy_at(app, revision)
        && op["phase"] == "Succeeded"
        && op["syncResult"]["revision"] == revision
}

/// A namespace and a Git repository named `name`, one commit with one
/// ConfigMap `(name, value)` in `app/`, and an Application `name` deploying
/// it (with automated sync or not). Returns the namespace, the repository,
/// the commit and the Applications' API.
async fn one_config_map_app(
    env: &Env,
    name: &str,
    (cm, value): (&str, &str),
    automated: bool,
) -> (String, Repo, String, Api<DynamicObject>) {
    let client = env.cluster.client().await.unwrap();
    let ns = env.cluster.namespace(name).await.unwrap();
    let repo = env.git.create_repo(name).unwrap();
    let sha = repo
        .commit(
            "one ConfigMap",
            &[(&format!("app/{cm}.yaml"), &config_map(cm, value))],
        )
        .unwrap();
    let apps = applications(&client);
    apps.create(
        &PostParams::default(),
        &application(name, &repo, &ns, automated),
    )
    .await
    .unwrap();
    (ns, repo, sha, apps)
}

#[tokio::test]
async fn an_application_syncs_from_git_and_follows_new_commits() {
    let env = env().await;
    let client = env.cluster.client().await.unwrap();
    let (ns, repo, first, apps) = one_config_map_app(env, "guestbook", ("a", "v1"), true).await;
    let app = status_until(
        env,
        &apps,
        "guestbook",
        "Synced and Healthy at the first commit",
        |a| deployed(a, &first),
    )
    .await;
    let resources = app["status"]["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert_eq!(resources[0]["kind"], "ConfigMap");
    assert_eq!(resources[0]["name"], "a");
    assert_eq!(resources[0]["namespace"], ns.as_str());
    assert_eq!(resources[0]["status"], "Synced");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let a = cms.get("a").await.unwrap();
    assert_eq!(a.data.unwrap()["value"], "v1");
    // Argo CD (v3: by annotation) tracks what it deployed.
    assert_eq!(
        a.metadata.annotations.unwrap()["argocd.argoproj.io/tracking-id"],
        format!("guestbook:/ConfigMap:{ns}/a")
    );

    // A new commit, picked up on a refresh request rather than the
    // controller's periodic (120 s) resync.
    let second = repo
        .commit(
            "change a, add b",
            &[
                ("app/a.yaml", &config_map("a", "v2")),
                ("app/b.yaml", &config_map("b", "new")),
            ],
        )
        .unwrap();
    refresh(&apps, "guestbook").await;
    let app = status_until(
        env,
        &apps,
        "guestbook",
        "Synced and Healthy at the second commit",
        |a| deployed(a, &second),
    )
    .await;
    assert_eq!(app["status"]["resources"].as_array().unwrap().len(), 2);
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["value"], "v2");
    assert_eq!(cms.get("b").await.unwrap().data.unwrap()["value"], "new");
    // The controller takes the request off once it has refreshed.
    let app = status_until(
        env,
        &apps,
        "guestbook",
        "the refresh annotation removed",
        |a| a["metadata"]["annotations"][REFRESH].is_null(),
    )
    .await;
    let history = app["status"]["history"].as_array().unwrap();
    assert_eq!(
        history
            .iter()
            .map(|h| h["revision"].as_str().unwrap())
            .collect::<Vec<_>>(),
        [first.as_str(), second.as_str()]
    );

    // Pruning: a file removed from Git goes from the cluster.
    let third = repo.remove("drop b", &["app/b.yaml"]).unwrap();
    refresh(&apps, "guestbook").await;
    status_until(
        env,
        &apps,
        "guestbook",
        "Synced and Healthy at the third commit",
        |a| deployed(a, &third),
    )
    .await;
    wait::until("ConfigMap b pruned", TIMEOUT, || async {
        match cms.get_opt("b").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        env.git.log_tail(50).contains("guestbook.git"),
        "the repo-server fetched from the Git server:\n{}",
        env.git.log_tail(50)
    );
}

#[tokio::test]
async fn a_sync_operation_runs_once_and_reports_its_state() {
    let env = env().await;
    let client = env.cluster.client().await.unwrap();
    // No automated sync policy: Argo CD compares but does not deploy.
    let (ns, _repo, sha, apps) = one_config_map_app(env, "manual", ("m", "1"), false).await;
    let app = status_until(env, &apps, "manual", "OutOfSync and Missing", |a| {
        a["status"]["sync"]["status"] == "OutOfSync"
            && a["status"]["health"]["status"] == "Missing"
            && a["status"]["sync"]["revision"] == sha.as_str()
    })
    .await;
    assert!(app["status"]["operationState"].is_null(), "{app}");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    assert!(cms.get_opt("m").await.unwrap().is_none());

    // What `argocd app sync` (and a sync requested on the hub) does: set
    // `operation`; the controller runs it, records operationState and
    // clears `operation`.
    apps.patch(
        "manual",
        &PatchParams::default(),
        &Patch::Merge(json!({ "operation": {
            "initiatedBy": { "username": "argocd-pull-tests" },
            "sync": { "revision": "main" },
        }})),
    )
    .await
    .unwrap();
    let app = status_until(env, &apps, "manual", "the sync operation to succeed", |a| {
        a["status"]["operationState"]["phase"] == "Succeeded" && synced_healthy_at(a, &sha)
    })
    .await;
    let op = &app["status"]["operationState"];
    assert_eq!(
        op["operation"]["initiatedBy"]["username"],
        "argocd-pull-tests"
    );
    assert_eq!(op["syncResult"]["revision"], sha.as_str());
    assert!(op["startedAt"].is_string() && op["finishedAt"].is_string());
    assert!(app["operation"].is_null(), "operation cleared: {app}");
    assert_eq!(cms.get("m").await.unwrap().data.unwrap()["value"], "1");
    assert_eq!(app["status"]["history"].as_array().unwrap().len(), 1);
}

async fn hub() -> (&'static Cluster, &'static argocd::Hub) {
    static HUB: OnceCell<(&'static Cluster, argocd::Hub)> = OnceCell::const_new();
    let (cluster, hub) = HUB
        .get_or_init(|| async {
            testenv::init_tracing();
            let cluster = testenv::shared("hub", CrdSet::Hub)
                .await
                .expect("the hub starts");
            let hub = argocd::Hub::start(cluster, HubOptions::default())
                .await
                .expect("the applicationset-controller starts");
            (cluster, hub)
        })
        .await;
    (cluster, hub)
}

/// Creates an ApplicationSet whose Applications are dormant hub copies,
/// the way argocd-pull users write them; returns the ApplicationSets' API.
async fn create_applicationset(
    client: &kube::Client,
    name: &str,
    generator: Value,
    app_name: &str,
    server: &str,
) -> Api<DynamicObject> {
    let appsets = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NAMESPACE,
        &applicationset_resource(),
    );
    let appset: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "generators": [generator],
            "template": {
                "metadata": {
                    "name": app_name,
                    "labels": { "apps.open-cluster-management.io/pull-to-ocm-managed-cluster": "true" },
                    "annotations": {
                        "argocd.argoproj.io/skip-reconcile": "true",
                        "apps.open-cluster-management.io/ocm-managed-cluster": "{{name}}",
                    },
                },
                "spec": {
                    "project": argocd::DEFAULT_PROJECT,
                    "source": { "repoURL": "git://127.0.0.1:9/x.git", "targetRevision": "main", "path": "app" },
                    "destination": { "server": server, "namespace": "guestbook" },
                },
            },
        },
    }))
    .expect("a valid ApplicationSet");
    appsets
        .create(&PostParams::default(), &appset)
        .await
        .unwrap();
    appsets
}

/// What argocd-pull sets up on the hub for each ManagedCluster: an Argo CD
/// cluster Secret, without which Argo CD refuses Applications for it.
async fn cluster_secrets(client: &kube::Client) {
    let pp = PatchParams::apply("argocd-pull-tests").force();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    for name in ["cluster1", "cluster2"] {
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": format!("{name}-cluster-secret"), "namespace": NAMESPACE,
                          "labels": { "argocd.argoproj.io/secret-type": "cluster" } },
            "stringData": { "name": name, "server": server_of(name) },
        }))
        .unwrap();
        secrets
            .patch(
                &format!("{name}-cluster-secret"),
                &pp,
                &Patch::Apply(&secret),
            )
            .await
            .unwrap();
    }
}

fn server_of(cluster: &str) -> String {
    format!("https://{cluster}-control-plane:6443")
}

async fn generated(apps: &Api<DynamicObject>, appset: &str, want: &[&str]) -> Vec<Value> {
    wait::until(&format!("Applications {want:?}"), TIMEOUT, || async {
        let list = apps
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut mine: Vec<Value> = list
            .items
            .iter()
            .filter(|a| {
                a.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "ApplicationSet" && o.name == appset)
            })
            .map(|a| serde_json::to_value(a).expect("serializable"))
            .collect();
        mine.sort_by_key(|a| {
            a["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        });
        let names: Vec<&str> = mine
            .iter()
            .map(|a| a["metadata"]["name"].as_str().unwrap_or_default())
            .collect();
        if names == want {
            Ok(mine)
        } else {
            Err(format!("{names:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn the_hub_generates_applications_from_a_list() {
    let (cluster, hub) = hub().await;
    let client = cluster.client().await.unwrap();
    cluster_secrets(&client).await;
    let generator = json!({ "list": { "elements": [
        { "name": "cluster1", "url": server_of("cluster1") },
        { "name": "cluster2", "url": server_of("cluster2") },
    ]}});
    let appsets =
        create_applicationset(&client, "from-list", generator, "{{name}}-list", "{{url}}").await;

    let apps = applications(&client);
    let got = generated(&apps, "from-list", &["cluster1-list", "cluster2-list"]).await;
    for (app, cluster) in got.iter().zip(["cluster1", "cluster2"]) {
        assert_eq!(app["spec"]["destination"]["server"], server_of(cluster));
        let annotations = &app["metadata"]["annotations"];
        assert_eq!(annotations["argocd.argoproj.io/skip-reconcile"], "true");
        assert_eq!(
            annotations["apps.open-cluster-management.io/ocm-managed-cluster"],
            cluster
        );
        assert_eq!(
            app["metadata"]["labels"]["apps.open-cluster-management.io/pull-to-ocm-managed-cluster"],
            "true"
        );
        // Dormant: nothing on the hub reconciles it (the applicationset-
        // controller only writes an empty status).
        assert!(app["status"]["reconciledAt"].is_null(), "{app}");
        assert!(app["status"]["health"]["status"].is_null(), "{app}");
    }
    let appset = wait::until("ApplicationSet status", TIMEOUT, || async {
        let a = serde_json::to_value(appsets.get("from-list").await.map_err(|e| e.to_string())?)
            .expect("serializable");
        let up_to_date = a["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "ResourcesUpToDate" && c["status"] == "True");
        if up_to_date {
            Ok(a)
        } else {
            Err(a["status"].to_string())
        }
    })
    .await;
    assert_eq!(
        appset["status"]["resourcesCount"],
        2,
        "{}\n{}",
        appset["status"],
        hub.log_tail(20)
    );
}

#[tokio::test]
async fn the_hub_generates_applications_from_placement_decisions() {
    let (cluster, _hub) = hub().await;
    let client = cluster.client().await.unwrap();
    let pp = PatchParams::apply("argocd-pull-tests").force();
    // The cluster Secrets, and the generator's ConfigMap (upstream's pull
    // integration's) that tells Argo CD how to read PlacementDecisions.
    cluster_secrets(&client).await;
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "ocm-placement-generator", "namespace": NAMESPACE },
        "data": {
            "apiVersion": "cluster.open-cluster-management.io/v1beta1",
            "kind": "placementdecisions",
            "statusListKey": "decisions",
            "matchKey": "clusterName",
        },
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .patch("ocm-placement-generator", &pp, &Patch::Apply(&cm))
        .await
        .unwrap();
    // The placement controller's output, written by the test: cluster1 first.
    let decisions = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NAMESPACE,
        &placement_decision_resource(),
    );
    let placement_label = "cluster.open-cluster-management.io/placement";
    let pd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
        "metadata": { "name": "guestbook-decision-1", "namespace": NAMESPACE,
                      "labels": { placement_label: "guestbook" } },
    }))
    .unwrap();
    decisions
        .patch("guestbook-decision-1", &pp, &Patch::Apply(&pd))
        .await
        .unwrap();
    let set_decisions = |clusters: &[&str]| {
        json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
            "status": { "decisions": clusters.iter()
                .map(|c| json!({ "clusterName": c, "reason": "" }))
                .collect::<Vec<_>>() },
        })
    };
    decisions
        .patch_status(
            "guestbook-decision-1",
            &pp,
            &Patch::Apply(set_decisions(&["cluster1"])),
        )
        .await
        .unwrap();

    let generator = json!({ "clusterDecisionResource": {
        "configMapRef": "ocm-placement-generator",
        "labelSelector": { "matchLabels": { placement_label: "guestbook" } },
        "requeueAfterSeconds": 2,
    }});
    create_applicationset(
        &client,
        "from-placement",
        generator,
        "{{name}}-placed",
        "{{server}}",
    )
    .await;
    let apps = applications(&client);
    let got = generated(&apps, "from-placement", &["cluster1-placed"]).await;
    assert_eq!(
        got[0]["spec"]["destination"]["server"],
        server_of("cluster1")
    );
    assert_eq!(
        got[0]["metadata"]["annotations"]["apps.open-cluster-management.io/ocm-managed-cluster"],
        "cluster1"
    );

    // The placement now picks cluster2 as well; the generator follows.
    decisions
        .patch_status(
            "guestbook-decision-1",
            &pp,
            &Patch::Apply(set_decisions(&["cluster1", "cluster2"])),
        )
        .await
        .unwrap();
    let got = generated(
        &apps,
        "from-placement",
        &["cluster1-placed", "cluster2-placed"],
    )
    .await;
    assert_eq!(
        got[1]["spec"]["destination"]["server"],
        server_of("cluster2")
    );
}

#[tokio::test]
async fn argocd_processes_go_when_dropped() {
    testenv::init_tracing();
    let mut config = ClusterConfig::new("drop", CrdSet::Managed);
    config.controller_manager = false;
    let cluster = Cluster::start(config).await.unwrap();
    let (spoke, git) = tokio::join!(
        Spoke::start(&cluster, SpokeOptions::default()),
        GitServer::start()
    );
    let (spoke, git) = (spoke.unwrap(), git.unwrap());
    let repo = git.create_repo("r").unwrap();
    let port = repo
        .url()
        .trim_start_matches("git://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .parse::<u16>()
        .unwrap();
    let addrs = [
        spoke.repo_server(),
        spoke.redis(),
        ([127, 0, 0, 1], port).into(),
    ];
    let dir = spoke.dir().to_path_buf();
    for addr in addrs {
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok(), "{addr}");
    }
    drop(spoke);
    drop(git);
    for addr in addrs {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "{addr} still served"
        );
    }
    assert!(!dir.exists() || std::env::var_os("ARGOCD_PULL_KEEP_DATA").is_some());
    // The cluster itself is still there.
    cluster
        .client()
        .await
        .unwrap()
        .apiserver_version()
        .await
        .unwrap();
}
