//! Real Open Cluster Management in the harness: managed clusters join a hub
//! for real, the real work agent applies ManifestWorks onto its own cluster
//! and feeds status back (with feature gate `RawFeedbackJsonString` on and
//! off), the real placement controller decides, and nothing is left behind.

use std::process::{Command, Stdio};
use std::time::Duration;

use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork, placement_decision_resource};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::ocm::{self, AGENT_NAMESPACE, Fleet, HUB_KUBECONFIG_SECRET, JoinOptions};
use testenv::wait;

const TIMEOUT: Duration = Duration::from_secs(90);
/// cluster1's work agent runs with `RawFeedbackJsonString`, cluster2's without.
const CLUSTERS: [(&str, JoinOptions); 2] = [
    ("cluster1", JoinOptions { raw_feedback: true }),
    (
        "cluster2",
        JoinOptions {
            raw_feedback: false,
        },
    ),
];

async fn fleet() -> &'static Fleet {
    testenv::init_tracing();
    ocm::shared("hub", &CLUSTERS)
        .await
        .expect("the hub starts and the clusters join")
}

fn condition_is_true(conditions: &[Value], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c["type"] == type_ && c["status"] == "True")
}

#[tokio::test]
async fn managed_clusters_join_the_hub_for_real() {
    let fleet = fleet().await;
    let hub = fleet.hub.cluster().client().await.unwrap();
    for (name, _) in CLUSTERS {
        let managed = fleet.cluster(name);
        let mc = Api::<ManagedCluster>::all(hub.clone())
            .get(name)
            .await
            .unwrap();
        assert_eq!(mc.spec.hub_accepts_client, Some(true), "{name} accepted");
        let mc = serde_json::to_value(&mc).unwrap();
        let conditions = mc["status"]["conditions"].as_array().unwrap();
        for c in [
            "HubAcceptedManagedCluster",
            "ManagedClusterJoined",
            "ManagedClusterConditionAvailable",
        ] {
            assert!(condition_is_true(conditions, c), "{name}: {c} in {mc}");
        }
        assert_eq!(
            mc["spec"]["managedClusterClientConfigs"][0]["url"],
            managed.server(),
            "the agent reports its own API server"
        );

        // The agent asked for its certificate with the bootstrap identity,
        // `clusteradm accept` approved it and the hub's controller-manager
        // signed it.
        let csrs = Api::<CertificateSigningRequest>::all(hub.clone())
            .list(
                &ListParams::default()
                    .labels(&format!("open-cluster-management.io/cluster-name={name}")),
            )
            .await
            .unwrap();
        let csr = csrs.items.first().expect("a CSR for the cluster");
        assert_eq!(
            csr.spec.username.as_deref(),
            Some("system:serviceaccount:open-cluster-management:agent-registration-bootstrap")
        );
        let status = csr.status.clone().unwrap();
        assert!(
            status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Approved"),
            "{name}: CSR approved"
        );
        assert!(status.certificate.is_some(), "{name}: CSR signed");

        // Accepted clusters get their namespace on the hub and keep their
        // lease fresh; the agent keeps its hub credentials on its cluster.
        Api::<Namespace>::all(hub.clone()).get(name).await.unwrap();
        wait::exists(
            &Api::<Lease>::namespaced(hub.clone(), name),
            "managed-cluster-lease",
            TIMEOUT,
        )
        .await;
        let secret = Api::<Secret>::namespaced(managed.client().await.unwrap(), AGENT_NAMESPACE)
            .get(HUB_KUBECONFIG_SECRET)
            .await
            .unwrap();
        let data = secret.data.unwrap();
        assert_eq!(data["cluster-name"].0, name.as_bytes());
        for key in ["kubeconfig", "tls.crt", "tls.key"] {
            assert!(!data[key].0.is_empty(), "{name}: {key}");
        }
    }
}

fn config_map_work(name: &str, namespace: &str, greeting: &str) -> ManifestWork {
    serde_json::from_value(json!({
        "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": { "name": name },
        "spec": {
            "workload": { "manifests": [{
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": name, "namespace": namespace },
                "data": { "greeting": greeting }
            }]},
            "manifestConfigs": [{
                "resourceIdentifier": { "resource": "configmaps", "namespace": namespace, "name": name },
                "feedbackScrapeType": "Watch",
                "feedbackRules": [{ "type": "JSONPaths", "jsonPaths": [
                    { "name": "greeting", "path": ".data.greeting" },
                    { "name": "data", "path": ".data" }
                ]}]
            }]
        }
    }))
    .unwrap()
}

/// The manifest status of the work's only manifest, once it has feedback
/// with `greeting` equal to `want`.
async fn feedback(works: &Api<ManifestWork>, name: &str, want: &str) -> Value {
    wait::until(
        &format!("feedback greeting={want} on {name}"),
        TIMEOUT,
        || async {
            let work = works.get(name).await.map_err(|e| e.to_string())?;
            let status = serde_json::to_value(&work.status).unwrap();
            let manifest = status["resourceStatus"]["manifests"][0].clone();
            let values = manifest["statusFeedback"]["values"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let greeting = values.iter().find(|v| v["name"] == "greeting");
            match greeting {
                Some(v) if v["fieldValue"] == json!({ "type": "String", "string": want }) => {
                    Ok(manifest)
                }
                _ => Err(status.to_string()),
            }
        },
    )
    .await
}

#[tokio::test]
async fn the_real_work_agent_applies_a_manifestwork_and_feeds_status_back() {
    let fleet = fleet().await;
    let hub = fleet.hub.cluster().client().await.unwrap();
    for (name, options) in CLUSTERS {
        let managed = fleet.cluster(name);
        let other = fleet
            .clusters
            .iter()
            .find(|c| c.name() != name)
            .unwrap()
            .client()
            .await
            .unwrap();
        let ns = managed.namespace("work").await.unwrap();
        let works: Api<ManifestWork> = Api::namespaced(hub.clone(), name);
        works
            .create(
                &PostParams::default(),
                &config_map_work("greeting", &ns, "hello"),
            )
            .await
            .unwrap();

        // Applied by this cluster's own work agent, onto its own API server.
        let cms: Api<ConfigMap> = Api::namespaced(managed.client().await.unwrap(), &ns);
        let cm = wait::exists(&cms, "greeting", TIMEOUT).await;
        assert_eq!(cm.data.unwrap()["greeting"], "hello");
        let owner = &cm.metadata.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "AppliedManifestWork");
        assert!(
            Api::<ConfigMap>::namespaced(other.clone(), &ns)
                .get_opt("greeting")
                .await
                .map_or(true, |cm| cm.is_none()),
            "not on the other cluster"
        );

        // Feedback: scalars always; a map only as JsonRaw, only with the gate.
        let manifest = feedback(&works, "greeting", "hello").await;
        assert_eq!(
            manifest["resourceMeta"],
            json!({ "group": "", "version": "v1", "kind": "ConfigMap", "resource": "configmaps",
                    "namespace": ns, "name": "greeting", "ordinal": 0 })
        );
        let values = manifest["statusFeedback"]["values"].as_array().unwrap();
        let raw = values.iter().find(|v| v["name"] == "data");
        let conditions = manifest["conditions"].as_array().unwrap();
        if options.raw_feedback {
            let raw = raw.expect("JsonRaw feedback with the gate on");
            assert_eq!(raw["fieldValue"]["type"], "JsonRaw");
            let parsed: Value =
                serde_json::from_str(raw["fieldValue"]["jsonRaw"].as_str().unwrap()).unwrap();
            assert_eq!(parsed, json!({ "greeting": "hello" }));
            assert!(condition_is_true(conditions, "StatusFeedbackSynced"));
        } else {
            assert!(raw.is_none(), "no JsonRaw with the gate off: {manifest}");
            let synced = conditions
                .iter()
                .find(|c| c["type"] == "StatusFeedbackSynced")
                .unwrap();
            assert_eq!(synced["status"], "False", "{synced}");
        }
        let work = works.get("greeting").await.unwrap();
        let work_conditions = serde_json::to_value(work.status.unwrap().conditions).unwrap();
        let work_conditions = work_conditions.as_array().unwrap();
        assert!(condition_is_true(work_conditions, "Applied"));
        assert!(condition_is_true(work_conditions, "Available"));

        // A change on the hub reaches the cluster, and its feedback comes back.
        works
            .patch(
                "greeting",
                &PatchParams::apply("ocm-test").force(),
                &Patch::Apply(config_map_work("greeting", &ns, "bonjour")),
            )
            .await
            .unwrap();
        feedback(&works, "greeting", "bonjour").await;
        assert_eq!(
            cms.get("greeting").await.unwrap().data.unwrap()["greeting"],
            "bonjour"
        );

        // Deleting the work removes what it applied.
        works
            .delete("greeting", &DeleteParams::default())
            .await
            .unwrap();
        wait::until("the ConfigMap and the work to go", TIMEOUT, || async {
            let cm = cms.get_opt("greeting").await.map_err(|e| e.to_string())?;
            let work = works.get_opt("greeting").await.map_err(|e| e.to_string())?;
            if cm.is_none() && work.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "ConfigMap left: {}, work left: {}",
                    cm.is_some(),
                    work.is_some()
                ))
            }
        })
        .await;
    }
}

#[tokio::test]
async fn the_real_placement_controller_decides_over_joined_clusters() {
    let fleet = fleet().await;
    let hub_cluster = fleet.hub.cluster();
    let hub = hub_cluster.client().await.unwrap();
    let ns = hub_cluster.namespace("team").await.unwrap();
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta2", "kind": "ManagedClusterSetBinding",
        "metadata": { "name": "global", "namespace": ns }, "spec": { "clusterSet": "global" }
    }))
    .unwrap();
    let binding_resource = cluster_api("v1beta2", "ManagedClusterSetBinding");
    Api::<DynamicObject>::namespaced_with(hub.clone(), &ns, &binding_resource)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let placement_resource = cluster_api("v1beta1", "Placement");
    let placements: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &ns, &placement_resource);
    // A label of this test's own, so that other tests' labels do not matter.
    Api::<ManagedCluster>::all(hub.clone())
        .patch(
            "cluster1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "placement-test": &ns } } })),
        )
        .await
        .unwrap();
    for (placement, selector) in [
        ("all", json!({})),
        (
            "only-cluster1",
            json!({ "predicates": [{ "requiredClusterSelector": { "labelSelector": {
                "matchLabels": { "placement-test": &ns } } } }] }),
        ),
    ] {
        let mut spec = json!({ "clusterSets": ["global"] });
        spec.as_object_mut()
            .unwrap()
            .extend(selector.as_object().unwrap().clone());
        let p: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
            "metadata": { "name": placement, "namespace": ns }, "spec": spec
        }))
        .unwrap();
        placements.create(&PostParams::default(), &p).await.unwrap();
    }

    let decisions: Api<DynamicObject> =
        Api::namespaced_with(hub, &ns, &placement_decision_resource());
    for (placement, want) in [
        ("all", vec!["cluster1", "cluster2"]),
        ("only-cluster1", vec!["cluster1"]),
    ] {
        wait::until(
            &format!("placement {placement} to decide {want:?}"),
            TIMEOUT,
            || async {
                let list = decisions
                    .list(&ListParams::default().labels(&format!(
                        "cluster.open-cluster-management.io/placement={placement}"
                    )))
                    .await
                    .map_err(|e| e.to_string())?;
                let mut got: Vec<String> = list
                    .items
                    .iter()
                    .flat_map(argocd_pull_apis::ocm::decided_clusters)
                    .collect();
                got.sort();
                wait::equal(got, want.clone())
            },
        )
        .await;
    }
}

/// OCM's processes belong to their clusters: a killed owner (here `testenv
/// up`, which runs OCM by default) leaves none of them, nor any data.
#[tokio::test]
async fn a_killed_owner_leaves_no_ocm_processes_behind() {
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().display().to_string();
    let mut owner = Command::new(env!("CARGO_BIN_EXE_testenv"))
        .args(["--dir", &dir_s, "up", "--hub", "hub", "--managed", "spoke"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = dir.path().join("ready");
    wait::until(
        "testenv up to be ready",
        Duration::from_secs(180),
        || async {
            if ready.exists() {
                Ok(())
            } else {
                Err("not ready")
            }
        },
    )
    .await;
    let hub = testenv::client_for(&dir.path().join("hub/kubeconfig"))
        .await
        .unwrap();
    let spoke = Api::<ManagedCluster>::all(hub).get("spoke").await.unwrap();
    assert_eq!(spoke.spec.hub_accepts_client, Some(true));
    let running = testenv::procfs::pids_mentioning(&dir_s);
    // etcd, kube-apiserver, kube-controller-manager of each cluster; three
    // OCM hub components; the spoke's registration and work agents.
    assert!(running.len() >= 11, "{running:?}");

    testenv::procfs::kill_and_wait_reaped(&mut owner, dir.path(), TIMEOUT).await;
}

/// A kind of OCM's `cluster.open-cluster-management.io` group (its plural
/// is its lower-cased name and an `s`).
fn cluster_api(version: &str, kind: &str) -> kube::discovery::ApiResource {
    kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("cluster.open-cluster-management.io", version, kind),
        &format!("{}s", kind.to_lowercase()),
    )
}
