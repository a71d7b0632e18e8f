//! The pull model end to end, on the topology of `make demo`: a hub with
//! OCM and Argo CD's applicationset-controller, two managed clusters joined
//! for real, each with its own Argo CD; argocd-pull installed from
//! `deploy/hub`, its addon enabled on both clusters (`testenv::stack`);
//! `example/` applied as a user would. cluster1's Applications go over
//! gRPC, cluster2's in ManifestWorks (the example forces that).
//!
//! One test function, in phases, because the topology takes a minute to
//! start and its helper processes belong to this test's runtime.

use argocd_pull_apis::keys;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::argocd;
use testenv::stack::{Stack, StackOptions};

#[path = "e2e/autonomous.rs"]
mod autonomous;
#[path = "e2e/churn.rs"]
mod churn;
#[path = "e2e/hub_ui.rs"]
mod hub_ui;
#[path = "e2e/plugin.rs"]
mod plugin;
#[path = "e2e/support.rs"]
mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pull_model_end_to_end() {
    testenv::init_tracing();
    let started = std::time::Instant::now();
    let phase = |name: &str| eprintln!("[{:>4}s] phase: {name}", started.elapsed().as_secs());
    // ManifestWork clusters bring their managed resources back too, so the
    // hub UI draws cluster2's tree as well (as `make demo` runs it).
    let options = StackOptions {
        raw_feedback: true,
        ..StackOptions::default()
    };
    let stack = Stack::start(options, &|step: &str| tracing::info!("stack: {step}"))
        .await
        .expect("the hub, clusters, Argo CD and argocd-pull start");
    let hub_client = stack.hub().client().await.unwrap();
    let hub = apps(&hub_client);
    let c1 = stack.cluster("cluster1").client().await.unwrap();
    let c2 = stack.cluster("cluster2").client().await.unwrap();
    let spokes = [("cluster1", apps(&c1)), ("cluster2", apps(&c2))];

    phase("the example");
    // The example, applied as the README says.
    stack.apply(&example("placement.yaml")).await.unwrap();
    stack
        .apply(&example("generator-configmap.yaml"))
        .await
        .unwrap();
    stack.wait_placement(NS, "guestbook", 2).await.unwrap();
    stack.apply(&example("applicationset.yaml")).await.unwrap();
    let head = stack.repo.head().unwrap();
    for (cluster, _) in &spokes {
        converged(&stack, &hub, &format!("guestbook-{cluster}"), &head).await;
    }
    let rows = stack.applications(NS).await.unwrap();
    let transports: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.cluster.as_str(), r.transport.as_str()))
        .collect();
    assert_eq!(
        transports,
        [("cluster1", "grpc"), ("cluster2", "manifestwork")]
    );
    for (cluster, client) in [("cluster1", &c1), ("cluster2", &c2)] {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "guestbook");
        assert!(
            cms.get_opt("guestbook-ui").await.unwrap().is_some(),
            "{cluster}'s Argo CD deployed the guestbook"
        );
    }
    // The hub's project of the guestbook travelled with it, each way: the
    // agent keeps it on cluster1 (capability `projects`, with the RBAC the
    // addon gives its pod), a project work carries it to cluster2.
    let on_cluster1: Api<DynamicObject> =
        Api::namespaced_with(c1.clone(), NS, &argocd::appproject_resource());
    testenv::wait::until(
        "the agent keeps the hub's project default on cluster1",
        std::time::Duration::from_secs(60),
        || async {
            let p = on_cluster1
                .get("default")
                .await
                .map_err(|e| e.to_string())?;
            let labels = p.metadata.labels.unwrap_or_default();
            (labels.get("argocd-pull.io/project-set").map(String::as_str) == Some("true"))
                .then_some(())
                .ok_or(format!("labels {labels:?}"))
        },
    )
    .await;
    let works: Api<argocd_pull_apis::ocm::ManifestWork> =
        Api::namespaced(hub_client.clone(), "cluster2");
    testenv::wait::exists(
        &works,
        "argocd-pull-project-default",
        std::time::Duration::from_secs(60),
    )
    .await;

    // No argocd-pull container restarted on the way up. At a first
    // install the hub-controller starts before the kubelet mounts the
    // serving CA it creates (`--live-ca-file`), and must not exit for it;
    // the churn phase replaces its pod, so the last phase cannot see this.
    let pods = stack.pods().await.unwrap();
    assert!(pods.values().all(|p| p.restarts == 0), "{pods:?}");

    phase("the hub's Argo CD");
    hub_ui::shows_the_pulled_applications(
        &stack,
        &["guestbook-cluster1".into(), "guestbook-cluster2".into()],
    )
    .await;

    phase("unknown cluster");
    // An Application for a cluster OCM does not know: a condition and an
    // Event on it, and the others carry on (every later phase uses them).
    stack
        .apply(&example("mistakes/unknown-cluster.yaml"))
        .await
        .unwrap();
    eventually(&stack, "the UnknownCluster condition", || async {
        let a = get(&hub, "guestbook-nowhere").await?;
        let conditions = a["status"]["conditions"].to_string();
        if conditions.contains("UnknownCluster")
            && conditions.contains("cluster-that-does-not-exist")
        {
            Ok(())
        } else {
            Err(conditions)
        }
    })
    .await;
    let events: Api<Event> = Api::namespaced(hub_client.clone(), NS);
    eventually(&stack, "a Warning Event on guestbook-nowhere", || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=guestbook-nowhere"))
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("UnknownCluster")
            })
            .map(|_| ())
            .ok_or_else(|| {
                format!(
                    "{:?}",
                    list.items.iter().map(|e| &e.reason).collect::<Vec<_>>()
                )
            })
    })
    .await;

    phase("kubectl argocd-pull");
    plugin::shows_the_fleet(&stack).await;

    phase("sync");
    // A sync started on the hub runs once on the spoke, over either
    // transport, and its operation state comes back.
    for (cluster, spoke) in &spokes {
        let name = format!("guestbook-{cluster}");
        let user = format!("e2e-{cluster}");
        hub.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "operation": {
                "initiatedBy": { "username": user }, "sync": {} } })),
        )
        .await
        .unwrap();
        let started = eventually(
            &stack,
            &format!("{name}'s sync to run on {cluster}"),
            || async {
                let a = get(spoke, &name).await?;
                if at(&a, "/status/operationState/operation/initiatedBy/username") == user
                    && at(&a, "/status/operationState/phase") == "Succeeded"
                {
                    Ok(at(&a, "/status/operationState/startedAt").to_string())
                } else {
                    Err(a["status"]["operationState"].to_string())
                }
            },
        )
        .await;
        eventually(
            &stack,
            &format!("{name}'s operation state on the hub"),
            || async {
                let a = get(&hub, &name).await?;
                if at(&a, "/status/operationState/startedAt") == started
                    && at(&a, "/status/operationState/phase") == "Succeeded"
                    && a.get("operation").is_none_or(Value::is_null)
                {
                    Ok(())
                } else {
                    Err(format!(
                        "operation {} state {}",
                        a["operation"], a["status"]["operationState"]
                    ))
                }
            },
        )
        .await;
    }

    phase("refresh");
    // Refresh: a new commit, and a refresh asked on the hub copy, reach
    // both clusters' Argo CD (which would otherwise poll Git every 3 min).
    let new_head = stack
        .repo
        .commit(
            "a third ConfigMap",
            &[(
                "guestbook/extra.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: guestbook-extra\ndata:\n  added: \"by the refresh test\"\n",
            )],
        )
        .unwrap();
    for (cluster, _) in &spokes {
        hub.patch(
            &format!("guestbook-{cluster}"),
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { keys::REFRESH: "normal" } } })),
        )
        .await
        .unwrap();
    }
    for (cluster, client) in [("cluster1", &c1), ("cluster2", &c2)] {
        converged(&stack, &hub, &format!("guestbook-{cluster}"), &new_head).await;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "guestbook");
        assert!(cms.get_opt("guestbook-extra").await.unwrap().is_some());
        // Done, as Argo CD says it: the annotation is gone from the hub copy.
        eventually(
            &stack,
            &format!("guestbook-{cluster}'s refresh to finish"),
            || async {
                let a = get(&hub, &format!("guestbook-{cluster}")).await?;
                match a.pointer(&format!(
                    "/metadata/annotations/{}",
                    keys::REFRESH.replace('/', "~1")
                )) {
                    None => Ok(()),
                    Some(v) => Err(format!("still asking for a refresh: {v}")),
                }
            },
        )
        .await;
    }

    // Each sync asked on the hub ran exactly once on its spoke: counted in
    // the spoke Argo CD's history, after the refresh phase (tens of
    // seconds of hub and agent work later), so a late re-run is caught.
    for (cluster, spoke) in &spokes {
        let name = format!("guestbook-{cluster}");
        let user = format!("e2e-{cluster}");
        let a = get(spoke, &name).await.unwrap();
        let runs = a["status"]["history"]
            .as_array()
            .map(|h| {
                h.iter()
                    .filter(|e| at(e, "/initiatedBy/username") == user)
                    .count()
            })
            .unwrap_or_default();
        assert_eq!(
            runs, 1,
            "{name}'s sync ran {runs} times on {cluster}: {}",
            a["status"]["history"]
        );
    }

    phase("progressive sync");
    // Progressive sync: RollingSync syncs cluster1, and cluster2 only after
    // cluster1's Application is reported Healthy on the hub. Compared in
    // the records' own times once the rollout is done: every sync cluster2's
    // Argo CD ran started no earlier than the moment the ApplicationSet
    // recorded cluster1 Healthy, and cluster1's had started by then (not
    // finished: Argo CD counts an Application Synced and Healthy as soon
    // as its status says so, possibly before the operation has wound up).
    // The times have whole seconds, so a sync started in that same second
    // passes.
    stack
        .apply(&example("progressive-sync/applicationset.yaml"))
        .await
        .unwrap();
    let (rollout1, rollout2) = ("guestbook-rollout-cluster1", "guestbook-rollout-cluster2");
    let done = |a: &Value| {
        at(a, "/status/sync/status") == "Synced"
            && at(a, "/status/health/status") == "Healthy"
            && at(a, "/status/sync/revision") == new_head
    };
    let rollout = Api::<DynamicObject>::namespaced_with(
        hub_client.clone(),
        NS,
        &argocd::applicationset_resource(),
    );
    let steps = eventually(
        &stack,
        "the rollout done, on the hub copies and in the ApplicationSet",
        || async {
            let (h1, h2) = (get(&hub, rollout1).await?, get(&hub, rollout2).await?);
            if !(done(&h1) && done(&h2)) {
                return Err(format!("{} / {}", h1["status"], h2["status"]));
            }
            let set = rollout
                .get("guestbook-rollout")
                .await
                .map_err(|e| e.to_string())?;
            let steps = set.data["status"]["applicationStatus"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if steps.len() == 2 && steps.iter().all(|s| s["status"] == "Healthy") {
                Ok(steps)
            } else {
                Err(format!("{steps:?}"))
            }
        },
    )
    .await;
    let order: Vec<(&str, &str)> = steps
        .iter()
        .map(|s| (at(s, "/application"), at(s, "/step")))
        .collect();
    assert_eq!(
        order,
        [(rollout1, "1"), (rollout2, "2")],
        "the ApplicationSet's own account of the steps"
    );
    let time = |v: &Value, pointer: &str| -> Time {
        serde_json::from_value(v.pointer(pointer).cloned().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{pointer} of {v}: {e}"))
    };
    let healthy1 = time(&steps[0], "/lastTransitionTime");
    let (spoke1, spoke2) = (
        get(&spokes[0].1, rollout1).await.unwrap(),
        get(&spokes[1].1, rollout2).await.unwrap(),
    );
    let history = |a: &Value| {
        a["status"]["history"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let (synced1, synced2) = (history(&spoke1), history(&spoke2));
    assert!(
        !synced1.is_empty() && !synced2.is_empty(),
        "a sync on each cluster: {synced1:?} / {synced2:?}"
    );
    // What to look at when the order is wrong: both sides of each
    // Application and the ApplicationSet's own account.
    let account = format!(
        "\nApplicationSet steps: {steps:#?}\ncluster1's Application: {}\ncluster2's Application: {}\nhub copies: {} / {}",
        spoke1["status"],
        spoke2["status"],
        get(&hub, rollout1).await.unwrap_or_default()["status"],
        get(&hub, rollout2).await.unwrap_or_default()["status"],
    );
    for sync in &synced1 {
        assert!(
            time(sync, "/deployStartedAt") <= healthy1,
            "cluster1 was seen Healthy at {healthy1:?}, before its sync started: {sync}{account}"
        );
    }
    for sync in &synced2 {
        assert!(
            time(sync, "/deployStartedAt") >= healthy1,
            "cluster2's sync started before the ApplicationSet saw cluster1 Healthy at {healthy1:?}: {sync}{account}"
        );
    }
    // The hub copy shows the start of the sync cluster2 really ran.
    assert_eq!(
        at(
            &get(&hub, rollout2).await.unwrap(),
            "/status/operationState/startedAt"
        ),
        at(&spoke2, "/status/operationState/startedAt")
    );

    phase("deletion");
    // Deleting the ApplicationSets removes everything on the spokes: the
    // Applications and what they deployed.
    for set in ["guestbook", "guestbook-rollout"] {
        rollout.delete(set, &DeleteParams::default()).await.unwrap();
    }
    for (cluster, client) in [("cluster1", &c1), ("cluster2", &c2)] {
        let spoke = apps(client);
        eventually(
            &stack,
            &format!("every Application gone on {cluster}"),
            || async {
                let left = names(&spoke).await?;
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?}"))
                }
            },
        )
        .await;
        for ns in ["guestbook", "guestbook-rollout"] {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            let mut left = names(&cms).await.unwrap();
            left.retain(|n| n.starts_with("guestbook"));
            assert!(left.is_empty(), "{cluster} still has {left:?} in {ns}");
        }
    }
    eventually(&stack, "the hub copies gone", || async {
        let left = names(&hub).await?;
        if left == ["guestbook-nowhere"] {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    let works =
        Api::<argocd_pull_apis::ocm::ManifestWork>::namespaced(hub_client.clone(), "cluster2");
    let mut left = names(&works).await.unwrap();
    left.retain(|n| !n.starts_with("addon-"));
    assert!(left.is_empty(), "ManifestWorks left on the hub: {left:?}");

    phase("churn");
    // The hub-controller's pod deleted while Applications come and go.
    churn::hub_controller_pod_deleted_during_churn(&stack).await;

    phase("autonomous");
    autonomous::cluster2_goes_autonomous(&stack, &hub_client, &c2).await;

    phase("memory");
    // Each argocd-pull container's memory as the kernel counts it, next
    // to its Deployment's limit; and no restarts.
    let memory = stack.memory().await.unwrap();
    assert_eq!(
        memory.len(),
        3,
        "a hub-controller and two agents: {memory:?}"
    );
    for m in &memory {
        eprintln!(
            "{:<9} {:<45} {:<15} peak {:>4} MiB of its {:>4} MiB limit",
            m.cluster,
            m.pod,
            m.container,
            m.memory.peak >> 20,
            m.memory.limit >> 20
        );
        assert!(m.memory.peak > 0 && m.memory.peak < m.memory.limit, "{m:?}");
    }
    // Ready again: an agent cut off during the churn's hub restart long
    // enough to fail three probes is Ready only at the kubelet's next probe
    // after it reconnected (every 10 s), which may come after this phase
    // starts. No container restarted on the way.
    let pods = eventually(&stack, "every argocd-pull pod ready", || async {
        let pods = stack.pods().await.map_err(|e| e.to_string())?;
        if pods.values().all(|p| p.ready) {
            Ok(pods)
        } else {
            Err(format!("{pods:?}"))
        }
    })
    .await;
    assert!(pods.values().all(|p| p.restarts == 0), "{pods:?}");
    for (cluster, _) in stack.cluster_nodes() {
        eprintln!(
            "--- {}:\n{}",
            cluster.name(),
            testenv::stack::kubectl(cluster, &["get", "pods", "-A", "-o", "wide"])
                .await
                .unwrap()
        );
    }

    phase("kubectl argocd-pull revoke");
    plugin::revoke_cuts_cluster1_off(&stack).await;

    // Nothing in argocd-pull's logs says it failed to write.
    for (name, log) in stack.logs() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            !text.contains("is invalid"),
            "{name}'s log shows a refused write:\n{}",
            stack.log_tails(40)
        );
    }
}
