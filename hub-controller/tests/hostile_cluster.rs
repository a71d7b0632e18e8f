//! A hostile managed cluster on a real API server: its klusterlet writes
//! `ManagedCluster.spec.managedClusterClientConfigs`, which the Argo CD
//! cluster Secret's `server` is copied from, and may give
//! another cluster's.

use std::time::Duration;

use argocd_pull_apis::ocm::ManagedCluster;
use argocd_pull_hub_controller::transport::manifestwork;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::wait;

mod common;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A cluster whose URL points at the hub's own API server, a loopback or
/// an in-cluster address gets a Secret with the placeholder server (so
/// ApplicationSet cluster generators still list it) and a Warning Event
/// on its ManagedCluster saying what to fix; a real URL is kept.
#[tokio::test]
async fn a_cluster_secret_never_points_at_the_hub_a_loopback_or_inside_a_cluster() {
    let (cluster, client) = common::start_hub("hub").await;
    cluster.ensure_namespace("argocd").await.unwrap();
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    // What the hub-controller passes: the host of its own API server.
    let hub_host = "hub.argocd-pull.test".to_string();
    tokio::spawn(manifestwork::cluster_secrets::run(
        client.clone(),
        "argocd".into(),
        vec![hub_host.clone()],
        Default::default(),
        shutdown,
    ));

    let clusters: Api<ManagedCluster> = Api::all(client.clone());
    let cases = [
        ("good", "https://api.good.example:6443".to_string(), true),
        (
            "in-cluster",
            "https://kubernetes.default.svc".to_string(),
            false,
        ),
        ("loopback", "https://127.0.0.1:6443".to_string(), false),
        ("metadata", "https://169.254.169.254".to_string(), false),
        ("hub-itself", format!("https://{hub_host}:6443"), false),
    ];
    for (name, url, _) in &cases {
        let mc: ManagedCluster = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": { "name": name },
            "spec": { "hubAcceptsClient": true, "managedClusterClientConfigs": [{ "url": url }] }
        }))
        .unwrap();
        clusters.create(&PostParams::default(), &mc).await.unwrap();
    }

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "argocd");
    let events: Api<Event> = Api::all(client.clone());
    for (name, url, kept) in &cases {
        let secret = wait::exists(&secrets, &format!("{name}-cluster-secret"), TIMEOUT).await;
        let data = secret.data.unwrap();
        let server = String::from_utf8(data["server"].0.clone()).unwrap();
        assert_eq!(String::from_utf8_lossy(&data["name"].0), *name);
        if *kept {
            assert_eq!(&server, url);
            continue;
        }
        assert_eq!(server, format!("https://{name}"), "{name}: {url}");
        let fields = format!("involvedObject.kind=ManagedCluster,involvedObject.name={name}");
        let note = wait::warning(&events, &fields, "ClusterURLRefused", TIMEOUT)
            .await
            .message
            .unwrap_or_default();
        assert!(
            note.contains(url.as_str()) && note.contains("externalServerURLs"),
            "{name}: {note}"
        );
    }
    // The good cluster has no such event.
    let good = events
        .list(
            &ListParams::default()
                .fields("involvedObject.kind=ManagedCluster,involvedObject.name=good"),
        )
        .await
        .unwrap();
    assert!(
        good.items
            .iter()
            .all(|e| e.reason.as_deref() != Some("ClusterURLRefused")),
        "{:?}",
        good.items
    );
    stop.fire();
}

/// The `server` a cluster's Secret has.
async fn server_of(secrets: &Api<Secret>, cluster: &str, want: &str, what: &str) {
    let name = format!("{cluster}-cluster-secret");
    wait::until(what, TIMEOUT, || async {
        let s = secrets.get_opt(&name).await.map_err(|e| e.to_string())?;
        let server = s.and_then(|s| s.data).and_then(|d| {
            d.get("server")
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        });
        if server.as_deref() == Some(want) {
            Ok(())
        } else {
            Err(format!("{cluster}: server {server:?}"))
        }
    })
    .await;
}

/// A cluster giving another's URL, or another's placeholder, would make
/// the hub's Argo CD take it for the other. Of two clusters that give one
/// URL the first registered keeps it; the other gets its placeholder and
/// a Warning Event naming the keeper; a cluster registered later under a
/// name that an earlier cluster's URL is takes nothing (it gets a server
/// under `.invalid`); and when a cluster takes a URL over or gives it
/// back, the other cluster's Secret follows.
#[tokio::test]
async fn a_cluster_never_gets_another_clusters_server() {
    let (cluster, client) = common::start_hub("hub").await;
    cluster.ensure_namespace("argocd").await.unwrap();
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    tokio::spawn(manifestwork::cluster_secrets::run(
        client.clone(),
        "argocd".into(),
        vec!["hub.argocd-pull.test".into()],
        Default::default(),
        shutdown,
    ));
    let clusters: Api<ManagedCluster> = Api::all(client.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "argocd");
    let events: Api<Event> = Api::all(client.clone());
    let create = |name: &'static str, url: Option<&'static str>| {
        let clusters = clusters.clone();
        async move {
            let configs = url.map(|u| json!([{ "url": u }])).unwrap_or(json!([]));
            let mc: ManagedCluster = serde_json::from_value(json!({
                "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
                "metadata": { "name": name },
                "spec": { "hubAcceptsClient": true, "managedClusterClientConfigs": configs }
            }))
            .unwrap();
            clusters.create(&PostParams::default(), &mc).await.unwrap();
        }
    };
    let set_url = |name: &'static str, url: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({ "spec": { "managedClusterClientConfigs": [{ "url": url }] } }),
                    ),
                )
                .await
                .unwrap();
        }
    };
    let refused_for = |name: &'static str, keeper: &'static str| {
        let events = events.clone();
        async move {
            let fields = format!("involvedObject.kind=ManagedCluster,involvedObject.name={name}");
            let note = wait::warning(&events, &fields, "ClusterURLRefused", TIMEOUT)
                .await
                .message
                .unwrap_or_default();
            assert!(note.contains(&format!("{keeper:?}")), "{name}: {note}");
        }
    };

    // Registered first (and first by name, should the second be the same).
    const HONEST: &str = "https://api.honest.example:6443";
    create("honest", Some(HONEST)).await;
    server_of(&secrets, "honest", HONEST, "honest's Secret").await;
    create("thief", Some("https://API.honest.example:6443/")).await;
    create("bystander", None).await;
    create("squatter", Some("https://bystander")).await;
    server_of(
        &secrets,
        "thief",
        "https://thief",
        "the thief's placeholder",
    )
    .await;
    server_of(
        &secrets,
        "squatter",
        "https://squatter",
        "the squatter's placeholder",
    )
    .await;
    server_of(
        &secrets,
        "bystander",
        "https://bystander",
        "the bystander's",
    )
    .await;
    refused_for("thief", "honest").await;
    refused_for("squatter", "bystander").await;

    // A cluster registered earlier takes a later one's URL, then gives it
    // back: the later one's Secret follows both ways.
    const LATE: &str = "https://api.late.example:6443";
    create("early", Some("https://api.early.example:6443")).await;
    create("late", Some(LATE)).await;
    server_of(&secrets, "late", LATE, "late's own URL").await;
    set_url("early", LATE).await;
    server_of(&secrets, "early", LATE, "early takes the URL").await;
    server_of(&secrets, "late", "https://late", "late gives it up").await;
    set_url("early", "https://api.early.example:6443").await;
    server_of(&secrets, "late", LATE, "late gets its URL back").await;

    // An earlier cluster's real URL is a later cluster's name: the later
    // one takes nothing, it gets its last resort, and its placeholder once
    // the earlier one gives that URL up.
    create("first", Some("https://named")).await;
    server_of(&secrets, "first", "https://named", "first's own URL").await;
    create("named", None).await;
    server_of(
        &secrets,
        "named",
        "https://named.argocd-pull.invalid",
        "named's last resort",
    )
    .await;
    server_of(&secrets, "first", "https://named", "first keeps its URL").await;
    set_url("first", "https://api.first.example:6443").await;
    server_of(
        &secrets,
        "named",
        "https://named",
        "named has its placeholder once first no longer gives it",
    )
    .await;
    server_of(
        &secrets,
        "honest",
        HONEST,
        "honest keeps its URL throughout",
    )
    .await;
    stop.fire();
}
