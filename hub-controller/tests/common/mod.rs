//! Fixtures shared by the hub-controller's integration tests: what OCM and
//! the work agent would do on a real hub, done by hand.
#![allow(dead_code)]

pub mod addon;
pub mod grpc_client;
pub mod logs;
pub mod ocm;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::placement_decision_resource;
use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork, Placement};
use kube::api::DynamicObject;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::{Cluster, ClusterConfig, CrdSet};

/// A hub (an API server with the hub's CRDs) named `name`, logging to the
/// test output, and an admin client of it.
pub async fn start_hub(name: &str) -> (Cluster, kube::Client) {
    testenv::init_tracing();
    let hub = Cluster::start(ClusterConfig::new(name, CrdSet::Hub))
        .await
        .unwrap();
    let client = hub.client().await.unwrap();
    (hub, client)
}

/// A hub as `deploy/hub` leaves it: [`start_hub`], Argo CD's namespace,
/// `kubectl apply -k deploy/hub`; and a kubeconfig with the identity of
/// the hub-controller's service account (its user name and group).
pub async fn deployed_hub(name: &str) -> (Cluster, kube::Client, std::path::PathBuf) {
    let (hub, client) = start_hub(name).await;
    // Argo CD's namespace exists on a hub with Argo CD installed.
    hub.ensure_namespace("argocd").await.unwrap();
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/hub");
    let out = kubectl(hub.kubeconfig(), &["apply", "-k", deploy.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "kubectl apply -k deploy/hub: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sa = hub.dir().join("hub-controller-sa.kubeconfig");
    hub.write_kubeconfig_as(
        "system:serviceaccount:argocd-pull:argocd-pull-hub-controller",
        Some("system:serviceaccounts"),
        &sa,
    )
    .unwrap();
    (hub, client, sa)
}

/// Runs the test cache's `kubectl` with `kubeconfig`.
pub fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(testenv::paths::bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap()
}

/// Creates `object` with `api` and returns what the API server made of it.
pub async fn create<K>(api: &Api<K>, object: &K) -> K
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await.unwrap()
}

/// Merge-patches `name` with `patch`.
pub async fn merge<K>(api: &Api<K>, name: &str, patch: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap()
}

/// The objects `api` lists with `params`, by name.
pub async fn by_name<K>(
    api: &Api<K>,
    params: &kube::api::ListParams,
) -> Result<std::collections::BTreeMap<String, K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(params)
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .map(|o| (kube::ResourceExt::name_any(&o), o))
        .collect())
}

/// Merge-patches Application `name`'s `spec.source.<field>` to `value`.
pub async fn set_source(api: &Api<Application>, name: &str, field: &str, value: &str) {
    merge(api, name, json!({ "spec": { "source": { field: value } } })).await;
}

pub use testenv::names;

/// What OCM registration leaves on the hub for a joined cluster: the
/// ManagedCluster and its namespace.
pub async fn managed_cluster(hub: &Cluster, name: &str) {
    let client = &hub.client().await.unwrap();
    hub.ensure_namespace(name).await.unwrap();
    let mc: ManagedCluster = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": { "name": name }, "spec": { "hubAcceptsClient": true }
    }))
    .unwrap();
    Api::<ManagedCluster>::all(client.clone())
        .create(&PostParams::default(), &mc)
        .await
        .unwrap();
}

/// A Placement `placement` in `ns` and what OCM's placement controller
/// does for it when it selects `clusters`: a PlacementDecision it controls,
/// with the decisions in its status. (Only such decisions authorize.)
pub async fn placement_selects(client: &kube::Client, ns: &str, clusters: &[&str]) {
    let placement: Placement = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
        "metadata": { "name": "placement", "namespace": ns }, "spec": {}
    }))
    .unwrap();
    let placement = Api::<Placement>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &placement)
        .await
        .unwrap();
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &placement_decision_resource());
    let pd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
        "metadata": { "name": "placement-decision-1", "namespace": ns,
                      "labels": { keys::PLACEMENT_LABEL: "placement" },
                      "ownerReferences": [{
                          "apiVersion": "cluster.open-cluster-management.io/v1beta1",
                          "kind": "Placement", "name": "placement",
                          "uid": placement.metadata.uid, "controller": true,
                          "blockOwnerDeletion": true }] }
    }))
    .unwrap();
    api.create(&PostParams::default(), &pd).await.unwrap();
    let decisions: Vec<Value> = clusters
        .iter()
        .map(|c| json!({ "clusterName": c, "reason": "" }))
        .collect();
    api.patch_status(
        "placement-decision-1",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "decisions": decisions } })),
    )
    .await
    .unwrap();
}

pub fn app(name: &str, ns: &str, annotations: Value, extra: Value) -> Application {
    let mut v = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": ns,
            "labels": { keys::PULL_LABEL: "true" },
            "annotations": annotations },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://git.example/repo.git", "path": "app", "targetRevision": "HEAD" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" }
        }
    });
    for (k, val) in extra.as_object().cloned().unwrap_or_default() {
        if k == "finalizers" {
            v["metadata"]["finalizers"] = val;
        } else {
            v[k] = val;
        }
    }
    serde_json::from_value(v).unwrap()
}

/// An Application `name` in `ns` for `cluster` and nothing else special.
pub fn app_for(name: &str, ns: &str, cluster: &str) -> Application {
    app(
        name,
        ns,
        json!({ keys::MANAGED_CLUSTER: cluster }),
        json!({}),
    )
}

pub fn apps_api(client: &kube::Client, ns: &str) -> Api<Application> {
    Api::namespaced_with(client.clone(), ns, &application_resource())
}

/// Writes feedback the way the work agent does: through /status.
pub async fn feed_back(
    works: &Api<ManifestWork>,
    work: &str,
    app_ns: &str,
    app: &str,
    values: &[(&str, &str)],
) {
    let values: Vec<Value> = values
        .iter()
        .map(|(n, v)| json!({ "name": n, "fieldValue": { "type": "String", "string": v } }))
        .collect();
    let now = "2026-11-21T10:00:00Z";
    let status = json!({ "status": {
        "conditions": [{ "type": "Applied", "status": "True", "reason": "AppliedManifestWorkComplete",
                         "message": "Apply manifest work complete", "lastTransitionTime": now }],
        "resourceStatus": { "manifests": [{
            "resourceMeta": { "group": "argoproj.io", "version": "v1alpha1", "kind": "Application",
                              "resource": "applications", "namespace": app_ns, "name": app, "ordinal": 0 },
            "conditions": [{ "type": "Applied", "status": "True", "reason": "AppliedManifestComplete",
                             "message": "Apply manifest complete", "lastTransitionTime": now }],
            "statusFeedback": { "values": values }
        }]}
    }});
    works
        .patch_status(work, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// The arguments that make the hub-controller serve gRPC on `grpc` with
/// certificates it keeps itself (`--grpc-manage-certificates`), its files
/// in `files`, any namespace allowed to target any cluster.
pub fn kept_certificates(grpc: std::net::SocketAddr, files: &std::path::Path) -> Vec<String> {
    let file = |n: &str| files.join(n).display().to_string();
    vec![
        "--authorization=none".into(),
        "--grpc-addr".into(),
        grpc.to_string(),
        "--grpc-manage-certificates".into(),
        "--grpc-san=127.0.0.1".into(),
        "--grpc-tls-cert".into(),
        file("tls.crt"),
        "--grpc-tls-key".into(),
        file("tls.key"),
        "--grpc-client-ca".into(),
        file("ca.crt"),
    ]
}

/// The hub-controller binary against `hub`, with its admin port; killed
/// when dropped.
pub struct Binary {
    pub child: tokio::process::Child,
    pub admin: std::net::SocketAddr,
}

impl Binary {
    pub fn start(hub: &Cluster, args: &[&str]) -> Self {
        Self::start_as(hub.kubeconfig(), args, std::process::Stdio::inherit())
    }

    /// With `kubeconfig`'s identity, logging to `stderr`.
    pub fn start_as(
        kubeconfig: &std::path::Path,
        args: &[&str],
        stderr: impl Into<std::process::Stdio>,
    ) -> Self {
        Self::start_from(
            std::path::Path::new(env!("CARGO_BIN_EXE_hub-controller")),
            kubeconfig,
            args,
            stderr,
        )
    }

    /// [`Binary::start_as`] with another build of the hub-controller (the
    /// previous release's, say).
    pub fn start_from(
        binary: &std::path::Path,
        kubeconfig: &std::path::Path,
        args: &[&str],
        stderr: impl Into<std::process::Stdio>,
    ) -> Self {
        let admin = testenv::net::free_addr().unwrap();
        let child = tokio::process::Command::new(binary)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--admin-addr")
            .arg(admin.to_string())
            .args(args)
            // The tests read per-cluster series.
            .env("ARGOCD_PULL_METRICS_PER_CLUSTER", "true")
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child, admin }
    }

    /// The value of an unlabelled metric, if the admin port answers.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        metric_at(self.admin, name).await
    }
}

/// The value of an unlabelled metric on the admin port `admin`, if it
/// answers.
pub async fn metric_at(admin: std::net::SocketAddr, name: &str) -> Option<f64> {
    let (_, body) = testenv::net::http_get(admin, "/metrics").await.ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The first manifest `work` delivers (our works deliver one).
pub fn first_manifest(work: &ManifestWork) -> &std::collections::BTreeMap<String, Value> {
    &work
        .spec
        .workload
        .as_ref()
        .expect("a workload")
        .manifests
        .as_ref()
        .expect("manifests")[0]
}

/// Waits until every object `api` lists is `done`; the failure counts
/// those that are not and shows the first with `show`.
pub async fn wait_all<K>(
    api: &Api<K>,
    what: &str,
    timeout: std::time::Duration,
    done: impl Fn(&K) -> bool,
    show: impl Fn(&K) -> String,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    testenv::wait::until(what, timeout, || async {
        let list = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let pending: Vec<String> = list.items.iter().filter(|o| !done(o)).map(&show).collect();
        match pending.first() {
            None => Ok(()),
            Some(first) => Err(format!("{} pending, e.g. {first}", pending.len())),
        }
    })
    .await;
}

/// Waits until `api` lists `n` objects with `params`.
pub async fn wait_count<K>(
    api: &Api<K>,
    params: &kube::api::ListParams,
    n: usize,
    what: &str,
    timeout: std::time::Duration,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    testenv::wait::until(what, timeout, || async {
        let there = api
            .list(params)
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        if there == n {
            Ok(())
        } else {
            Err(format!("{there} there"))
        }
    })
    .await;
}

/// The ManifestWork controller in this process with `client`, default
/// options, once its caches are synced; it stops when the trigger fires or
/// is dropped.
pub async fn run_controller(
    client: kube::Client,
) -> (
    std::sync::Arc<argocd_pull_hub_controller::transport::manifestwork::Context>,
    argocd_pull_runtime::shutdown::Trigger,
) {
    run_controller_with(client, Default::default()).await
}

/// [`run_controller`] with other ManifestWork options.
pub async fn run_controller_with(
    client: kube::Client,
    options: argocd_pull_hub_controller::render::work::WorkOptions,
) -> (
    std::sync::Arc<argocd_pull_hub_controller::transport::manifestwork::Context>,
    argocd_pull_runtime::shutdown::Trigger,
) {
    use argocd_pull_hub_controller::transport::manifestwork::{
        Context, controller, triggers::Gate,
    };
    use argocd_pull_hub_controller::watch::watches::{Scope, Watches};
    // Project-scoped credentials travel too (the binary's
    // `--project-credentials`).
    let watches = Watches::new(Scope {
        credentials: true,
        ..Scope::default()
    });
    let ctx = Context::new(
        client.clone(),
        options,
        argocd_pull_hub_controller::route::authz::Authorization::default(),
        argocd_pull_hub_controller::metrics::Metrics::default(),
        watches.caches(),
        None,
    );
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    // One term that lasts the whole test: this hub leads from the start.
    let gate = Gate::new(ctx.clone());
    let triggered = gate.open();
    tokio::spawn(watches.run(client, vec![gate], shutdown.clone().wait()));
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    // The leader's AppProject works, as `leading` runs them.
    tokio::spawn(
        argocd_pull_hub_controller::transport::manifestwork::projects::run(
            ctx.clone(),
            shutdown.clone(),
        ),
    );
    tokio::spawn(controller::run(
        ctx.clone(),
        triggered,
        move || {
            let _ = synced_tx.send(());
        },
        shutdown,
    ));
    synced_rx.await.expect("the Application cache syncs");
    (ctx, stop)
}

/// Every version object `name` went through after resourceVersion `from`,
/// read from a watch (so no write in between is missed), up to and
/// including the first one that satisfies `until`; fails after `timeout`
/// with `what` and the versions seen, or if the object is deleted.
pub async fn writes_until<K>(
    api: &Api<K>,
    name: &str,
    from: &str,
    timeout: std::time::Duration,
    what: &str,
    until: impl Fn(&K) -> bool,
) -> Vec<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::TryStreamExt;
    use kube::ResourceExt;
    use kube::api::{WatchEvent, WatchParams};
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen: Vec<K> = Vec::new();
    let mut version = from.to_string();
    loop {
        let stream = api.watch(&params, &version).await.unwrap();
        futures::pin_mut!(stream);
        // The API server ends a watch after a while: go on from the last version.
        while let Some(event) = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; versions since {from}: {seen:#?}"
                )
            })
            .unwrap()
        {
            match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    version = o.resource_version().unwrap_or_default();
                    let done = until(&o);
                    seen.push(o);
                    if done {
                        return seen;
                    }
                }
                WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                WatchEvent::Deleted(o) => panic!("{name} deleted while waiting for {what}: {o:?}"),
                WatchEvent::Error(e) => panic!("watching {name} for {what}: {e:?}"),
            }
        }
    }
}

/// The replicas' Leases of one role (`claim`, `presence`) that `leases`
/// lists.
pub async fn leases_of_role(
    leases: &Api<k8s_openapi::api::coordination::v1::Lease>,
    role: &str,
) -> Result<Vec<k8s_openapi::api::coordination::v1::Lease>, String> {
    use argocd_pull_hub_controller::transport::grpc::claims::ROLE_LABEL;
    let selector = format!("{ROLE_LABEL}={role}");
    let listed = leases
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(|e| e.to_string())?;
    Ok(listed.items)
}
