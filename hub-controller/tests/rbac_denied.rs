//! What the hub-controller's service account must not be able to do, tried
//! for real: requests as the service account (a client certificate for its
//! user name) against a hub where `deploy/hub` is installed, each refused
//! by RBAC or by deploy/hub's admission policies, next to the one it does
//! need, which goes through (so a refusal is about the request, not a
//! broken setup). `rbac.rs` runs the controller itself with these rights.

use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::ocm::ManifestWork;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::wait;

mod common;
use common::managed_cluster;

const MANAGER: &str = "argocd-pull-hub";
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The request was refused (403 from RBAC, or the admission policy).
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

fn allowed<T>(what: &str, r: Result<T, kube::Error>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: the hub-controller needs this: {e}"))
}

/// Creates the ManifestWork `work` (as [`work`] writes one).
async fn create_work(api: &Api<ManifestWork>, work: &Value) {
    let work: ManifestWork = serde_json::from_value(work.clone()).unwrap();
    api.create(&PostParams::default(), &work).await.unwrap();
}

fn work(name: &str, ns: &str, labels: Value, annotations: Value, data: &str) -> Value {
    json!({
        "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": { "name": name, "namespace": ns, "labels": labels, "annotations": annotations },
        "spec": { "workload": { "manifests": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "cm", "namespace": "default" },
            "data": { "k": data },
        }]}},
    })
}

/// Applies `body` as `name` with `api` the way the hub-controller does
/// (its field manager, forced).
async fn apply<K>(api: &Api<K>, name: &str, body: Value) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
}

#[tokio::test]
async fn the_service_account_cannot_reach_beyond_what_argocd_pull_owns() {
    let (hub, admin, kubeconfig) = common::deployed_hub("hub-rbac-denied").await;
    managed_cluster(&hub, "cluster1").await;
    let sa = testenv::client_for(&kubeconfig).await.unwrap();
    // A hub Application of a tenant.
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": "x", "namespace": "default" },
        "spec": { "project": "default", "destination": {} },
    }))
    .unwrap();
    let admin_apps: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), "default", &application_resource());
    let mut hub_app = app.clone();
    hub_app.metadata.annotations = Some([("team".to_string(), "a".to_string())].into());
    hub_app.metadata.finalizers = Some(vec!["resources-finalizer.argocd.argoproj.io".into()]);
    admin_apps
        .create(&PostParams::default(), &hub_app)
        .await
        .unwrap();
    // Admission policies take effect a moment after they are created: wait
    // until a write each forbids is refused (dry runs: nothing is stored).
    let probe: Api<Secret> = Api::namespaced(sa.clone(), "argocd");
    let probe_apps: Api<DynamicObject> =
        Api::namespaced_with(sa.clone(), "default", &application_resource());
    wait::until("the admission policies in force", TIMEOUT, || async {
        let dry = PatchParams {
            dry_run: true,
            ..PatchParams::apply(MANAGER).force()
        };
        let body = json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "probe" } });
        let secret = probe.patch("probe", &dry, &Patch::Apply(body)).await;
        let dry = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        let spec = json!({ "spec": { "project": "probe" } });
        let app = probe_apps.patch("x", &dry, &Patch::Merge(spec)).await;
        match (secret, app) {
            (Err(kube::Error::Api(s)), Err(kube::Error::Api(a)))
                if s.code == 403 && a.code == 403 =>
            {
                Ok(())
            }
            (s, a) => Err(format!(
                "secret {:?}, application {:?}",
                s.map(|_| "allowed"),
                a.map(|_| "allowed")
            )),
        }
    })
    .await;

    // Secrets: Argo CD's own are neither readable one by one nor writable.
    let admin_secrets: Api<Secret> = Api::namespaced(admin.clone(), "argocd");
    let argocd_secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "argocd-secret" },
        "stringData": { "admin.password": "hash" },
    }))
    .unwrap();
    admin_secrets
        .create(&PostParams::default(), &argocd_secret)
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(sa.clone(), "argocd");
    refused("get argocd-secret", secrets.get("argocd-secret").await);
    refused(
        "overwrite argocd-secret",
        apply(
            &secrets,
            "argocd-secret",
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": { "name": "argocd-secret", "labels": {
                    "app.kubernetes.io/managed-by": "argocd-pull",
                    "argocd.argoproj.io/secret-type": "cluster" } },
                "stringData": { "admin.password": "mine" },
            }),
        )
        .await,
    );
    let cluster_secret = |name: &str, labelled: bool| {
        let labels = if labelled {
            json!({ "app.kubernetes.io/managed-by": "argocd-pull", "argocd.argoproj.io/secret-type": "cluster" })
        } else {
            json!({ "argocd.argoproj.io/secret-type": "cluster" })
        };
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "labels": labels },
            "stringData": { "name": "c", "server": "https://c" },
        })
    };
    refused(
        "create an unlabelled cluster Secret",
        apply(
            &secrets,
            "cluster9-cluster-secret",
            cluster_secret("cluster9-cluster-secret", false),
        )
        .await,
    );
    refused(
        "create a Secret of another name",
        apply(&secrets, "repo-creds", cluster_secret("repo-creds", true)).await,
    );
    allowed(
        "its own cluster Secret",
        apply(
            &secrets,
            "cluster9-cluster-secret",
            cluster_secret("cluster9-cluster-secret", true),
        )
        .await,
    );
    refused(
        "delete a Secret",
        secrets
            .delete("cluster9-cluster-secret", &DeleteParams::default())
            .await,
    );
    refused(
        "list Secrets in every namespace",
        Api::<Secret>::all(sa.clone())
            .list(&ListParams::default())
            .await,
    );
    refused(
        "read a Secret in argocd-pull other than its CAs",
        Api::<Secret>::namespaced(sa.clone(), "argocd-pull")
            .get("anything")
            .await,
    );

    // Leases in its own namespace only (the leader Lease, the replicas'
    // presences and the clusters' claims have names made at run time).
    for ns in ["default", "kube-system", "kube-node-lease"] {
        let leases: Api<Lease> = Api::namespaced(sa.clone(), ns);
        refused(
            &format!("list the Leases in {ns}"),
            leases.list(&ListParams::default()).await,
        );
    }

    // Applications: never created or deleted.
    let apps: Api<DynamicObject> =
        Api::namespaced_with(sa.clone(), "default", &application_resource());
    refused(
        "create an Application",
        apps.create(&PostParams::default(), &app).await,
    );
    refused(
        "delete an Application",
        apps.delete("x", &DeleteParams::default()).await,
    );
    // An Application it may patch (status, annotations of its own), but not
    // its spec or labels: one the hub's Argo CD reconciles must stay out of
    // the controller's reach.
    for (what, patch) in [
        (
            "change an Application's spec",
            json!({ "spec": { "source": { "repoURL": "https://evil.example.com/r.git" } } }),
        ),
        (
            "label an Application",
            json!({ "metadata": { "labels": { "argocd-pull.io/mirror-of": "cluster1" } } }),
        ),
        (
            "change someone else's annotation",
            json!({ "metadata": { "annotations": { "team": "b" } } }),
        ),
        (
            "add a finalizer",
            json!({ "metadata": { "finalizers": ["resources-finalizer.argocd.argoproj.io", "x/y"] } }),
        ),
    ] {
        refused(
            what,
            Api::<DynamicObject>::namespaced_with(sa.clone(), "default", &application_resource())
                .patch("x", &PatchParams::default(), &Patch::Merge(patch))
                .await,
        );
    }
    let sa_apps: Api<DynamicObject> =
        Api::namespaced_with(sa.clone(), "default", &application_resource());
    allowed(
        "write status, an own annotation, release a finalizer",
        sa_apps
            .patch(
                "x",
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": { "annotations": { "argocd-pull.io/x": "1" }, "finalizers": null },
                    "status": { "health": { "status": "Healthy" } },
                })),
            )
            .await,
    );

    // ManifestWorks: its own only. An OCM addon's work deploys to every
    // managed cluster: the controller must not be able to change it.
    let admin_works: Api<ManifestWork> = Api::namespaced(admin.clone(), "cluster1");
    let addon_work = work(
        "addon-other-deploy-0",
        "cluster1",
        json!({}),
        json!({}),
        "a",
    );
    create_work(&admin_works, &addon_work).await;
    let upstream = work(
        "gb-12345",
        "cluster1",
        json!({}),
        json!({ "apps.open-cluster-management.io/hub-application-name": "gb",
                "apps.open-cluster-management.io/hub-application-namespace": "team" }),
        "a",
    );
    create_work(&admin_works, &upstream).await;
    let works: Api<ManifestWork> = Api::namespaced(sa.clone(), "cluster1");
    let mut changed = addon_work.clone();
    changed["spec"]["workload"]["manifests"][0]["data"]["k"] = json!("evil");
    refused(
        "change an addon's work",
        apply(&works, "addon-other-deploy-0", changed).await,
    );
    refused(
        "delete an addon's work",
        works
            .delete("addon-other-deploy-0", &DeleteParams::default())
            .await,
    );
    refused(
        "create an unlabelled work",
        apply(
            &works,
            "new",
            work("new", "cluster1", json!({}), json!({}), "a"),
        )
        .await,
    );
    allowed(
        "its own work",
        apply(
            &works,
            "team.gb",
            work(
                "team.gb",
                "cluster1",
                json!({ "app.kubernetes.io/managed-by": "argocd-pull" }),
                json!({}),
                "a",
            ),
        )
        .await,
    );
    // argocd-pull-integration's work: orphaned and deleted, never rewritten.
    refused(
        "rewrite argocd-pull-integration's work",
        works
            .patch(
                "gb-12345",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "workload": { "manifests": [] } } })),
            )
            .await,
    );
    allowed(
        "orphan argocd-pull-integration's work",
        works
            .patch(
                "gb-12345",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "spec": { "deleteOption": { "propagationPolicy": "Orphan" } } }),
                ),
            )
            .await,
    );
    allowed(
        "delete argocd-pull-integration's work",
        works.delete("gb-12345", &DeleteParams::default()).await,
    );
    assert!(
        admin_works
            .get("addon-other-deploy-0")
            .await
            .unwrap()
            .spec
            .workload
            .unwrap()
            .manifests
            .unwrap()[0]["data"]["k"]
            == "a"
    );
}
