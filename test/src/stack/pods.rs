//! argocd-pull as pods in the stack: one real node per cluster
//! ([`crate::node::Node`]: containerd, runc, a kubelet, kube-scheduler and
//! a CNI bridge in a network namespace of the harness's), the images
//! imported from their OCI archives, and the one address the agents dial:
//! [`HUB_GRPC`], as a load balancer in front of the hub's gRPC Service
//! would give it. Inside each managed node it leads, by a relay, to the
//! hub's node, where [`follow_service`] sends it to the ready pods behind
//! Service `argocd-pull/argocd-pull-grpc`, as kube-proxy would.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};

use crate::node::{self, Memory, Node};
use crate::{Cluster, Result, images};

/// Where the agents reach the hub's gRPC Service: an address of the
/// harness's range (10.213.0.0/16), on every node's loopback.
pub const HUB_GRPC: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 213, 254, 1), 8443));

/// Where the harness reaches the hub-controller's admin port inside the
/// hub's node ([`follow_pods`]); the stack relays a loopback port of the
/// machine to it ([`crate::stack::Stack::admin`]).
pub const HUB_ADMIN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 213, 254, 2), 8080));

/// Where the harness reaches the hub-controller's live endpoint
/// (`--live-addr`) inside the hub's node, as it does [`HUB_ADMIN`]; the
/// stack relays a loopback port of the machine to it, which the hub's
/// argocd-server (on this machine) reaches through the cluster Secrets.
pub const HUB_LIVE: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 213, 254, 4), 8444));

/// Where pods reach their own cluster's Argo CD Redis (argocd-server's on
/// the hub, the application-controller's on a managed cluster): an
/// address of the harness's range on every node, which a relay takes to
/// that Redis on this machine's loopback ([`open_argocd_redis`]), as the
/// Service `argocd-redis.argocd.svc:6379` would in a real cluster.
pub const ARGOCD_REDIS: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 213, 254, 3), 6379));

/// Makes [`ARGOCD_REDIS`] inside `node` lead to `redis` on this machine's
/// loopback: a relay from a unix socket to `redis` outside the node, and
/// one from the address to that socket inside.
pub fn open_argocd_redis(node: &mut Node, testenv: &Path, redis: SocketAddr) -> Result<()> {
    let socket = node.dir().join("argocd-redis.sock");
    node.relay(
        testenv,
        "relay-argocd-redis",
        false,
        &format!("unix:{}", socket.display()),
        &format!("tcp:{redis}"),
        &[],
    )?;
    node.reach(testenv, ARGOCD_REDIS, &socket)
}

/// A Deployment of argocd-pull as its pods show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// Every replica of the current pod template is Ready, no other pod left.
    pub ready: bool,
    /// Container restarts over its pods.
    pub restarts: i32,
}

/// Starts a node per name (`<name>-node`) and imports argocd-pull's images
/// into each (with `previous`, the previous release's too): everything that
/// does not need the clusters yet.
pub async fn start_nodes(names: Vec<String>, previous: bool) -> Result<Vec<Node>> {
    let mut images = images::shared().await?.to_vec();
    if previous {
        images.extend_from_slice(images::previous().await?);
    }
    let mut nodes = Vec::new();
    for name in names {
        let node = Node::start(&format!("{name}-node")).await?;
        for image in &images {
            node.import(image)?;
        }
        nodes.push(node);
    }
    Ok(nodes)
}

/// Joins each node to its cluster, then opens [`HUB_GRPC`] from every
/// managed node (all but the first) to the hub's (the first).
pub async fn join(nodes: &mut [Node], clusters: &[&Cluster], testenv: &Path) -> Result<()> {
    futures::future::try_join_all(
        nodes
            .iter_mut()
            .zip(clusters)
            .map(|(node, cluster)| node.join(cluster, testenv)),
    )
    .await?;
    let (hub, managed) = nodes.split_first_mut().expect("a hub node");
    let socket = hub.expose(testenv, HUB_GRPC)?;
    for node in managed {
        node.reach(testenv, HUB_GRPC, &socket)?;
    }
    Ok(())
}

/// Makes `inside` (an address inside the hub's node, [`HUB_ADMIN`] or
/// [`HUB_LIVE`]) reachable at `local`, a loopback address of this machine,
/// as `kubectl port-forward` would; the pods behind it are kept by
/// [`follow_pods`].
pub fn forward(
    hub: &mut Node,
    testenv: &Path,
    inside: SocketAddr,
    local: SocketAddr,
) -> Result<()> {
    let socket = hub.expose(testenv, inside)?;
    hub.relay(
        testenv,
        &format!("relay-hub-{}", inside.port()),
        false,
        &format!("tcp:{local}"),
        &format!("unix:{}", socket.display()),
        &[],
    )
}

/// Keeps [`HUB_GRPC`] inside network namespace `netns` (the hub's node)
/// pointed at the ready endpoints of Service `namespace/service`'s port
/// named `port`, as they change; until aborted.
pub async fn follow_service(
    client: kube::Client,
    netns: String,
    namespace: &str,
    service: &str,
    port: &str,
) {
    let slices: Api<EndpointSlice> = Api::namespaced(client, namespace);
    let selector = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    follow(&netns, HUB_GRPC, "the hub's gRPC address", || async {
        let list = slices.list(&selector).await.ok()?;
        let mut ready = Vec::new();
        for slice in list.items {
            let Some(number) = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(port))
                .and_then(|p| p.port)
            else {
                continue;
            };
            for e in slice.endpoints {
                let is_ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
                for address in e.addresses.iter().filter(|_| is_ready) {
                    if let Ok(ip) = address.parse() {
                        ready.push(SocketAddr::new(ip, number as u16));
                    }
                }
            }
        }
        Some(ready)
    })
    .await
}

/// Keeps `address` ([`HUB_ADMIN`], [`HUB_LIVE`]) inside network namespace
/// `netns` (the hub's node) pointed at the same port of the running pods
/// that `selector` picks in `namespace` (ready or not: a standby's admin
/// port answers too), as `kubectl port-forward` would reach one; until
/// aborted.
pub async fn follow_pods(
    client: kube::Client,
    netns: String,
    namespace: &str,
    selector: String,
    address: SocketAddr,
) {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let selector = ListParams::default().labels(&selector);
    let port = address.port();
    follow(
        &netns,
        address,
        &format!("the hub-controller's port {port}"),
        || async {
            let list = pods.list(&selector).await.ok()?;
            Some(
                list.items
                    .iter()
                    .filter_map(|p| p.status.as_ref())
                    .filter(|s| s.phase.as_deref() == Some("Running"))
                    .filter_map(|s| s.pod_ip.as_deref()?.parse().ok())
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect(),
            )
        },
    )
    .await
}

/// Keeps `address` inside `netns` pointed at what `endpoints` returns
/// (`None`: could not tell, try again), checked four times a second.
async fn follow<F, Fut>(netns: &str, address: SocketAddr, what: &str, mut endpoints: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<Vec<SocketAddr>>>,
{
    let mut current: Option<Vec<SocketAddr>> = None;
    loop {
        if let Some(mut now) = endpoints().await {
            now.sort();
            if current.as_ref() != Some(&now) {
                match node::route_service(netns, address, &now) {
                    Ok(()) => {
                        tracing::info!(endpoints = ?now, "{what} follows its pods");
                        current = Some(now);
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot route {what}"),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Deployment `namespace/name` of `client`'s cluster as its pods show it.
pub async fn status(client: &kube::Client, namespace: &str, name: &str) -> Result<Status> {
    let Some(d) = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(Status::default());
    };
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let s = d.status.clone().unwrap_or_default();
    let pods = deployment_pods(client, namespace, &d).await?;
    let restarts = pods
        .iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    let ready = want > 0
        && s.observed_generation >= d.metadata.generation
        && s.updated_replicas == Some(want)
        && s.ready_replicas == Some(want)
        && s.replicas == Some(want)
        && pods.len() == want as usize;
    Ok(Status { ready, restarts })
}

/// The pods of Deployment `d` (by its selector), terminating ones too.
async fn deployment_pods(
    client: &kube::Client,
    namespace: &str,
    d: &Deployment,
) -> Result<Vec<Pod>> {
    let labels = d
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Ok(Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// One running container of argocd-pull and its memory.
#[derive(Clone, Debug)]
pub struct ContainerMemory {
    pub cluster: String,
    pub pod: String,
    pub container: String,
    pub memory: Memory,
}

/// The memory of every running container in `namespace` of `cluster`
/// that runs on `node`.
pub async fn memory(
    cluster: &Cluster,
    node: &Node,
    namespace: &str,
) -> Result<Vec<ContainerMemory>> {
    let pods = Api::<Pod>::namespaced(cluster.client().await?, namespace)
        .list(&Default::default())
        .await?;
    let mut out = Vec::new();
    for pod in pods.items {
        let on_node =
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.name.as_str());
        let running: Vec<String> = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .map(|c| c.name.clone())
            .collect();
        for container in running.into_iter().filter(|_| on_node) {
            out.push(ContainerMemory {
                cluster: cluster.name().to_string(),
                pod: pod.metadata.name.clone().unwrap_or_default(),
                memory: node.memory(&pod, &container)?,
                container,
            });
        }
    }
    Ok(out)
}

/// The container logs of argocd-pull's pods on `node` (the kubelet's
/// `<namespace>_<pod>_<uid>/<container>/<restart>.log`), by
/// `<cluster>/<pod>/<container>/<file>`.
pub fn logs(cluster: &str, node: &Node) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let Ok(pods) = std::fs::read_dir(node.dir().join("pod-logs")) else {
        return out;
    };
    for pod in pods.flatten() {
        let dir = pod.file_name().to_string_lossy().to_string();
        if !dir.starts_with("argocd-pull") {
            continue;
        }
        let name = dir.split('_').nth(1).unwrap_or_default().to_string();
        for container in std::fs::read_dir(pod.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for file in std::fs::read_dir(container.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                out.insert(
                    format!(
                        "{cluster}/{name}/{}/{}",
                        container.file_name().to_string_lossy(),
                        file.file_name().to_string_lossy()
                    ),
                    file.path(),
                );
            }
        }
    }
    out
}

/// A kustomization in `dir` on top of `deploy/hub`, as a user keeps one
/// for their hub: one replica here (two cores; the churn test deletes the
/// one pod and waits for the Deployment's replacement) and [`HUB_GRPC`] in
/// the gRPC certificate, and the certificates checked every 10 s; with
/// `raw_feedback`, `--raw-feedback` (the work agents have the gate);
/// `--argocd-redis` [`ARGOCD_REDIS`] (the hub's argocd-server's Redis):
/// the hub copies' trees for the hub's Argo CD UI and CLI; and the live
/// endpoint (docs/ui.md) on [`HUB_LIVE`]'s port, which argocd-server
/// reaches at `live_url` (a loopback address of this machine, in the
/// serving certificate too) with `token`, as the chart's `liveViews`
/// sets it up.
pub fn hub_overlay(dir: &Path, raw_feedback: bool, live_url: &str, token: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    // kustomize takes only relative paths to a base.
    let up = "../".repeat(dir.components().count().saturating_sub(1));
    let base = crate::paths::workspace_dir().join("deploy/hub");
    let base = format!("{up}{}", base.display().to_string().trim_start_matches('/'));
    let live_host = live_url
        .trim_start_matches("https://")
        .rsplit_once(':')
        .map_or(live_url, |(host, _)| host);
    std::fs::write(
        dir.join("live-tokens.yaml"),
        format!(
            r#"apiVersion: v1
kind: Secret
metadata:
  name: argocd-pull-live-tokens
  namespace: argocd-pull
type: Opaque
stringData:
  tokens: "{token}\n"
"#
        ),
    )?;
    let arg = |value: &str| {
        format!(
            "      - op: add\n        path: /spec/template/spec/containers/0/args/-\n        value: {value}\n"
        )
    };
    let mut args = arg(&format!("--grpc-san={}", HUB_GRPC.ip()));
    // A new AddOnDeploymentConfig gets HUB_CA within seconds, not a minute.
    args += &arg("--certificate-check-interval=10s");
    args += &arg(&format!("--argocd-redis={ARGOCD_REDIS}"));
    if raw_feedback {
        args += &arg("--raw-feedback");
    }
    args += &arg(&format!("--grpc-san={live_host}"));
    args += &arg(&format!("--live-addr=0.0.0.0:{}", HUB_LIVE.port()));
    args += &arg(&format!("--live-url={live_url}"));
    args += &arg("--live-token-file=/var/run/argocd-pull/live-tokens/tokens");
    args += &arg("--live-ca-file=/var/run/argocd-pull/live-ca/tls.crt");
    // As the chart: where other replicas would forward reads (POD_IP is
    // in the base, as in the chart).
    args += &arg("--live-peer-addr=$(POD_IP)");
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
  - live-tokens.yaml
patches:
  - target: {{kind: Deployment, name: argocd-pull-hub-controller}}
    patch: |-
      - op: replace
        path: /spec/replicas
        value: 1
{args}      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {{name: live-tokens, mountPath: /var/run/argocd-pull/live-tokens, readOnly: true}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {{name: live-ca, mountPath: /var/run/argocd-pull/live-ca, readOnly: true}}
      - op: add
        path: /spec/template/spec/volumes/-
        value: {{name: live-tokens, secret: {{secretName: argocd-pull-live-tokens}}}}
      # The serving CA's certificate, which the controller creates at its
      # first start (read again when it appears).
      - op: add
        path: /spec/template/spec/volumes/-
        value: {{name: live-ca, secret: {{secretName: argocd-pull-serving-ca, optional: true, items: [{{key: tls.crt, path: tls.crt}}]}}}}
"#
        ),
    )?;
    Ok(dir.to_path_buf())
}
