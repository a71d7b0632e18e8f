//! The ManifestWork transport against a real API server. The test plays the
//! OCM work agent's part by writing ManifestWork status through the status
//! subresource, exactly as the work agent does.

use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::placement_decision_resource;
use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork};
use argocd_pull_hub_controller::status::CONDITION;
use argocd_pull_hub_controller::transport::manifestwork::{self, Context};
use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt as _;
use kube::api::DynamicObject;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::{Cluster, wait};

mod common;
use common::{
    app, app_for, apps_api, feed_back, managed_cluster, merge, placement_selects, run_controller,
    set_source,
};

const TIMEOUT: Duration = Duration::from_secs(30);

struct Hub {
    cluster: Cluster,
    client: kube::Client,
    ctx: Arc<Context>,
    stop: argocd_pull_runtime::shutdown::Trigger,
}

async fn hub_with_controller() -> Hub {
    let (cluster, client) = common::start_hub("hub").await;
    let (ctx, stop) = run_controller(client.clone()).await;
    Hub {
        cluster,
        client,
        ctx,
        stop,
    }
}

/// The usual set-up: the controller on a hub with `cluster1` joined, and a
/// team namespace whose Placement selects it; with its Applications and
/// cluster1's ManifestWorks.
async fn one_cluster_team() -> (Hub, String, Api<Application>, Api<ManifestWork>) {
    let hub = hub_with_controller().await;
    managed_cluster(&hub.cluster, "cluster1").await;
    let ns = team_namespace(&hub, &["cluster1"]).await;
    let apps = apps_api(&hub.client, &ns);
    let works = Api::namespaced(hub.client.clone(), "cluster1");
    (hub, ns, apps, works)
}

/// A fresh namespace for Applications whose Placement selects `clusters`.
async fn team_namespace(hub: &Hub, clusters: &[&str]) -> String {
    let ns = hub.cluster.namespace("team").await.unwrap();
    placement_selects(&hub.client, &ns, clusters).await;
    ns
}

/// What OCM's placement controller writes when decision `name` selects
/// `clusters`.
async fn select(pds: &Api<DynamicObject>, name: &str, clusters: &[&str]) {
    let decisions: Vec<Value> = clusters
        .iter()
        .map(|c| json!({ "clusterName": c, "reason": "" }))
        .collect();
    pds.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "decisions": decisions } })),
    )
    .await
    .unwrap();
}

/// Whether `api` has `name`.
async fn exists<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_some()
}

/// One pass of the orphan sweep over `hub`'s caches; how many works it deleted.
async fn sweep(hub: &Hub) -> usize {
    manifestwork::sweep::sweep_once(&hub.client, &hub.ctx.caches, &hub.ctx.metrics)
        .await
        .unwrap()
}

#[tokio::test]
async fn delivers_hands_over_the_operation_reports_status_and_cleans_up() {
    let (hub, ns, apps, works) = one_cluster_team().await;

    let annotations = json!({ keys::MANAGED_CLUSTER: "cluster1", keys::SKIP_RECONCILE: "true" });
    let extra = json!({
        "finalizers": [keys::RESOURCES_FINALIZER],
        "operation": { "sync": { "revision": "HEAD" }, "initiatedBy": { "username": "alice" } }
    });
    apps.create(
        &PostParams::default(),
        &app("guestbook", &ns, annotations, extra),
    )
    .await
    .unwrap();

    let work_name = format!("{ns}.guestbook");
    let work = wait::exists(&works, &work_name, TIMEOUT).await;
    let manifest = &work.spec.workload.unwrap().manifests.unwrap()[0];
    assert_eq!(manifest["metadata"]["namespace"], json!(ns));
    assert!(
        manifest["metadata"]["annotations"]
            .get(keys::SKIP_RECONCILE)
            .is_none()
    );
    assert!(
        manifest["metadata"]["labels"]
            .get(keys::PULL_LABEL)
            .is_none()
    );

    // The operation is handed over once: gone from the hub copy.
    wait::until("operation removed from the hub copy", TIMEOUT, || async {
        let a = apps.get("guestbook").await.map_err(|e| e.to_string())?;
        if a.data.get("operation").is_none() {
            Ok(())
        } else {
            Err("still there".to_string())
        }
    })
    .await;

    // The work keeps carrying the operation until the spoke has started it.
    let carried = |w: ManifestWork| {
        w.spec.workload.unwrap().manifests.unwrap()[0]
            .get("operation")
            .cloned()
    };
    let op = carried(works.get(&work_name).await.unwrap());
    assert_eq!(op.unwrap()["sync"]["revision"], "HEAD");

    feed_back(
        &works,
        &work_name,
        &ns,
        "guestbook",
        &[
            ("healthStatus", "Healthy"),
            ("syncStatus", "Synced"),
            ("syncRevision", "abc123"),
            ("operationStatePhase", "Succeeded"),
            ("operationStateStartedAt", "2026-11-21T10:00:00Z"),
        ],
    )
    .await;
    let status = wait::until("status on the hub copy", TIMEOUT, || async {
        let a = apps.get("guestbook").await.map_err(|e| e.to_string())?;
        let s = a.data.get("status").cloned().unwrap_or_default();
        if s.pointer("/health/status") == Some(&json!("Healthy")) {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
    .await;
    assert_eq!(
        status["sync"],
        json!({ "status": "Synced", "revision": "abc123" })
    );
    assert_eq!(status["operationState"]["phase"], "Succeeded");
    assert_eq!(
        status["operationState"]["startedAt"],
        "2026-11-21T10:00:00Z"
    );
    assert!(
        status.get("conditions").is_none_or(|c| c == &json!([])),
        "{status}"
    );
    // The spoke started it (a new startedAt): the work stops carrying it.
    wait::until("the operation to leave the work", TIMEOUT, || async {
        let w = works.get(&work_name).await.map_err(|e| e.to_string())?;
        carried(w).map_or(Ok(()), |op| Err(op.to_string()))
    })
    .await;

    // Converged: our own status writes do not rewrite the work or loop.
    // Once the controller has seen every write of its own and is idle,
    // nothing of guestbook's may change while it handles something else
    // (a probe Application, delivered: proof it kept working meanwhile).
    wait::until(
        "the controller idle, its own writes seen",
        TIMEOUT,
        || async {
            let c = &hub.ctx;
            let busy = c.writer.written().len() + c.queue.depth() + c.queue.running();
            if busy == 0 { Ok(()) } else { Err(busy) }
        },
    )
    .await;
    let work_rv = works
        .get(&work_name)
        .await
        .unwrap()
        .metadata
        .resource_version;
    let app_rv = apps
        .get("guestbook")
        .await
        .unwrap()
        .metadata
        .resource_version;
    common::create(&apps, &app_for("probe", &ns, "cluster1")).await;
    wait::exists(&works, &format!("{ns}.probe"), TIMEOUT).await;
    assert_eq!(
        works
            .get(&work_name)
            .await
            .unwrap()
            .metadata
            .resource_version,
        work_rv,
        "the work was rewritten without a change"
    );
    assert_eq!(
        apps.get("guestbook")
            .await
            .unwrap()
            .metadata
            .resource_version,
        app_rv,
        "the Application was written again without a change"
    );

    // Deletion: the work goes first, then the Argo CD finalizer is released.
    apps.delete("guestbook", &DeleteParams::default())
        .await
        .unwrap();
    wait::until("the Application to be gone", TIMEOUT, || async {
        match apps.get_opt("guestbook").await {
            Ok(None) => Ok(()),
            other => Err(format!(
                "{:?}",
                other.map(|a| a.map(|a| a.metadata.finalizers))
            )),
        }
    })
    .await;
    assert!(works.get_opt(&work_name).await.unwrap().is_none());
    hub.stop.fire();
}

#[tokio::test]
async fn bad_input_becomes_a_condition_and_an_event_and_blocks_nothing_else() {
    let (hub, ns, apps, works) = one_cluster_team().await;
    let client = &hub.client;

    let cases = [
        (
            "no-cluster",
            json!({}),
            "InvalidAnnotation",
            keys::MANAGED_CLUSTER,
        ),
        (
            "bad-cluster",
            json!({ keys::MANAGED_CLUSTER: "Not_A_Name" }),
            "InvalidAnnotation",
            "lower-case",
        ),
        (
            "unknown-cluster",
            json!({ keys::MANAGED_CLUSTER: "nowhere" }),
            "UnknownCluster",
            "does not exist",
        ),
    ];
    for (name, annotations, _, _) in &cases {
        apps.create(
            &PostParams::default(),
            &app(name, &ns, annotations.clone(), json!({})),
        )
        .await
        .unwrap();
    }
    let mut big = app(
        "too-big",
        &ns,
        json!({ keys::MANAGED_CLUSTER: "cluster1" }),
        json!({}),
    );
    big.data["spec"]["source"]["helm"] = json!({ "values": "x".repeat(600 * 1024) });
    apps.create(&PostParams::default(), &big).await.unwrap();
    common::create(&apps, &app_for("good", &ns, "cluster1")).await;

    wait::exists(&works, &format!("{ns}.good"), TIMEOUT).await;

    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    for (name, _, reason, hint) in cases.iter().map(|(n, a, r, h)| (*n, a, *r, *h)).chain([(
        "too-big",
        &json!({}),
        "TooLarge",
        "500 KiB",
    )]) {
        let message = wait::until(&format!("condition on {name}"), TIMEOUT, || async {
            let a = apps.get(name).await.map_err(|e| e.to_string())?;
            a.data
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
                .and_then(|c| c["message"].as_str().map(String::from))
                .ok_or_else(|| "no condition yet".to_string())
        })
        .await;
        assert!(message.starts_with(reason), "{name}: {message}");
        assert!(message.contains(hint), "{name}: {message}");
        let fields = format!("involvedObject.name={name}");
        wait::warning(&events, &fields, reason, TIMEOUT).await;
        assert!(!exists(&works, &format!("{ns}.{name}")).await);
    }

    // Fixing the annotation delivers it and clears the condition.
    merge(
        &apps,
        "no-cluster",
        json!({ "metadata": { "annotations": { keys::MANAGED_CLUSTER: "cluster1" } } }),
    )
    .await;
    wait::exists(&works, &format!("{ns}.no-cluster"), TIMEOUT).await;
    wait::until("the condition to clear", TIMEOUT, || async {
        let a = apps.get("no-cluster").await.map_err(|e| e.to_string())?;
        match a.data.pointer("/status/conditions") {
            None => Ok(()),
            Some(c) if c == &json!([]) => Ok(()),
            Some(c) => Err(c.to_string()),
        }
    })
    .await;

    // A cluster that joins later gets the Applications waiting for it at
    // once, without anyone touching them.
    let pds: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &placement_decision_resource());
    select(&pds, "placement-decision-1", &["cluster1", "nowhere"]).await;
    managed_cluster(&hub.cluster, "nowhere").await;
    let nowhere: Api<ManifestWork> = Api::namespaced(client.clone(), "nowhere");
    wait::exists(&nowhere, &format!("{ns}.unknown-cluster"), TIMEOUT).await;
    hub.stop.fire();
}

/// A work the work agent never reports applied (a cluster down) shows on
/// the hub copy after `--work-apply-timeout`, and goes once it reports.
#[tokio::test]
async fn a_work_left_unapplied_becomes_a_condition_until_the_work_agent_reports() {
    let (cluster, client) = common::start_hub("hub").await;
    let timeout = Duration::from_secs(3);
    let (_ctx, _stop) = common::run_controller_with(
        client.clone(),
        argocd_pull_hub_controller::render::work::WorkOptions {
            apply_timeout: timeout,
            ..Default::default()
        },
    )
    .await;
    managed_cluster(&cluster, "cluster1").await;
    let ns = cluster.namespace("team").await.unwrap();
    placement_selects(&client, &ns, &["cluster1"]).await;
    let apps = apps_api(&client, &ns);
    let works: Api<ManifestWork> = Api::namespaced(client.clone(), "cluster1");
    let created = std::time::Instant::now();
    common::create(&apps, &app_for("silent", &ns, "cluster1")).await;
    let work_name = format!("{ns}.silent");
    wait::exists(&works, &work_name, TIMEOUT).await;

    let condition = |a: &Application| {
        a.data["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
            .and_then(|c| c["message"].as_str())
            .map(str::to_string)
    };
    wait::until("WorkNotApplied on the hub copy", TIMEOUT, || async {
        let a = apps.get("silent").await.map_err(|e| e.to_string())?;
        match condition(&a) {
            Some(m)
                if m.starts_with(
                    "WorkNotApplied: the work agent of cluster cluster1 has not applied",
                ) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        created.elapsed() >= timeout,
        "shown {:?} after the Application was created, before the {timeout:?} timeout",
        created.elapsed()
    );
    assert!(
        condition(&apps.get("silent").await.unwrap())
            .unwrap()
            .contains(&format!("ManifestWork cluster1/{work_name}"))
    );

    // The work agent reports: the condition goes, the status comes.
    feed_back(
        &works,
        &work_name,
        &ns,
        "silent",
        &[("healthStatus", "Healthy")],
    )
    .await;
    wait::until("the condition gone, the status shown", TIMEOUT, || async {
        let a = apps.get("silent").await.map_err(|e| e.to_string())?;
        match (condition(&a), a.data["status"]["health"]["status"].as_str()) {
            (None, Some("Healthy")) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Waits until the hub's watch caches hold, of team `ns`, exactly the
/// works of the Applications `works` (on cluster1) and the Applications
/// `apps`.
async fn caches_show(hub: &Hub, ns: &str, works: &[&str], apps: &[&str]) {
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let want = (
        sorted(works.iter().map(|w| format!("{ns}.{w}")).collect()),
        sorted(apps.iter().map(|a| a.to_string()).collect()),
    );
    wait::until(
        "the watch caches show the works and Applications",
        TIMEOUT,
        || async {
            let c = &hub.ctx.caches;
            let seen = (
                sorted(
                    c.works
                        .state()
                        .iter()
                        .map(|w| w.name_any())
                        .filter(|w| w.starts_with(&format!("{ns}.")))
                        .collect(),
                ),
                sorted(
                    c.apps
                        .state()
                        .iter()
                        .filter(|a| a.namespace().as_deref() == Some(ns))
                        .map(|a| a.name_any())
                        .collect(),
                ),
            );
            wait::equal(&seen, &want)
        },
    )
    .await;
}

#[tokio::test]
async fn sweep_removes_works_of_applications_deleted_without_finalizers() {
    let (hub, ns, apps, works) = one_cluster_team().await;
    for name in ["kept", "gone"] {
        common::create(&apps, &app_for(name, &ns, "cluster1")).await;
        wait::exists(&works, &format!("{ns}.{name}"), TIMEOUT).await;
    }
    apps.delete("gone", &DeleteParams::default()).await.unwrap();
    wait::gone(&apps, "gone", TIMEOUT).await;
    // The sweep reads the watch caches: let them show both works and the
    // Application gone.
    caches_show(&hub, &ns, &["kept", "gone"], &["kept"]).await;
    assert_eq!(sweep(&hub).await, 1);
    assert!(!exists(&works, &format!("{ns}.gone")).await);
    assert!(exists(&works, &format!("{ns}.kept")).await);
    assert_eq!(sweep(&hub).await, 0, "idempotent");
    hub.stop.fire();
}

#[tokio::test]
async fn a_namespace_may_only_target_clusters_its_placements_select() {
    let hub = hub_with_controller().await;
    let client = &hub.client;
    for c in ["cluster1", "cluster2"] {
        managed_cluster(&hub.cluster, c).await;
    }
    let ns = team_namespace(&hub, &["cluster1"]).await;
    let pds: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &placement_decision_resource());
    // A PlacementDecision written by hand (no Placement controls it), even
    // labelled as the Placement's, authorizes nothing.
    let forged: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
        "metadata": { "name": "forged", "namespace": ns,
                      "labels": { keys::PLACEMENT_LABEL: "placement" } }
    }))
    .unwrap();
    pds.create(&PostParams::default(), &forged).await.unwrap();
    select(&pds, "forged", &["cluster2"]).await;
    wait::until(
        "the hub's cache to hold the forged decision",
        TIMEOUT,
        || async {
            let seen = hub.ctx.caches.decisions.state().iter().any(|d| {
                d.metadata.name.as_deref() == Some("forged")
                    && d.data.pointer("/status/decisions/0/clusterName") == Some(&json!("cluster2"))
            });
            if seen { Ok(()) } else { Err("not yet") }
        },
    )
    .await;
    assert_eq!(hub.ctx.caches.decided_in(&ns), ["cluster1"]);
    let apps = apps_api(client, &ns);
    for (name, cluster) in [("ok", "cluster1"), ("refused", "cluster2")] {
        common::create(&apps, &app_for(name, &ns, cluster)).await;
    }
    let works1: Api<ManifestWork> = Api::namespaced(client.clone(), "cluster1");
    let works2: Api<ManifestWork> = Api::namespaced(client.clone(), "cluster2");
    wait::exists(&works1, &format!("{ns}.ok"), TIMEOUT).await;
    let message = wait::until("the refusal", TIMEOUT, || async {
        let a = apps.get("refused").await.map_err(|e| e.to_string())?;
        a.data
            .pointer("/status/conditions/0/message")
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| "no condition yet".to_string())
    })
    .await;
    assert!(message.starts_with("NotAuthorized"), "{message}");
    assert!(message.contains("create a Placement"), "{message}");
    assert!(!exists(&works2, &format!("{ns}.refused")).await);

    // Once a Placement in the namespace selects cluster2 too, it is delivered
    // without anyone touching the Application.
    select(&pds, "placement-decision-1", &["cluster1", "cluster2"]).await;
    wait::until(
        "delivery after the Placement selects it",
        TIMEOUT,
        || async {
            works2
                .get_opt(&format!("{ns}.refused"))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;

    // Authorization withdrawn: the delivered copy stays as it was, the hub
    // copy says why, and changes are not delivered.
    select(&pds, "placement-decision-1", &["cluster1"]).await;
    let message = wait::until("the withdrawal on the hub copy", TIMEOUT, || async {
        let a = apps.get("refused").await.map_err(|e| e.to_string())?;
        match a
            .data
            .pointer("/status/conditions/0/message")
            .and_then(Value::as_str)
        {
            Some(m) if m.starts_with("NotAuthorized") => Ok(m.to_string()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        message.contains("Anything delivered before stays on the cluster"),
        "{message}"
    );
    let path = |w: &ManifestWork| {
        serde_json::to_value(w).unwrap()["spec"]["workload"]["manifests"][0]["spec"]["source"]["path"].clone()
    };
    let kept = works2.get(&format!("{ns}.refused")).await.unwrap();
    let before = hub.ctx.metrics.reconciles.get();
    set_source(&apps, "refused", "path", "changed").await;
    // The change reached the controller and its queue is drained.
    wait::until("a reconcile of the change", TIMEOUT, || async {
        let seen = hub.ctx.caches.apps.state().iter().any(|a| {
            a.identity().name.as_deref() == Some("refused")
                && a.application().data["spec"]["source"]["path"] == json!("changed")
        });
        match (
            seen,
            hub.ctx.metrics.reconciles.get(),
            hub.ctx.metrics.queue_depth.get(),
        ) {
            (true, n, 0) if n > before => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let after = works2.get(&format!("{ns}.refused")).await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        kept.metadata.resource_version
    );
    assert_ne!(
        path(&after),
        json!("changed"),
        "a change was delivered without authorization"
    );
    // Selected again: the change held back is delivered.
    select(&pds, "placement-decision-1", &["cluster1", "cluster2"]).await;
    wait::until("the held-back change delivered", TIMEOUT, || async {
        let w = works2
            .get(&format!("{ns}.refused"))
            .await
            .map_err(|e| e.to_string())?;
        match path(&w) {
            p if p == json!("changed") => Ok(()),
            p => Err(p.to_string()),
        }
    })
    .await;
    hub.stop.fire();
}

#[tokio::test]
async fn every_managed_cluster_gets_an_argocd_cluster_secret_until_it_goes() {
    let (cluster, client) = common::start_hub("hub").await;
    cluster.ensure_namespace("argocd").await.unwrap();
    // The controller's own client counts its requests.
    let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let api_metrics = argocd_pull_runtime::client::ApiMetrics::default();
    let counted = argocd_pull_runtime::client::build(
        config,
        &argocd_pull_runtime::client::ApiLayer::new(
            api_metrics.clone(),
            argocd_pull_runtime::client::Limits::UNLIMITED,
        ),
    )
    .unwrap();
    let secret_writes = || {
        api_metrics
            .requests
            .get_or_create(&argocd_pull_runtime::client::RequestLabels {
                verb: "patch".into(),
                resource: "secrets".into(),
                code: "200".into(),
            })
            .get()
    };
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    tokio::spawn(manifestwork::cluster_secrets::run(
        counted,
        "argocd".into(),
        Vec::new(),
        Default::default(),
        shutdown,
    ));

    let mc: ManagedCluster = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
        "metadata": { "name": "edge-7" },
        "spec": { "hubAcceptsClient": true, "managedClusterClientConfigs": [{ "url": "https://edge-7.example:6443" }] }
    }))
    .unwrap();
    let clusters: Api<ManagedCluster> = Api::all(client.clone());
    clusters.create(&PostParams::default(), &mc).await.unwrap();

    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "argocd");
    let secret = wait::exists(&secrets, "edge-7-cluster-secret", TIMEOUT).await;
    assert_eq!(
        secret.metadata.labels.unwrap()[keys::ARGOCD_SECRET_TYPE],
        "cluster"
    );
    let data = secret.data.unwrap();
    assert_eq!(data["name"].0, b"edge-7");
    assert_eq!(data["server"].0, b"https://edge-7.example:6443");

    // Status updates (OCM's registration agent makes them all the time)
    // write nothing; a new spec does. Once the new URL is in the Secret,
    // the write that put it there is the only one since the first.
    let written = secret_writes();
    for i in 0..5 {
        clusters
            .patch_status(
                "edge-7",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "status": { "version": { "kubernetes": format!("v1.35.{i}") } } }),
                ),
            )
            .await
            .unwrap();
    }
    merge(&clusters, "edge-7", json!({ "spec": { "managedClusterClientConfigs": [{ "url": "https://edge-7.moved:6443" }] } })).await;
    wait::until("the new server in the Secret", TIMEOUT, || async {
        let s = secrets
            .get("edge-7-cluster-secret")
            .await
            .map_err(|e| e.to_string())?;
        match s.data.as_ref().and_then(|d| d.get("server")) {
            Some(v) if v.0 == b"https://edge-7.moved:6443" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // The client counts a request once its answer is back, which can be
    // after the write shows: wait for the count, then check it is one.
    wait::until("the write counted", TIMEOUT, || async {
        match secret_writes() - written {
            0 => Err("not yet"),
            _ => Ok(()),
        }
    })
    .await;
    assert_eq!(
        secret_writes() - written,
        1,
        "only the new spec was written, not the status updates"
    );

    // Removing the cluster from OCM removes the Secret (garbage collection
    // by the real controller-manager, through the owner reference).
    clusters
        .delete("edge-7", &DeleteParams::default())
        .await
        .unwrap();
    wait::until(
        "the cluster Secret to go",
        Duration::from_secs(60),
        || async {
            match secrets.get_opt("edge-7-cluster-secret").await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|s| s.is_some()))),
            }
        },
    )
    .await;
    stop.fire();
}

/// Switching from argocd-pull-integration: its work (`<app>-<uid prefix>`,
/// same back-pointers, no managed-by label) is orphan-deleted once ours
/// delivers the same Application, so the work agent leaves the Application
/// on the spoke; works of other Applications are left alone.
#[tokio::test]
async fn adopts_applications_from_argocd_pull_integration_without_deleting_them() {
    let (hub, ns, apps, works) = one_cluster_team().await;
    let legacy = |name: &str, app_name: &str| -> ManifestWork {
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": { "name": name, "namespace": "cluster1",
                // The work agent's finalizer keeps a deleted work visible
                // until the spoke side is handled.
                "finalizers": ["cluster.open-cluster-management.io/manifest-work-cleanup"],
                "annotations": { keys::HUB_APP_NAMESPACE: &ns, keys::HUB_APP_NAME: app_name } },
            "spec": { "workload": { "manifests": [] } }
        }))
        .unwrap()
    };
    for (work, app_name) in [("guestbook-1a2b3", "guestbook"), ("other-9f8e7", "other")] {
        works
            .create(&PostParams::default(), &legacy(work, app_name))
            .await
            .unwrap();
    }
    common::create(&apps, &app_for("guestbook", &ns, "cluster1")).await;
    wait::exists(&works, &format!("{ns}.guestbook"), TIMEOUT).await;
    caches_show(&hub, &ns, &["guestbook"], &["guestbook"]).await;

    assert_eq!(sweep(&hub).await, 0, "nothing of ours is an orphan");
    let old = works.get("guestbook-1a2b3").await.unwrap();
    assert!(
        old.metadata.deletion_timestamp.is_some(),
        "the old work is deleted"
    );
    assert_eq!(
        serde_json::to_value(&old.spec.delete_option).unwrap(),
        json!({ "propagationPolicy": "Orphan" }),
        "and orphans what it applied"
    );
    assert_eq!(hub.ctx.metrics.works_adopted.get(), 1);
    // A work of an Application we do not deliver is not ours to touch.
    let other = works.get("other-9f8e7").await.unwrap();
    assert!(other.metadata.deletion_timestamp.is_none());
    assert!(other.spec.delete_option.is_none());
    // Our work is untouched and the next pass has nothing to do.
    assert!(
        works
            .get(&format!("{ns}.guestbook"))
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    sweep(&hub).await;
    assert_eq!(hub.ctx.metrics.works_adopted.get(), 1);
    hub.stop.fire();
}
