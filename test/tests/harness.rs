//! The harness itself: several independent clusters at once, and nothing
//! left behind when a cluster stops, whether dropped or killed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use testenv::{Cluster, ClusterConfig, CrdSet, wait};

const TIMEOUT: Duration = Duration::from_secs(90);

async fn crds(c: &Cluster) -> Vec<String> {
    let api: Api<CustomResourceDefinition> = Api::all(c.client().await.unwrap());
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

#[tokio::test]
async fn runs_independent_clusters_side_by_side_and_cleans_up_on_drop() {
    testenv::init_tracing();
    let (a, b, c) = tokio::join!(
        Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)),
        Cluster::start(ClusterConfig::new("cluster1", CrdSet::Managed)),
        Cluster::start(ClusterConfig::new("cluster2", CrdSet::None)),
    );
    let clusters = [a.unwrap(), b.unwrap(), c.unwrap()];
    let servers: std::collections::HashSet<_> = clusters.iter().map(|c| c.server()).collect();
    assert_eq!(servers.len(), 3, "each cluster has its own API server");

    // Same name in each cluster, different content: they share no storage.
    for (i, cluster) in clusters.iter().enumerate() {
        let cms: Api<ConfigMap> = Api::namespaced(cluster.client().await.unwrap(), "default");
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("who".into());
        cm.data = Some([("cluster".to_string(), i.to_string())].into());
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    for (i, cluster) in clusters.iter().enumerate() {
        let cms: Api<ConfigMap> = Api::namespaced(cluster.client().await.unwrap(), "default");
        let got = cms.get("who").await.unwrap();
        assert_eq!(got.data.unwrap()["cluster"], i.to_string());
    }

    // The CRD sets differ as asked.
    let hub_crds = crds(&clusters[0]).await;
    let managed_crds = crds(&clusters[1]).await;
    assert!(hub_crds.contains(&"manifestworks.work.open-cluster-management.io".to_string()));
    assert!(hub_crds.contains(&"applications.argoproj.io".to_string()));
    assert!(!managed_crds.contains(&"manifestworks.work.open-cluster-management.io".to_string()));
    assert!(
        managed_crds.contains(&"appliedmanifestworks.work.open-cluster-management.io".to_string())
    );
    assert!(managed_crds.contains(&"applications.argoproj.io".to_string()));
    assert!(crds(&clusters[2]).await.is_empty());

    let dirs: Vec<_> = clusters.iter().map(|c| c.dir().to_path_buf()).collect();
    drop(clusters);
    for dir in &dirs {
        assert!(!dir.exists(), "{} removed", dir.display());
        assert!(
            testenv::procfs::pids_mentioning(&dir.display().to_string()).is_empty(),
            "no process of {} left",
            dir.display()
        );
    }
}

#[tokio::test]
async fn a_killed_owner_leaves_no_processes_or_data_behind() {
    // `testenv up` owns its clusters the way a test binary owns shared
    // clusters; SIGKILL gives it no chance to run any cleanup of its own.
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().display().to_string();
    let mut owner = Command::new(env!("CARGO_BIN_EXE_testenv"))
        // Bare clusters: test/tests/ocm.rs does the same with OCM running.
        .args(["--dir", &dir_s, "up", "--hub", "hub", "--managed", "spoke"])
        .arg("--ocm=false")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = dir.path().join("ready");
    wait::until("testenv up to be ready", TIMEOUT, || async {
        if ready.exists() {
            Ok(())
        } else {
            Err("not ready")
        }
    })
    .await;
    let kubeconfig = dir.path().join("hub/kubeconfig");
    let client = testenv::client_for(&kubeconfig).await.unwrap();
    client.apiserver_version().await.expect("hub is serving");
    let running = testenv::procfs::pids_mentioning(&dir_s);
    assert!(
        running.len() >= 6,
        "etcd, kube-apiserver and kube-controller-manager of two clusters: {running:?}"
    );

    testenv::procfs::kill_and_wait_reaped(&mut owner, dir.path(), TIMEOUT).await;
    assert!(!Path::new(&kubeconfig).exists());
}
