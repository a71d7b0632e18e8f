//! The OCM addon that deploys and registers the spoke-agent on managed
//! clusters. Rendering is pure: the manifests are built from [`AddonConfig`]
//! without touching any cluster; `make generate` writes them to
//! `deploy/hub/addon.yaml` and a test fails when the checked-in file drifts.
//!
//! What OCM does with them (`clusteradm addon enable --names argocd-pull`):
//! the addon-manager renders the [`add_on_template`] for each cluster into
//! ManifestWork `addon-argocd-pull-deploy-0`, substituting the variables of
//! the [`add_on_deployment_config`]; the work agent applies it; the
//! klusterlet files a CSR for the [`SIGNER_NAME`] signer, which the
//! addon-manager approves and signs with the CA in Secret [`SIGNING_CA_SECRET`]
//! (kept by the hub-controller), and writes the certificate into the
//! agent's namespace, where the Deployment mounts it.

#![forbid(unsafe_code)]

use serde_json::{Value, json};

/// Name of the addon: `clusteradm addon enable --names argocd-pull`.
pub const ADDON_NAME: &str = "argocd-pull";
/// Namespace of the hub side (hub-controller, its Secrets, the default
/// AddOnDeploymentConfig).
pub const HUB_NAMESPACE: &str = "argocd-pull";
/// Namespace of the agent on each managed cluster.
pub const AGENT_NAMESPACE: &str = "argocd-pull-agent";
/// Name of the agent's Deployment, service account and RBAC.
pub const AGENT_NAME: &str = "argocd-pull-agent";
/// The signer of the agents' client certificates.
pub const SIGNER_NAME: &str = "argocd-pull.open-cluster-management.io/agent";
/// The `kubernetes.io/tls` Secret (in [`HUB_NAMESPACE`]) whose CA the
/// addon-manager signs agent certificates with; the hub-controller creates
/// and rotates it.
pub const SIGNING_CA_SECRET: &str = "argocd-pull-signing-ca";
/// The AddOnDeploymentConfig (in [`HUB_NAMESPACE`]) every cluster uses
/// unless its ManagedClusterAddOn names another.
pub const DEPLOYMENT_CONFIG: &str = "argocd-pull";
/// ConfigMap on the managed cluster with the CA of the hub's gRPC serving
/// certificate.
pub const HUB_CA_CONFIGMAP: &str = "argocd-pull-hub-ca";
/// The AddOnDeploymentConfig variable the hub-controller keeps set to its
/// serving CA (PEM, newlines written as `\n` so that the template stays
/// valid JSON; OCM limits a value to 1,024 characters).
pub const HUB_CA_VARIABLE: &str = "HUB_CA";

/// The template variable that sets the agent's mode (`managed` or
/// `autonomous`); the hub-controller reads the same one to decide which
/// mode it accepts from the cluster's agent.
pub const MODE_VARIABLE: &str = "AGENT_MODE";

/// The mode of an agent whose configuration does not set [`MODE_VARIABLE`].
pub const DEFAULT_MODE: &str = "managed";
/// Where the agent's Deployment mounts the hub's CA.
const HUB_CA_DIR: &str = "/etc/argocd-pull/hub-ca";
/// The Secret (in [`AGENT_NAMESPACE`] on the managed cluster) whose
/// `credentials` key (`user:password`) the agent authenticates to its
/// egress proxy with. Optional: without it the agent sends none.
pub const PROXY_CREDENTIALS_SECRET: &str = "argocd-pull-proxy-credentials";
/// Where the agent's Deployment mounts [`PROXY_CREDENTIALS_SECRET`].
const PROXY_CREDENTIALS_DIR: &str = "/etc/argocd-pull/proxy";

/// The Secret the klusterlet writes the agent's signed certificate to
/// (`tls.crt`, `tls.key`), in the agent's namespace.
pub fn client_cert_secret() -> String {
    format!("{ADDON_NAME}-{}-client-cert", SIGNER_NAME.replace('/', "-"))
}

/// Where OCM mounts [`client_cert_secret`] in the agent's containers.
pub fn client_cert_dir() -> String {
    format!("/managed/{}", SIGNER_NAME.replace('/', "-"))
}

/// What the addon manifests depend on.
#[derive(Clone, Debug)]
pub struct AddonConfig {
    /// Image of the spoke-agent (the AddOnDeploymentConfig's `AGENT_IMAGE`
    /// default; OCM's image registry overrides apply on top).
    pub agent_image: String,
    /// Namespace of the managed clusters' Argo CD, where the agent may
    /// write Applications. Fixed at render time: OCM validates the
    /// template's namespaces, so they cannot be variables.
    pub argocd_namespace: String,
    /// Where agents dial the hub (`HUB_GRPC_ADDRESS`).
    pub hub_grpc_address: String,
    /// `managed` or `autonomous` (`AGENT_MODE`).
    pub agent_mode: String,
    /// Where agents export OpenTelemetry traces (`OTLP_ENDPOINT`), `none`
    /// for nowhere.
    pub otlp_endpoint: String,
    /// The managed clusters' Argo CD Redis the agents report trees from
    /// (`ARGOCD_REDIS`), `none` for none.
    pub argocd_redis: String,
    /// What the agents serve of the hub's live endpoint.
    pub live: LiveVariables,
    /// The default AddOnDeploymentConfig's `proxyConfig.httpsProxy`: the
    /// egress proxy OCM gives every agent as `HTTPS_PROXY`; empty for none.
    pub https_proxy: String,
    /// Its `proxyConfig.noProxy` (`NO_PROXY`).
    pub no_proxy: String,
    /// The heartbeat interval the agents ask the hub for (`HEARTBEAT`):
    /// `hub` for the hub's.
    pub heartbeat: String,
    /// The wire the agents dial the hub on (`TRANSPORT`): `auto`, `grpc`
    /// or `websocket`.
    pub transport: String,
    /// Where the agents dial the WebSocket wire (`WEBSOCKET_URL`); `hub`
    /// for the hub address's host and port.
    pub websocket_url: String,
}

impl Default for AddonConfig {
    fn default() -> Self {
        Self {
            // The tag `make images` gives the image of this version.
            agent_image: concat!("argocd-pull-spoke-agent:", env!("CARGO_PKG_VERSION")).into(),
            argocd_namespace: "argocd".into(),
            hub_grpc_address: "https://argocd-pull.hub.example.com:8443".into(),
            agent_mode: DEFAULT_MODE.into(),
            otlp_endpoint: "none".into(),
            argocd_redis: "none".into(),
            live: LiveVariables {
                views: "false".into(),
                terminal: "false".into(),
            },
            https_proxy: String::new(),
            no_proxy: String::new(),
            heartbeat: "hub".into(),
            transport: "auto".into(),
            websocket_url: "hub".into(),
        }
    }
}

/// The variables the template uses, with the defaults of the default
/// AddOnDeploymentConfig. [`HUB_CA_VARIABLE`] is not among them: the
/// hub-controller sets it.
pub fn default_variables(config: &AddonConfig) -> Vec<(&'static str, String)> {
    vec![
        // Where agents dial the hub-controller's gRPC server; must be
        // reachable from every managed cluster and named in the serving
        // certificate (`--grpc-san`).
        ("HUB_GRPC_ADDRESS", config.hub_grpc_address.clone()),
        (MODE_VARIABLE, config.agent_mode.clone()),
        ("AGENT_IMAGE", config.agent_image.clone()),
        // An OTLP/gRPC URL to export the agent's traces to; `none`: off.
        ("OTLP_ENDPOINT", config.otlp_endpoint.clone()),
        // This cluster's Argo CD Redis (`host:port`), whose resource trees
        // the agent reports for the hub's Argo CD UI; `none`: off.
        ("ARGOCD_REDIS", config.argocd_redis.clone()),
        // `true`: the agent serves the hub's live views (a resource's live
        // manifest, its events, its pods' logs) and is bound to the read
        // ClusterRole they need; `false`: neither.
        (LIVE_VIEWS_VARIABLE, config.live.views.clone()),
        // `true` (with LIVE_VIEWS): the agent opens the hub's web
        // terminals, an exec into a pod of an Application it applied, and
        // is bound to the ClusterRole that may exec into pods; `false`:
        // neither.
        (TERMINAL_VARIABLE, config.live.terminal.clone()),
        // The heartbeat interval the agent asks the hub for (`10s`, `2s`):
        // three of them must be shorter than the idle timeout of every
        // proxy and NAT between the cluster and the hub. `hub`: the hub's.
        (HEARTBEAT_VARIABLE, config.heartbeat.clone()),
        // The wire to the hub: `grpc`, `websocket` (through HTTP/1.1-only
        // proxies), or `auto`: gRPC, the WebSocket once HTTP/2 is refused.
        (TRANSPORT_VARIABLE, config.transport.clone()),
        // The WebSocket wire's `ws://` or `wss://` URL; `hub`: the hub
        // address's host and port.
        (WEBSOCKET_URL_VARIABLE, config.websocket_url.clone()),
    ]
}

/// The variable that turns the agents' live views on (`true`) or off.
pub const LIVE_VIEWS_VARIABLE: &str = "LIVE_VIEWS";
/// The variable that turns the agents' web terminals on (`true`) or off.
pub const TERMINAL_VARIABLE: &str = "TERMINAL";

/// The defaults of the variables of the hub's live endpoint: `true` or
/// `false` each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveVariables {
    /// Whether the agents serve the hub's live views (`LIVE_VIEWS`).
    pub views: String,
    /// Whether they open its web terminals (`TERMINAL`).
    pub terminal: String,
}
/// The variable of the heartbeat interval an agent asks for.
pub const HEARTBEAT_VARIABLE: &str = "HEARTBEAT";
/// The variable of the wire an agent dials the hub on.
pub const TRANSPORT_VARIABLE: &str = "TRANSPORT";
/// The variable of the WebSocket wire's URL.
pub const WEBSOCKET_URL_VARIABLE: &str = "WEBSOCKET_URL";

/// The ClusterManagementAddOn that makes the addon known to OCM. Installed
/// manually (`clusteradm addon enable`); see [`placements_strategy`] for
/// installing it on every cluster a Placement selects.
pub fn cluster_management_addon() -> Value {
    json!({
        "apiVersion": "addon.open-cluster-management.io/v1alpha1",
        "kind": "ClusterManagementAddOn",
        "metadata": { "name": ADDON_NAME },
        "spec": {
            "addOnMeta": {
                "displayName": "argocd-pull",
                "description": "Runs Argo CD in the pull model: the spoke-agent pulls Applications from the hub over gRPC and reports their status back",
            },
            "supportedConfigs": [
                {
                    "group": "addon.open-cluster-management.io",
                    "resource": "addontemplates",
                    "defaultConfig": { "name": ADDON_NAME },
                },
                {
                    "group": "addon.open-cluster-management.io",
                    "resource": "addondeploymentconfigs",
                    "defaultConfig": { "name": DEPLOYMENT_CONFIG, "namespace": HUB_NAMESPACE },
                },
            ],
            "installStrategy": { "type": "Manual" },
        },
    })
}

/// The `installStrategy` that installs the addon on every cluster the
/// Placement `namespace/name` selects (a merge patch for the
/// ClusterManagementAddOn).
pub fn placements_strategy(namespace: &str, name: &str) -> Value {
    json!({
        "spec": {
            "installStrategy": {
                "type": "Placements",
                "placements": [{ "namespace": namespace, "name": name }],
            }
        }
    })
}

mod agent;
pub use agent::{add_on_template, agent_rbac};

/// The default AddOnDeploymentConfig: the values every cluster's agent is
/// rendered with. Per-cluster values go in another AddOnDeploymentConfig
/// named in that cluster's ManagedClusterAddOn `spec.configs`.
pub fn add_on_deployment_config(config: &AddonConfig) -> Value {
    let variables: Vec<Value> = default_variables(config)
        .into_iter()
        .map(|(name, value)| json!({ "name": name, "value": value }))
        .collect();
    json!({
        "apiVersion": "addon.open-cluster-management.io/v1alpha1",
        "kind": "AddOnDeploymentConfig",
        "metadata": { "name": DEPLOYMENT_CONFIG, "namespace": HUB_NAMESPACE },
        "spec": {
            // Empty: the namespaces of the template stand. (The field
            // defaults to open-cluster-management-agent-addon, which would
            // move every namespaced object there, the Argo CD Role too,
            // and register the agent there.)
            "agentInstallNamespace": "",
            "customizedVariables": variables,
            // OCM sets HTTPS_PROXY/https_proxy and NO_PROXY/no_proxy on the
            // agent's container from these; all empty: nothing.
            "proxyConfig": { "httpsProxy": config.https_proxy, "noProxy": config.no_proxy },
        },
    })
}

/// What OCM's addon-manager needs from us: reading the signing CA Secret
/// (and nothing else in our namespace) to sign agent certificates.
pub fn addon_manager_rbac() -> Vec<Value> {
    let name = "argocd-pull-addon-manager-signing-ca";
    vec![
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": name, "namespace": HUB_NAMESPACE },
            "rules": [{
                "apiGroups": [""], "resources": ["secrets"],
                "resourceNames": [SIGNING_CA_SECRET], "verbs": ["get"],
            }],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": name, "namespace": HUB_NAMESPACE },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": [{
                "kind": "ServiceAccount",
                "name": "addon-manager-controller-sa",
                "namespace": "open-cluster-management-hub",
            }],
        }),
    ]
}

/// Labels of every object the hub side installs (the Helm chart's and
/// `deploy/hub`'s).
pub fn hub_labels() -> Value {
    json!({
        "app.kubernetes.io/name": "argocd-pull-hub-controller",
        "app.kubernetes.io/part-of": "argocd-pull",
    })
}

/// Every hub object of the addon, in apply order.
pub fn objects(config: &AddonConfig) -> Vec<Value> {
    let mut objects = vec![
        cluster_management_addon(),
        add_on_template(config),
        add_on_deployment_config(config),
    ];
    objects.extend(addon_manager_rbac());
    for o in &mut objects {
        o["metadata"]["labels"] = hub_labels();
    }
    objects
}

/// Everything, in apply order, as one multi-document YAML stream.
pub fn render(config: &AddonConfig) -> String {
    let mut out = String::new();
    for o in objects(config) {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&o).expect("JSON values serialise"));
    }
    out
}

/// The Helm chart's `templates/addon.yaml`: [`render`] with the chart's
/// values in place of [`AddonConfig`]'s, and OCM's own `{{VARIABLES}}`
/// escaped so that Helm leaves them for OCM. `make generate` writes it; a
/// test fails when the checked-in file drifts.
pub fn render_helm_template() -> String {
    const VALUES: [(&str, &str); 13] = [
        (
            "ARGOCDPULLHELMAGENTIMAGE",
            r#"{{ include "argocd-pull.agentImage" . }}"#,
        ),
        (
            "ARGOCDPULLHELMAGENTNAMESPACE",
            "{{ .Values.agent.argocdNamespace }}",
        ),
        ("ARGOCDPULLHELMGRPCADDRESS", "{{ .Values.grpc.address }}"),
        ("ARGOCDPULLHELMAGENTMODE", "{{ .Values.agent.mode }}"),
        (
            "ARGOCDPULLHELMOTLPENDPOINT",
            r#"{{ .Values.tracing.agentOtlpEndpoint | default "none" }}"#,
        ),
        (
            "ARGOCDPULLHELMARGOCDREDIS",
            r#"{{ .Values.agent.argocdRedis | default "none" }}"#,
        ),
        (
            "ARGOCDPULLHELMLIVEVIEWS",
            r#"{{ .Values.agent.liveViews | toString | quote }}"#,
        ),
        (
            "ARGOCDPULLHELMHTTPSPROXY",
            r#"{{ .Values.agent.proxy.httpsProxy | quote }}"#,
        ),
        (
            "ARGOCDPULLHELMNOPROXY",
            r#"{{ .Values.agent.proxy.noProxy | quote }}"#,
        ),
        (
            "ARGOCDPULLHELMHEARTBEAT",
            r#"{{ .Values.agent.heartbeat | default "hub" | quote }}"#,
        ),
        (
            "ARGOCDPULLHELMTRANSPORT",
            r#"{{ .Values.agent.transport | default "auto" | quote }}"#,
        ),
        (
            "ARGOCDPULLHELMWEBSOCKETURL",
            r#"{{ .Values.agent.websocketUrl | default "hub" | quote }}"#,
        ),
        (
            "ARGOCDPULLHELMTERMINAL",
            r#"{{ .Values.agent.terminal | toString | quote }}"#,
        ),
    ];
    let config = AddonConfig {
        agent_image: VALUES[0].0.into(),
        argocd_namespace: VALUES[1].0.into(),
        hub_grpc_address: VALUES[2].0.into(),
        agent_mode: VALUES[3].0.into(),
        otlp_endpoint: VALUES[4].0.into(),
        argocd_redis: VALUES[5].0.into(),
        live: LiveVariables {
            views: VALUES[6].0.into(),
            terminal: VALUES[12].0.into(),
        },
        https_proxy: VALUES[7].0.into(),
        no_proxy: VALUES[8].0.into(),
        heartbeat: VALUES[9].0.into(),
        transport: VALUES[10].0.into(),
        websocket_url: VALUES[11].0.into(),
    };
    let mut text = String::from(
        "{{- /* Generated by `make generate` (argocd-pull-addon render --helm) from addon/src/lib.rs: do not edit. */ -}}\n",
    );
    // Helm would read OCM's {{CLUSTER_NAME}} as its own action.
    text.push_str(&render(&config).replace("{{", r#"{{ "{{" }}"#));
    for (placeholder, action) in VALUES {
        text = text.replace(placeholder, action);
    }
    text
}

/// Escapes a PEM bundle for [`HUB_CA_VARIABLE`]: OCM substitutes the value
/// into the template's JSON text, where a newline must be written `\n`.
pub fn hub_ca_variable(pem: &str) -> String {
    pem.trim_end().replace('\n', "\\n") + "\\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's Deployment in `template`.
    fn agent_deployment_of(template: &Value) -> &Value {
        template["spec"]["agentSpec"]["workload"]["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["kind"] == "Deployment")
            .unwrap()
    }

    #[test]
    fn the_proxy_comes_from_ocms_proxy_config_and_its_password_from_an_optional_secret() {
        let config = AddonConfig {
            https_proxy: "http://proxy.corp:3128".into(),
            no_proxy: ".corp".into(),
            ..AddonConfig::default()
        };
        let adc = add_on_deployment_config(&config);
        assert_eq!(
            adc["spec"]["proxyConfig"],
            json!({ "httpsProxy": "http://proxy.corp:3128", "noProxy": ".corp" })
        );
        let template = add_on_template(&config);
        let deployment = agent_deployment_of(&template);
        let pod = &deployment["spec"]["template"]["spec"];
        let env = pod["containers"][0]["env"].as_array().unwrap();
        assert!(env.contains(&json!({
            "name": "ARGOCD_PULL_PROXY_CREDENTIALS_FILE",
            "value": "/etc/argocd-pull/proxy/credentials"
        })));
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "proxy-credentials")
            .unwrap();
        assert_eq!(
            volume["secret"],
            json!({ "secretName": PROXY_CREDENTIALS_SECRET, "optional": true })
        );
    }

    #[test]
    fn the_charts_template_is_the_rendered_one() {
        let checked_in = include_str!("../../deploy/helm/argocd-pull/templates/addon.yaml");
        assert!(
            checked_in == render_helm_template(),
            "deploy/helm/argocd-pull/templates/addon.yaml is out of date: run `make generate`"
        );
    }

    /// deploy/hub/addon.yaml is what Helm renders from the chart with its
    /// default values (checked with a real Helm by test/tests/chart.rs);
    /// here, that it holds the objects [`render`] makes, without Helm.
    #[test]
    fn the_kustomize_install_holds_the_rendered_objects() {
        let checked_in = include_str!("../../deploy/hub/addon.yaml");
        // Helm orders objects by kind.
        let sorted = |mut objects: Vec<Value>| {
            objects.sort_by_key(|o| (o["kind"].to_string(), o["metadata"]["name"].to_string()));
            objects
        };
        let parsed: Vec<Value> = checked_in
            .split("\n---")
            .filter_map(|doc| serde_yaml::from_str::<Option<Value>>(doc).ok().flatten())
            .collect();
        assert!(
            sorted(parsed) == sorted(objects(&AddonConfig::default())),
            "deploy/hub/addon.yaml is out of date: run `make generate`"
        );
    }

    #[test]
    fn the_addon_manager_finds_the_template_and_config_through_the_cluster_management_addon() {
        let cma = cluster_management_addon();
        let configs = cma["spec"]["supportedConfigs"].as_array().unwrap();
        let template = add_on_template(&AddonConfig::default());
        let adc = add_on_deployment_config(&AddonConfig::default());
        assert!(configs.iter().any(|c| c["resource"] == "addontemplates"
            && c["defaultConfig"]["name"] == template["metadata"]["name"]));
        assert!(
            configs
                .iter()
                .any(|c| c["resource"] == "addondeploymentconfigs"
                    && c["defaultConfig"]["name"] == adc["metadata"]["name"]
                    && c["defaultConfig"]["namespace"] == adc["metadata"]["namespace"])
        );
        assert_eq!(template["spec"]["addonName"], ADDON_NAME);
        assert_eq!(cma["spec"]["installStrategy"]["type"], "Manual");
    }

    #[test]
    fn every_template_variable_has_a_value() {
        let text = add_on_template(&AddonConfig::default()).to_string();
        let defaults: Vec<_> = default_variables(&AddonConfig::default())
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("{{") {
            let end = rest[start..].find("}}").unwrap() + start;
            let name = &rest[start + 2..end];
            assert!(
                name == "CLUSTER_NAME" || name == HUB_CA_VARIABLE || defaults.contains(&name),
                "{name} has no default value"
            );
            rest = &rest[end + 2..];
        }
    }

    #[test]
    fn the_agent_reads_the_certificate_where_ocm_mounts_it() {
        let template = add_on_template(&AddonConfig::default());
        let deployment = agent_deployment_of(&template);
        let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(args.contains("/managed/argocd-pull.open-cluster-management.io-agent/tls.crt"));
        assert_eq!(
            client_cert_secret(),
            "argocd-pull-argocd-pull.open-cluster-management.io-agent-client-cert"
        );
        // OCM registers the agent in the namespace of the first Deployment.
        assert_eq!(deployment["metadata"]["namespace"], AGENT_NAMESPACE);
    }

    #[test]
    fn the_agent_never_updates_and_autonomous_mode_cannot_create_or_delete() {
        let config = AddonConfig::default();
        let verbs = |config: &AddonConfig, mode: &str| -> Vec<(String, String, Vec<String>)> {
            agent_rbac(config, mode)
                .iter()
                .filter(|m| m["kind"] == "Role" || m["kind"] == "ClusterRole")
                .map(|m| {
                    let bound = agent_rbac(config, mode).iter().any(|b| {
                        b["roleRef"]["name"] == m["metadata"]["name"]
                            && b["roleRef"]["kind"] == m["kind"]
                    });
                    (m, bound)
                })
                .filter(|(_, bound)| *bound)
                .flat_map(|(m, _)| {
                    m["rules"].as_array().unwrap().iter().map(move |r| {
                        (
                            m["kind"].as_str().unwrap().to_string(),
                            r["resources"].to_string(),
                            serde_json::from_value(r["verbs"].clone()).unwrap(),
                        )
                    })
                })
                .collect()
        };
        for mode in ["managed", "autonomous"] {
            for (kind, resources, verbs) in verbs(&config, mode) {
                // Managed mode also keeps the AppProjects and credentials
                // the hub sends, in the Argo CD namespace only, and never
                // deletes a project.
                match (mode, kind.as_str(), resources.as_str()) {
                    (_, _, r#"["applications"]"#) => {}
                    ("managed", "Role", r#"["appprojects"]"#) => {
                        assert!(!verbs.iter().any(|v| v == "delete"), "{verbs:?}")
                    }
                    ("managed", "Role", r#"["secrets"]"#) => {}
                    other => panic!("{other:?}: not the agent's business"),
                }
                assert!(
                    !verbs.iter().any(|v| v == "update" || v == "*"),
                    "{mode} {kind}: {verbs:?}"
                );
                if mode == "autonomous" {
                    assert!(
                        !verbs.iter().any(|v| v == "create" || v == "delete"),
                        "autonomous {kind}: {verbs:?}"
                    );
                }
            }
        }
        assert!(
            verbs(&config, "managed")
                .iter()
                .any(|(_, _, v)| v.contains(&"create".to_string())),
            "managed mode creates"
        );
        // With LIVE_VIEWS `true`, and only then, the agent may also read
        // (get) any object and list events, and nothing more.
        let live = AddonConfig {
            live: LiveVariables {
                views: "true".into(),
                terminal: "false".into(),
            },
            ..AddonConfig::default()
        };
        for mode in ["managed", "autonomous"] {
            let off: Vec<_> = verbs(&config, mode);
            let on: Vec<_> = verbs(&live, mode);
            let added: Vec<_> = on.iter().filter(|r| !off.contains(r)).collect();
            assert_eq!(
                added,
                vec![
                    &(
                        "ClusterRole".to_string(),
                        r#"["*"]"#.to_string(),
                        vec!["get".to_string()]
                    ),
                    &(
                        "ClusterRole".to_string(),
                        r#"["events"]"#.to_string(),
                        vec!["list".to_string()]
                    ),
                ],
                "{mode}"
            );
            // With TERMINAL `true` as well, and only then, exec into pods.
            let terminal = AddonConfig {
                live: LiveVariables {
                    views: "true".into(),
                    terminal: "true".into(),
                },
                ..AddonConfig::default()
            };
            let more: Vec<_> = verbs(&terminal, mode)
                .into_iter()
                .filter(|r| !on.contains(r))
                .collect();
            assert_eq!(
                more,
                vec![(
                    "ClusterRole".to_string(),
                    r#"["pods/exec"]"#.to_string(),
                    vec!["create".to_string(), "get".to_string()]
                )],
                "{mode}"
            );
        }
    }

    #[test]
    fn the_hub_ca_survives_substitution_into_json() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let manifest = r#"{"data":{"ca.crt":"{{HUB_CA}}"}}"#;
        let rendered = manifest.replace("{{HUB_CA}}", &hub_ca_variable(pem));
        let v: Value = serde_json::from_str(&rendered).unwrap();
        assert_eq!(v["data"]["ca.crt"], pem);
    }
}
