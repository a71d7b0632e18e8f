//! The Helm chart (`deploy/helm/argocd-pull`) with a real Helm: the
//! kustomize install and the chart's defaults are the same objects, each
//! value lands where a user expects it, OCM's own `{{VARIABLES}}` survive
//! Helm, and `helm install` onto a real API server with the hub's CRDs is
//! accepted. (`make check-generated` runs `helm lint` and checks that
//! `deploy/hub` is the chart's rendering, file by file.)

use std::process::Command;

use serde_json::Value;
use testenv::paths::{bin_dir, workspace_dir};
use testenv::{Cluster, ClusterConfig, CrdSet};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn chart() -> String {
    workspace_dir()
        .join("deploy/helm/argocd-pull")
        .to_string_lossy()
        .into_owned()
}

fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(bin_dir().join(tool))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e} (run make tools)"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn objects(yaml: &str) -> Vec<Value> {
    let mut objects: Vec<Value> = yaml
        .split("\n---")
        .filter_map(|doc| serde_yaml::from_str::<Option<Value>>(doc).unwrap())
        .collect();
    objects.sort_by_key(|o| {
        (
            o["kind"].to_string(),
            o["metadata"]["namespace"].to_string(),
            o["metadata"]["name"].to_string(),
        )
    });
    objects
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn args_of(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn variable(objects: &[Value], name: &str) -> String {
    variable_of(objects, "argocd-pull", name)
}

fn variable_of(objects: &[Value], config: &str, name: &str) -> String {
    let adc = find(objects, "AddOnDeploymentConfig", config);
    adc["spec"]["customizedVariables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .map(|v| v["value"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The example's second AddOnDeploymentConfig repeats the agent's image;
/// left at the previous release, the agents it redeploys would wait for
/// an image the release does not ship.
#[test]
fn the_autonomous_examples_agent_image_is_this_release() {
    let path = workspace_dir().join("example/autonomous/addondeploymentconfig.yaml");
    let example = objects(&std::fs::read_to_string(path).unwrap());
    assert_eq!(
        variable_of(&example, "argocd-pull-autonomous", "AGENT_IMAGE"),
        format!("argocd-pull-spoke-agent:{VERSION}")
    );
}

#[test]
fn kustomize_and_the_charts_defaults_install_the_same_objects() {
    let kustomize = objects(&run(
        "kubectl",
        &[
            "kustomize",
            workspace_dir().join("deploy/hub").to_str().unwrap(),
        ],
    ));
    let helm = objects(&run("helm", &["template", "argocd-pull", &chart()]));
    assert_eq!(kustomize.len(), helm.len());
    for (k, h) in kustomize.iter().zip(&helm) {
        assert_eq!(k, h);
    }
    let deployment = find(&helm, "Deployment", "argocd-pull-hub-controller");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("argocd-pull-hub-controller:{VERSION}")
    );
    assert_eq!(
        variable(&helm, "AGENT_IMAGE"),
        format!("argocd-pull-spoke-agent:{VERSION}")
    );
}

#[test]
fn every_value_lands_where_a_user_expects_it() {
    let rendered = objects(&run(
        "helm",
        &[
            "template",
            "argocd-pull",
            &chart(),
            "--set",
            "hubController.image.repository=registry.example.com/argocd-pull/hub-controller",
            "--set",
            "hubController.image.tag=0.1.0-abc",
            "--set",
            "agent.image.repository=registry.example.com/argocd-pull/spoke-agent",
            "--set",
            "agent.image.tag=0.1.0-def",
            "--set",
            "hubController.replicas=1",
            "--set",
            "hubController.leaderElection.enabled=false",
            "--set",
            "hubController.authorization=none",
            "--set",
            "hubController.resources.limits.memory=1Gi",
            "--set",
            "grpc.address=https://grpc.hub.example.com:443",
            "--set",
            "grpc.sans={grpc.hub.example.com,argocd-pull-grpc.argocd-pull.svc}",
            "--set",
            "grpc.service.type=LoadBalancer",
            "--set",
            "argocdNamespace=gitops",
            "--set",
            "agent.argocdNamespace=gitops-spoke",
            "--set",
            "agent.mode=autonomous",
        ],
    ));
    let deployment = find(&rendered, "Deployment", "argocd-pull-hub-controller");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.example.com/argocd-pull/hub-controller:0.1.0-abc"
    );
    assert_eq!(pod["containers"][0]["resources"]["limits"]["memory"], "1Gi");
    let args = args_of(deployment);
    for expected in [
        "--leader-elect=false",
        "--authorization=none",
        "--argocd-namespace=gitops",
        "--grpc-san=grpc.hub.example.com",
        "--grpc-san=argocd-pull-grpc.argocd-pull.svc",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    assert_eq!(
        find(&rendered, "Service", "argocd-pull-grpc")["spec"]["type"],
        "LoadBalancer"
    );
    assert_eq!(
        find(
            &rendered,
            "Role",
            "argocd-pull-hub-controller-cluster-secrets"
        )["metadata"]["namespace"],
        "gitops"
    );
    assert_eq!(
        variable(&rendered, "AGENT_IMAGE"),
        "registry.example.com/argocd-pull/spoke-agent:0.1.0-def"
    );
    assert_eq!(
        variable(&rendered, "HUB_GRPC_ADDRESS"),
        "https://grpc.hub.example.com:443"
    );
    assert_eq!(variable(&rendered, "AGENT_MODE"), "autonomous");
    // The agent's manifests: Helm's values in, OCM's variables untouched.
    let template = find(&rendered, "AddOnTemplate", "argocd-pull");
    let manifests = template["spec"]["agentSpec"]["workload"]["manifests"]
        .as_array()
        .unwrap();
    let role = manifests.iter().find(|m| m["kind"] == "Role").unwrap();
    assert_eq!(role["metadata"]["namespace"], "gitops-spoke");
    let agent = manifests
        .iter()
        .find(|m| m["kind"] == "Deployment")
        .unwrap();
    assert_eq!(
        agent["spec"]["template"]["spec"]["containers"][0]["image"],
        "{{AGENT_IMAGE}}"
    );
    let args = args_of(agent);
    assert!(args.contains(&"--cluster-name={{CLUSTER_NAME}}".to_string()));
    assert!(args.contains(&"--argocd-namespace=gitops-spoke".to_string()));
    let ca = manifests.iter().find(|m| m["kind"] == "ConfigMap").unwrap();
    assert_eq!(ca["data"]["ca.crt"], "{{HUB_CA}}");
}

#[tokio::test]
async fn helm_install_onto_a_hub_creates_the_hub_side() {
    let hub = Cluster::start(ClusterConfig::new("helm-hub", CrdSet::Hub))
        .await
        .unwrap();
    hub.ensure_namespace("argocd").await.unwrap();
    let kubeconfig = hub.kubeconfig().to_str().unwrap().to_string();
    let helm_home = tempfile::tempdir().unwrap();
    let home = |sub: &str| helm_home.path().join(sub).to_string_lossy().into_owned();
    let out = Command::new(bin_dir().join("helm"))
        .args([
            "install",
            "argocd-pull",
            &chart(),
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            "default",
        ])
        .env("HELM_CACHE_HOME", home("cache"))
        .env("HELM_CONFIG_HOME", home("config"))
        .env("HELM_DATA_HOME", home("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = run(
        "kubectl",
        &[
            "--kubeconfig",
            &kubeconfig,
            "get",
            "deployment,service,addontemplate,clustermanagementaddon,addondeploymentconfig",
            "-A",
            "-o",
            "name",
        ],
    );
    for name in [
        "deployment.apps/argocd-pull-hub-controller",
        "service/argocd-pull-grpc",
        "addontemplate.addon.open-cluster-management.io/argocd-pull",
        "clustermanagementaddon.addon.open-cluster-management.io/argocd-pull",
        "addondeploymentconfig.addon.open-cluster-management.io/argocd-pull",
    ] {
        assert!(listed.contains(name), "{name} in {listed}");
    }
    // What the API server stored is what the chart says.
    let stored: Value = serde_json::from_str(&run(
        "kubectl",
        &[
            "--kubeconfig",
            &kubeconfig,
            "-n",
            "argocd-pull",
            "get",
            "deployment",
            "argocd-pull-hub-controller",
            "-o",
            "json",
        ],
    ))
    .unwrap();
    assert_eq!(
        stored["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("argocd-pull-hub-controller:{VERSION}")
    );
}
