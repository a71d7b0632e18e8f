//! A real node's container runtime: containerd, built from its Go module,
//! with runc, inside a network namespace the harness creates, running
//! argocd-pull's own images imported from their OCI archives (no registry).
//! And nothing of it left behind when it stops.

use std::path::Path;
use std::time::{Duration, Instant};

use testenv::images;
use testenv::node::Node;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

#[tokio::test]
async fn containerd_runs_each_image_in_a_network_namespace_of_the_harness() {
    let images = images::shared().await.expect("the images build");
    let node = Node::start("runtime").await.expect("containerd starts");
    assert!(netns_exists(node.netns()));
    for image in images {
        node.import(image).unwrap();
        let listed = node.ctr(&["images", "ls", "-q"]).unwrap();
        let listed = String::from_utf8_lossy(&listed.stdout).to_string();
        for reference in &image.references {
            assert!(
                listed.contains(&format!("docker.io/library/{reference}")),
                "{reference} in {listed}"
            );
        }
        let name = image.repository.trim_start_matches("argocd-pull-");
        let out = node
            .run(
                &format!("docker.io/library/{}", image.version_reference()),
                // ctr takes the whole command line, entrypoint included.
                &[&format!("/usr/local/bin/{name}"), "--version"],
            )
            .unwrap_or_else(|e| panic!("{e}\ncontainerd:\n{}", node.log_tail()));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{name} {VERSION}")
        );
    }
    let (netns, dir) = (node.netns().to_string(), node.dir().to_path_buf());
    drop(node);
    let deadline = Instant::now() + Duration::from_secs(10);
    while (netns_exists(&netns) || dir.exists()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !netns_exists(&netns),
        "network namespace {netns} left behind"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(testenv::paths::bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// deploy/hub's Deployment, from the built image, as a pod on a real
/// kubelet: scheduled by kube-scheduler, sandboxed by containerd, networked
/// by the CNI bridge inside the node's namespace, probed by the kubelet.
#[tokio::test]
async fn the_hub_controller_runs_as_a_pod_of_deploy_hub_on_a_real_kubelet() {
    use testenv::{Cluster, ClusterConfig, CrdSet};
    let images = images::shared().await.expect("the images build");
    let hub = Cluster::start(ClusterConfig::new("node-hub", CrdSet::Hub))
        .await
        .unwrap();
    hub.ensure_namespace("argocd").await.unwrap();
    let mut node = Node::start("hub-node").await.expect("containerd starts");
    for image in images {
        node.import(image).unwrap();
    }
    node.join(&hub, Path::new(env!("CARGO_BIN_EXE_testenv")))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deploy = testenv::paths::workspace_dir().join("deploy/hub");
    kubectl(hub.kubeconfig(), &["apply", "-k", deploy.to_str().unwrap()]);
    kubectl(
        hub.kubeconfig(),
        &[
            "-n",
            "argocd-pull",
            "scale",
            "deployment/argocd-pull-hub-controller",
            "--replicas=1",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pods = kubectl(
            hub.kubeconfig(),
            &[
                "-n",
                "argocd-pull",
                "get",
                "pods",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[0].ready}{\"\\n\"}{end}",
            ],
        );
        if pods.lines().any(|l| l.ends_with(" Running true")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Ready hub-controller pod: {pods}\n{}\nruntime logs:\n{}",
            kubectl(hub.kubeconfig(), &["-n", "argocd-pull", "describe", "pods"]),
            runtime_logs(node.dir())
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "{}",
        kubectl(hub.kubeconfig(), &["get", "pods", "-A", "-o", "wide"])
    );

    // Its memory as the kernel counts it, next to the Deployment's limit.
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
        hub.client().await.unwrap(),
        "argocd-pull",
    )
    .list(&Default::default())
    .await
    .unwrap();
    let pod = pods
        .items
        .iter()
        .find(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.ready))
        })
        .unwrap();
    let testenv::node::Memory { peak, limit } = node.memory(pod, "hub-controller").unwrap();
    eprintln!(
        "hub-controller container: peak memory {} MiB of its {} MiB limit",
        peak >> 20,
        limit >> 20
    );
    assert_eq!(limit, 512 << 20, "the Deployment's limit is the cgroup's");
    assert!(peak > 0 && peak < limit);

    // The kubelet runs the probes: one that cannot pass is seen failing.
    kubectl(
        hub.kubeconfig(),
        &[
            "-n",
            "argocd-pull",
            "patch",
            "deployment/argocd-pull-hub-controller",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/template/spec/containers/0/readinessProbe/httpGet/path","value":"/no-such-path"}]"#,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let events = kubectl(
            hub.kubeconfig(),
            &[
                "-n",
                "argocd-pull",
                "get",
                "events",
                "--field-selector",
                "reason=Unhealthy",
                "-o",
                "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
            ],
        );
        if events.contains("Readiness probe failed: HTTP probe failed with statuscode: 404") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no failing readiness probe seen: {events}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What runc said for each container of the node (the shims keep it).
fn runtime_logs(dir: &Path) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("find \"$0\"/state -name log.json | head -3 | xargs -r tail -n 5; tail -n 20 \"$0\"/kubelet.log")
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
