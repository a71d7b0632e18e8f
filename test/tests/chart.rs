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
            "--set",
            "hubController.rawFeedback=true",
            "--set",
            "agent.argocdRedis=argocd-redis.gitops-spoke.svc:6379",
            "--set",
            "grpc.heartbeat=20s",
            "--set",
            "agent.proxy.httpsProxy=http://proxy.corp.example:3128",
            "--set",
            "agent.proxy.noProxy=.corp.example",
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
        "--raw-feedback",
        "--grpc-heartbeat=20s",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    assert_eq!(
        find(&rendered, "AddOnDeploymentConfig", "argocd-pull")["spec"]["proxyConfig"],
        serde_json::json!({ "httpsProxy": "http://proxy.corp.example:3128", "noProxy": ".corp.example" })
    );
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
    assert_eq!(
        variable(&rendered, "ARGOCD_REDIS"),
        "argocd-redis.gitops-spoke.svc:6379"
    );
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
    let env = agent["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "ARGOCD_PULL_ARGOCD_REDIS" && e["value"] == "{{ARGOCD_REDIS}}"),
        "{env:?}"
    );
    let ca = manifests.iter().find(|m| m["kind"] == "ConfigMap").unwrap();
    assert_eq!(ca["data"]["ca.crt"], "{{HUB_CA}}");
}

#[test]
fn argocd_trees_pass_the_redis_and_mount_its_password_only_when_asked() {
    let chart = chart();
    let render = |sets: &[&str]| {
        let mut args = vec!["template", "argocd-pull", chart.as_str()];
        for set in sets {
            args.extend(["--set", *set]);
        }
        let rendered = objects(&run("helm", &args));
        find(&rendered, "Deployment", "argocd-pull-hub-controller").clone()
    };
    let off = render(&[]);
    assert!(
        !args_of(&off)
            .iter()
            .any(|a| a.starts_with("--argocd-redis")),
        "{:?}",
        args_of(&off)
    );
    let on = render(&[
        "argocdTrees.enabled=true",
        "argocdTrees.passwordSecret.name=argocd-redis-copy",
    ]);
    let args = args_of(&on);
    for expected in [
        "--argocd-redis=argocd-redis.argocd.svc:6379",
        "--argocd-redis-compress=gzip",
        "--argocd-redis-password-file=/var/run/argocd-pull/argocd-redis/auth",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    let pod = &on["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "argocd-redis")
        .expect("the password's volume");
    assert_eq!(volume["secret"]["secretName"], "argocd-redis-copy");
    assert!(
        pod["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "argocd-redis"
                && m["mountPath"] == "/var/run/argocd-pull/argocd-redis"),
        "{}",
        pod["containers"][0]["volumeMounts"]
    );
    // Without a Secret: no password flag, no volume.
    let bare = render(&["argocdTrees.enabled=true"]);
    assert!(
        !args_of(&bare)
            .iter()
            .any(|a| a.starts_with("--argocd-redis-password-file"))
    );
    assert!(
        !bare["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "argocd-redis")
    );
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

fn template(sets: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", "argocd-pull"];
    let chart = chart();
    args.push(&chart);
    for s in sets {
        args.extend(["--set", s]);
    }
    objects(&run("helm", &args))
}

fn none_of(objects: &[Value], kind: &str) {
    let names: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == kind)
        .map(|o| o["metadata"]["name"].clone())
        .collect();
    assert!(names.is_empty(), "{kind} {names:?} rendered");
}

/// What a chart user expects of the monitoring and disruption objects: the
/// PodDisruptionBudget and the metrics Service by default; the
/// ServiceMonitor, the PrometheusRule (their CRDs may be absent), the
/// dashboard and the NetworkPolicy when asked, each wired to the others.
#[test]
fn monitoring_disruption_and_network_objects_follow_their_values() {
    let defaults = template(&[]);
    let pdb = find(
        &defaults,
        "PodDisruptionBudget",
        "argocd-pull-hub-controller",
    );
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let deployment = find(&defaults, "Deployment", "argocd-pull-hub-controller");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    for (k, v) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &pod_labels[k], v,
            "the budget selects the hub-controller's pods"
        );
    }
    let service = find(&defaults, "Service", "argocd-pull-metrics");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "admin");
    for kind in [
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
        "ConfigMap",
    ] {
        none_of(&defaults, kind);
    }
    assert!(
        !args_of(deployment)
            .iter()
            .any(|a| a == "--metrics-per-cluster")
    );

    let on = template(&[
        "metrics.perCluster=true",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prometheus",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=prometheus",
        "metrics.dashboard.enabled=true",
        "networkPolicy.enabled=true",
        "networkPolicy.grpcFrom[0].ipBlock.cidr=10.0.0.0/8",
        "podDisruptionBudget.enabled=false",
    ]);
    none_of(&on, "PodDisruptionBudget");
    let deployment = find(&on, "Deployment", "argocd-pull-hub-controller");
    assert!(
        args_of(deployment)
            .iter()
            .any(|a| a == "--metrics-per-cluster")
    );
    let service = find(&on, "Service", "argocd-pull-metrics");
    let monitor = find(&on, "ServiceMonitor", "argocd-pull-hub-controller");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the monitor selects the metrics Service"
        );
    }
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    let rule = find(&on, "PrometheusRule", "argocd-pull-hub-controller");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let alerts: Vec<&str> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(
        alerts,
        [
            "ArgoCDPullAgentDisconnected",
            "ArgoCDPullDeliveryLagging",
            "ArgoCDPullStatusWriteErrors",
            "ArgoCDPullCertificateExpiring",
            "ArgoCDPullAgentCertificateExpiring",
            "ArgoCDPullRefusalsSpiking",
            "ArgoCDPullQueueBacklog",
            "ArgoCDPullNoLeader",
        ]
    );
    let dashboard = find(&on, "ConfigMap", "argocd-pull-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(dashboard["data"]["argocd-pull.json"].as_str().unwrap()).unwrap();
    assert_eq!(json["uid"], "argocd-pull");
    assert!(json["panels"].as_array().unwrap().len() > 10);
    // Only the two ports, each from its own peers.
    let policy = find(&on, "NetworkPolicy", "argocd-pull-hub-controller");
    for (k, v) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&deployment["spec"]["template"]["metadata"]["labels"][k], v);
    }
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let ingress = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 2);
    assert_eq!(
        ingress[0]["ports"],
        serde_json::json!([{ "port": "grpc", "protocol": "TCP" }])
    );
    assert_eq!(
        ingress[0]["from"],
        serde_json::json!([{ "ipBlock": { "cidr": "10.0.0.0/8" } }])
    );
    assert_eq!(
        ingress[1]["ports"],
        serde_json::json!([{ "port": "admin", "protocol": "TCP" }])
    );
    assert_eq!(
        ingress[1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    let ports: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        ports,
        ["admin", "grpc"],
        "the policy names the container's ports"
    );
}

/// The PrometheusRule's alerts, as the chart renders them, pass the cases
/// of test/promtool/alerts.test.yaml (`promtool test rules`): each fires
/// when it should, with its labels and annotations, and not otherwise.
#[test]
fn the_alert_rules_pass_promtool_test_rules() {
    let rendered = template(&["metrics.prometheusRule.enabled=true"]);
    let rule = find(&rendered, "PrometheusRule", "argocd-pull-hub-controller");
    let dir = tempfile::tempdir().unwrap();
    let groups = serde_json::json!({ "groups": rule["spec"]["groups"] });
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml::to_string(&groups).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        workspace_dir().join("test/promtool/alerts.test.yaml"),
        dir.path().join("alerts.test.yaml"),
    )
    .unwrap();
    for args in [
        &["check", "rules", "rules.yaml"][..],
        &["test", "rules", "alerts.test.yaml"][..],
    ] {
        let out = Command::new(bin_dir().join("promtool"))
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("promtool: {e} (run make tools)"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("$ promtool {}\n{text}", args.join(" "));
        assert!(out.status.success(), "promtool {args:?}:\n{text}");
    }
}

/// The live endpoint (docs/ui.md): nothing of it by default; asked for, the
/// controller serves it with a token Secret the chart keeps and the
/// serving CA, behind its own Service, named in the serving certificate,
/// and the NetworkPolicy lets in only argocd-server.
#[test]
fn the_live_endpoint_is_served_and_reachable_only_when_asked() {
    let defaults = template(&[]);
    let args = args_of(find(&defaults, "Deployment", "argocd-pull-hub-controller"));
    assert!(!args.iter().any(|a| a.starts_with("--live-")), "{args:?}");
    assert!(
        !defaults
            .iter()
            .any(|o| o["metadata"]["name"] == "argocd-pull-live"
                || o["metadata"]["name"] == "argocd-pull-live-tokens"),
        "live objects rendered by default"
    );

    let on = template(&["liveViews.enabled=true", "networkPolicy.enabled=true"]);
    let deployment = find(&on, "Deployment", "argocd-pull-hub-controller");
    let args = args_of(deployment);
    for expected in [
        "--live-addr=0.0.0.0:8444",
        "--live-url=https://argocd-pull-live.argocd-pull.svc:8444",
        "--live-token-file=/var/run/argocd-pull/live-tokens/tokens",
        "--live-ca-file=/var/run/argocd-pull/live-ca/tls.crt",
        "--grpc-san=argocd-pull-live.argocd-pull.svc",
        "--live-peer-addr=$(POD_IP)",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    let volumes = deployment["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(volumes.contains("argocd-pull-live-tokens"), "{volumes}");
    assert!(volumes.contains("argocd-pull-serving-ca"), "{volumes}");
    let service = find(&on, "Service", "argocd-pull-live");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "live");
    assert_eq!(service["spec"]["type"], "ClusterIP");
    let tokens = find(&on, "Secret", "argocd-pull-live-tokens");
    let token = tokens["data"]["tokens"].as_str().unwrap();
    assert!(
        token.len() >= 64,
        "a random token of 48 characters: {token}"
    );
    let policy = find(&on, "NetworkPolicy", "argocd-pull-hub-controller");
    let live_rule = policy["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ports"][0]["port"] == "live")
        .expect("a rule for the live port");
    assert_eq!(
        live_rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "argocd-server"
    );
    // ... and the other replicas, which forward reads to the one a
    // cluster's agent is connected to (in the Deployment's own namespace).
    assert_eq!(
        live_rule["from"][1]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
        "argocd-pull-hub-controller"
    );
    assert!(live_rule["from"][1]["namespaceSelector"].is_null());
    assert_eq!(live_rule["from"].as_array().unwrap().len(), 2);
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env.contains("status.podIP"), "{env}");
    // A Secret of the user's own is used as it is.
    let own = template(&[
        "liveViews.enabled=true",
        "liveViews.tokenSecret=my-live-tokens",
    ]);
    none_of(
        &own.iter()
            .filter(|o| o["metadata"]["name"] == "argocd-pull-live-tokens")
            .cloned()
            .collect::<Vec<_>>(),
        "Secret",
    );
    let volumes = find(&own, "Deployment", "argocd-pull-hub-controller")["spec"]["template"]
        ["spec"]["volumes"]
        .to_string();
    assert!(volumes.contains("my-live-tokens"), "{volumes}");
}
