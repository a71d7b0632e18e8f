//! What each managed cluster gets: the AddOnTemplate with the agent's
//! Deployment, its RBAC (by mode, and the live views' when allowed) and
//! the hub CA it trusts, with OCM's `{{VARIABLES}}` left for the
//! addon-manager to substitute per cluster.

use serde_json::{Value, json};

use super::{
    ADDON_NAME, AGENT_NAME, AGENT_NAMESPACE, AddonConfig, HEARTBEAT_VARIABLE, HUB_CA_CONFIGMAP,
    HUB_CA_DIR, HUB_CA_VARIABLE, HUB_NAMESPACE, LIVE_VIEWS_VARIABLE, PROXY_CREDENTIALS_DIR,
    PROXY_CREDENTIALS_SECRET, SIGNER_NAME, SIGNING_CA_SECRET, TERMINAL_VARIABLE,
    TRANSPORT_VARIABLE, WEBSOCKET_URL_VARIABLE, client_cert_dir,
};

/// The AddOnTemplate: what each managed cluster gets, and how its agent
/// registers.
pub fn add_on_template(config: &AddonConfig) -> Value {
    let labels =
        json!({ "app.kubernetes.io/name": AGENT_NAME, "app.kubernetes.io/part-of": "argocd-pull" });
    let mut manifests = vec![
        json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": AGENT_NAMESPACE, "labels": labels },
        }),
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": AGENT_NAME, "namespace": AGENT_NAMESPACE, "labels": labels },
        }),
        // Least privilege, from what the agent calls (spoke-agent/src):
        // in managed mode it watches the Applications it manages (labelled)
        // across the cluster, and reads, creates (a server-side apply of a
        // new one), patches and deletes them in the Argo CD namespace only;
        // in autonomous mode it watches that namespace and only patches
        // (a sync, refresh or terminate command), never creating or deleting.
        // It never updates (PUT). The mode picks the RoleBinding, so an
        // agent that claims the other mode still has only its own Role.
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": AGENT_NAME, "labels": labels },
            "rules": [{
                "apiGroups": ["argoproj.io"], "resources": ["applications"],
                "verbs": ["list", "watch"],
            }],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": AGENT_NAME, "labels": labels },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": AGENT_NAME },
            "subjects": [{ "kind": "ServiceAccount", "name": AGENT_NAME, "namespace": AGENT_NAMESPACE }],
        }),
        agent_role(
            config,
            "managed",
            &["get", "create", "patch", "delete"],
            &labels,
        ),
        agent_role(
            config,
            "autonomous",
            &["get", "list", "watch", "patch"],
            &labels,
        ),
        // Named after the mode: a RoleBinding's roleRef cannot change, so a
        // new mode is a new binding (the work agent deletes the old one).
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": format!("{AGENT_NAME}-{{{{AGENT_MODE}}}}"), "namespace": config.argocd_namespace, "labels": labels },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("{AGENT_NAME}-{{{{AGENT_MODE}}}}") },
            "subjects": [{ "kind": "ServiceAccount", "name": AGENT_NAME, "namespace": AGENT_NAMESPACE }],
        }),
    ];
    manifests.extend(live_rbac(&labels));
    manifests.extend([
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": HUB_CA_CONFIGMAP, "namespace": AGENT_NAMESPACE, "labels": labels },
            "data": { "ca.crt": format!("{{{{{HUB_CA_VARIABLE}}}}}") },
        }),
        agent_deployment(config, &labels),
    ]);
    json!({
        "apiVersion": "addon.open-cluster-management.io/v1alpha1",
        "kind": "AddOnTemplate",
        "metadata": { "name": ADDON_NAME },
        "spec": {
            "addonName": ADDON_NAME,
            "agentSpec": { "workload": { "manifests": manifests } },
            "registration": [{
                "type": "CustomSigner",
                "customSigner": {
                    "signerName": SIGNER_NAME,
                    "signingCA": { "name": SIGNING_CA_SECRET, "namespace": HUB_NAMESPACE },
                },
            }],
        },
    })
}

/// The agent's Role in the Argo CD namespace for one mode
/// (`argocd-pull-agent-<mode>`). In managed mode it also keeps the
/// AppProjects and project-scoped credentials the hub sends (capability
/// `projects`): it deletes only credentials, never a project.
fn agent_role(config: &AddonConfig, mode: &str, verbs: &[&str], labels: &Value) -> Value {
    let mut rules = vec![json!({
        "apiGroups": ["argoproj.io"], "resources": ["applications"],
        "verbs": verbs,
    })];
    if mode == "managed" {
        rules.push(json!({
            "apiGroups": ["argoproj.io"], "resources": ["appprojects"],
            "verbs": ["get", "list", "watch", "create", "patch"],
        }));
        rules.push(json!({
            "apiGroups": [""], "resources": ["secrets"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"],
        }));
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": { "name": format!("{AGENT_NAME}-{mode}"), "namespace": config.argocd_namespace, "labels": labels },
        "rules": rules,
    })
}

/// The RBAC of what the agent serves of the hub's live endpoint, bound
/// only while its variable allows it: each binding is named after the
/// variable's value (a roleRef cannot change, so a new value is a new
/// binding and the work agent deletes the old one), and the `false` role
/// grants nothing.
fn live_rbac(labels: &Value) -> Vec<Value> {
    vec![
        // The live views read what they serve with the agent's identity:
        // `get` on every kind (a Secret leaves without its values), and the
        // events of an object. Bound only while LIVE_VIEWS is `true`: the
        // binding is named after the value (its roleRef cannot change, so a
        // new value is a new binding and the work agent deletes the old
        // one), and the `false` role grants nothing.
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": format!("{AGENT_NAME}-live-true"), "labels": labels },
            "rules": [
                { "apiGroups": ["*"], "resources": ["*"], "verbs": ["get"] },
                { "apiGroups": [""], "resources": ["events"], "verbs": ["list"] },
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": format!("{AGENT_NAME}-live-false"), "labels": labels },
            "rules": [],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": format!("{AGENT_NAME}-live-{{{{{LIVE_VIEWS_VARIABLE}}}}}"), "labels": labels },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{AGENT_NAME}-live-{{{{{LIVE_VIEWS_VARIABLE}}}}}") },
            "subjects": [{ "kind": "ServiceAccount", "name": AGENT_NAME, "namespace": AGENT_NAMESPACE }],
        }),
        // The web terminals exec with the agent's identity: `create` (and
        // `get`, the verb of a WebSocket's GET where the API server does not
        // authorize it as `create`) on `pods/exec`. Bound only while
        // TERMINAL is `true`, as the live views' role is.
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": format!("{AGENT_NAME}-terminal-true"), "labels": labels },
            "rules": [
                { "apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"] },
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": format!("{AGENT_NAME}-terminal-false"), "labels": labels },
            "rules": [],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": format!("{AGENT_NAME}-terminal-{{{{{TERMINAL_VARIABLE}}}}}"), "labels": labels },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{AGENT_NAME}-terminal-{{{{{TERMINAL_VARIABLE}}}}}") },
            "subjects": [{ "kind": "ServiceAccount", "name": AGENT_NAME, "namespace": AGENT_NAMESPACE }],
        }),
    ]
}

/// The agent's RBAC as OCM renders it for a cluster whose agent runs in
/// `mode` (`managed` or `autonomous`): the template's ServiceAccount,
/// ClusterRole(Binding), Roles and RoleBinding with `{{AGENT_MODE}}`
/// substituted (and `{{LIVE_VIEWS}}`, `{{TERMINAL}}` with the config's),
/// in apply order.
/// For tests that run as the agent.
pub fn agent_rbac(config: &AddonConfig, mode: &str) -> Vec<Value> {
    let template = add_on_template(config);
    template["spec"]["agentSpec"]["workload"]["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["kind"] == "Namespace"
                || m["kind"] == "ServiceAccount"
                || m["apiVersion"]
                    .as_str()
                    .is_some_and(|v| v.starts_with("rbac.authorization.k8s.io/"))
        })
        .map(|m| {
            serde_json::from_str(
                &m.to_string()
                    .replace("{{AGENT_MODE}}", mode)
                    .replace("{{LIVE_VIEWS}}", &config.live.views)
                    .replace("{{TERMINAL}}", &config.live.terminal),
            )
            .expect("substituting a name keeps it JSON")
        })
        .collect()
}

fn agent_deployment(config: &AddonConfig, labels: &Value) -> Value {
    let certs = client_cert_dir();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": AGENT_NAME, "namespace": AGENT_NAMESPACE, "labels": labels },
        "spec": {
            // One agent per cluster: the hub takes one stream per identity.
            "replicas": 1,
            "strategy": { "type": "Recreate" },
            "selector": { "matchLabels": { "app.kubernetes.io/name": AGENT_NAME } },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "serviceAccountName": AGENT_NAME,
                    "securityContext": { "runAsNonRoot": true, "seccompProfile": { "type": "RuntimeDefault" } },
                    "containers": [{
                        "name": "spoke-agent",
                        "image": "{{AGENT_IMAGE}}",
                        "args": [
                            "--cluster-name={{CLUSTER_NAME}}",
                            "--hub-address={{HUB_GRPC_ADDRESS}}",
                            format!("--argocd-namespace={}", config.argocd_namespace),
                            "--mode={{AGENT_MODE}}",
                            format!("--tls-cert={certs}/tls.crt"),
                            format!("--tls-key={certs}/tls.key"),
                            format!("--hub-ca={HUB_CA_DIR}/ca.crt"),
                            "--log-format=json",
                        ],
                        // Settings newer than the previous release go in the
                        // environment, not the arguments: while the hub moves
                        // first, an agent of the previous release is rendered
                        // from this template too (`agent.image.tag` kept back),
                        // and it exits on a flag it does not know but ignores
                        // a variable it does not read.
                        "env": [
                            { "name": "ARGOCD_PULL_OTLP_ENDPOINT", "value": "{{OTLP_ENDPOINT}}" },
                            { "name": "ARGOCD_PULL_ARGOCD_REDIS", "value": "{{ARGOCD_REDIS}}" },
                            { "name": "ARGOCD_PULL_LIVE_VIEWS", "value": "{{LIVE_VIEWS}}" },
                            { "name": "ARGOCD_PULL_TERMINAL", "value": format!("{{{{{TERMINAL_VARIABLE}}}}}") },
                            { "name": "ARGOCD_PULL_HEARTBEAT", "value": format!("{{{{{HEARTBEAT_VARIABLE}}}}}") },
                            { "name": "ARGOCD_PULL_TRANSPORT", "value": format!("{{{{{TRANSPORT_VARIABLE}}}}}") },
                            { "name": "ARGOCD_PULL_WEBSOCKET_URL", "value": format!("{{{{{WEBSOCKET_URL_VARIABLE}}}}}") },
                            // The egress proxy itself comes from OCM, which
                            // sets HTTPS_PROXY/NO_PROXY from the cluster's
                            // AddOnDeploymentConfig `proxyConfig`.
                            { "name": "ARGOCD_PULL_PROXY_CREDENTIALS_FILE", "value": format!("{PROXY_CREDENTIALS_DIR}/credentials") },
                        ],
                        "ports": [{ "name": "admin", "containerPort": 8080 }],
                        "livenessProbe": { "httpGet": { "path": "/healthz", "port": "admin" } },
                        // Ready means connected to the hub: OCM reports the
                        // addon Available from the Deployment's availability.
                        "readinessProbe": { "httpGet": { "path": "/readyz", "port": "admin" } },
                        "resources": {
                            "requests": { "cpu": "50m", "memory": "64Mi" },
                            "limits": { "memory": "256Mi" },
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": { "drop": ["ALL"] },
                        },
                        "volumeMounts": [
                            { "name": "hub-ca", "mountPath": HUB_CA_DIR, "readOnly": true },
                            { "name": "proxy-credentials", "mountPath": PROXY_CREDENTIALS_DIR, "readOnly": true },
                        ],
                    }],
                    "volumes": [
                        { "name": "hub-ca", "configMap": { "name": HUB_CA_CONFIGMAP } },
                        // Optional: the agent reads the file at every dial
                        // (a Secret's update reaches the pod in about a
                        // minute) and sends no credentials while it is absent.
                        { "name": "proxy-credentials", "secret": { "secretName": PROXY_CREDENTIALS_SECRET, "optional": true } },
                    ],
                },
            },
        },
    })
}
