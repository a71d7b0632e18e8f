//! The argocd-pull addon against real OCM: `clusteradm addon enable` on a
//! hub running OCM's registration, placement and addon-manager, two
//! managed clusters joined for real with their registration and work
//! agents, and the hub-controller binary keeping the certificates.
//!
//! Nothing plays OCM here. What the test plays is the kubelet, for our
//! agent's Deployment only (`testenv::kubelet`): the agent runs in this
//! process with exactly the command line of the Deployment the real work
//! agent applied, the files of the Secret and ConfigMap it mounts (the
//! certificate the real CSR flow issued) and a token of its service
//! account; and the Deployment's status says whether it is ready, which is
//! what OCM's health check reads.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{AddOnDeploymentConfig, ManagedClusterAddOn, ManifestWork};
use argocd_pull_runtime::Readiness;
use argocd_pull_runtime::shutdown::{self, Trigger};
use argocd_pull_spoke_agent::metrics::AgentMetrics;
use clap::Parser;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::ocm::{Fleet, JoinOptions};
use testenv::{Cluster, kubelet, net, paths, wait};

mod common;
use common::{Binary, app, apps_api};

const TIMEOUT: Duration = Duration::from_secs(120);
const SPOKE_NS: &str = "argocd";
const AGENT_NS: &str = argocd_pull_addon::AGENT_NAMESPACE;
const AGENT: &str = argocd_pull_addon::AGENT_NAME;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Runs a command line tool, failing the test with its output.
async fn run(tool: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new(tool)
        .args(args)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{} {args:?}:\n{text}", tool.display());
    text
}

fn adc_api(client: &kube::Client) -> Api<AddOnDeploymentConfig> {
    Api::namespaced(client.clone(), argocd_pull_addon::HUB_NAMESPACE)
}

/// The agent of one managed cluster, run as the kubelet would run the pod
/// of its Deployment.
struct RunningAgent {
    generation: i64,
    pod: kubelet::Pod,
    trigger: Trigger,
    task: tokio::task::JoinHandle<()>,
    readiness: Readiness,
    metrics: AgentMetrics,
    ready: Option<bool>,
}

impl RunningAgent {
    async fn stop(self) {
        self.trigger.fire();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// What a kubelet sees of our agent on `cluster`: (running, connected,
/// certificate reloads) for the test to look at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    running: bool,
    connected: bool,
    reloads: u64,
}

/// Plays the kubelet for the agent's Deployment on `cluster` until the
/// test ends.
fn kubelet_for(cluster: &'static Cluster) -> tokio::sync::watch::Receiver<Seen> {
    let (tx, rx) = tokio::sync::watch::channel(Seen::default());
    tokio::spawn(async move {
        let dir = cluster.dir().join("kubelet").join(AGENT);
        let client = cluster.client().await.unwrap();
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client, AGENT_NS);
        let mut running: Option<RunningAgent> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let generation = match deployments.get_opt(AGENT).await {
                Ok(d) => d.map(|d| d.metadata.generation.unwrap_or_default()),
                Err(_) => continue,
            };
            // Deleted or rolled out: the old pod goes.
            if running
                .as_ref()
                .is_some_and(|r| Some(r.generation) != generation)
            {
                running.take().unwrap().stop().await;
            }
            let Some(generation) = generation else {
                tx.send_replace(Seen::default());
                continue;
            };
            if running.is_none() {
                let Ok(Some(pod)) = kubelet::materialize(cluster, AGENT_NS, AGENT, &dir).await
                else {
                    continue;
                };
                let mut argv = vec!["spoke-agent".to_string()];
                argv.extend(pod.args.iter().cloned());
                argv.push(format!("--kubeconfig={}", pod.kubeconfig.display()));
                argv.push("--reconnect-max=2s".into());
                argv.push("--tls-reload-interval=1s".into());
                let args = argocd_pull_spoke_agent::Args::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("the Deployment's command line {argv:?}: {e}"));
                let client = testenv::client_for(&pod.kubeconfig).await.unwrap();
                let (trigger, stop) = shutdown::channel();
                let readiness = Readiness::default();
                readiness.set("cluster-api", true);
                let metrics = AgentMetrics::default();
                let task = tokio::spawn(argocd_pull_spoke_agent::run_agent(
                    args.config(),
                    client,
                    metrics.clone(),
                    readiness.clone(),
                    stop,
                ));
                running = Some(RunningAgent {
                    generation,
                    pod,
                    trigger,
                    task,
                    readiness,
                    metrics,
                    ready: None,
                });
            }
            let r = running.as_mut().unwrap();
            // Rotated Secrets reach the pod's files, as the kubelet syncs them.
            let _ = kubelet::refresh(cluster, AGENT_NS, &r.pod).await;
            let ready = r.readiness.report().0;
            if r.ready != Some(ready)
                && kubelet::set_ready(cluster, AGENT_NS, AGENT, ready)
                    .await
                    .unwrap_or(false)
            {
                r.ready = Some(ready);
            }
            tx.send_replace(Seen {
                running: true,
                connected: ready,
                reloads: r.metrics.certificate_reloads.get(),
            });
        }
    });
    rx
}

/// Waits until what the kubelet of a cluster sees satisfies `check`.
async fn kubelet_shows(
    seen: &tokio::sync::watch::Receiver<Seen>,
    what: &str,
    check: impl FnMut(&Seen) -> bool,
) {
    let mut rx = seen.clone();
    let done = matches!(
        tokio::time::timeout(TIMEOUT, rx.wait_for(check)).await,
        Ok(Ok(_))
    );
    if !done {
        panic!(
            "timed out after {TIMEOUT:?} waiting for {what}; last seen: {:?}",
            *rx.borrow()
        );
    }
}

async fn condition(hub: &kube::Client, cluster: &str, type_: &str) -> Result<(), String> {
    let mca = Api::<ManagedClusterAddOn>::namespaced(hub.clone(), cluster)
        .get_opt(keys::ADDON_NAME)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no ManagedClusterAddOn")?;
    let conditions = mca.status.and_then(|s| s.conditions).unwrap_or_default();
    if conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
    {
        Ok(())
    } else {
        Err(format!("{conditions:?}"))
    }
}

fn client_cert(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("tls.crt"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

fn subject_of(pem: &str) -> String {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clusteradm_addon_enable_deploys_registers_and_connects_the_agent() {
    testenv::init_tracing();
    let fleet: &'static Fleet = Box::leak(Box::new(
        Fleet::start(
            "hub",
            &[
                ("cluster1", JoinOptions::default()),
                ("cluster2", JoinOptions::default()),
            ],
        )
        .await
        .expect("the hub starts and the clusters join"),
    ));
    let hub = fleet.hub.cluster();
    let client = hub.client().await.unwrap();
    hub.ensure_namespace(argocd_pull_addon::HUB_NAMESPACE)
        .await
        .unwrap();
    for c in &fleet.clusters {
        c.ensure_namespace(SPOKE_NS).await.unwrap();
    }
    let kubeconfig = hub.kubeconfig().display().to_string();
    let kubectl = paths::bin_dir().join("kubectl");
    let clusteradm = paths::bin_dir().join("clusteradm");

    // The addon's hub side, as checked in.
    run(
        &kubectl,
        &[
            "--kubeconfig",
            &kubeconfig,
            "apply",
            "--server-side",
            "-f",
            repo_file("deploy/hub/addon.yaml").to_str().unwrap(),
        ],
    )
    .await;
    let grpc = net::free_addr().unwrap();
    adc_api(&client)
        .patch(
            argocd_pull_addon::DEPLOYMENT_CONFIG,
            &PatchParams::apply("platform-team").force(),
            &Patch::Apply(json!({
                "apiVersion": "addon.open-cluster-management.io/v1alpha1",
                "kind": "AddOnDeploymentConfig",
                "spec": { "customizedVariables": [
                    { "name": "HUB_GRPC_ADDRESS", "value": format!("https://{grpc}") },
                ] },
            })),
        )
        .await
        .unwrap();

    // The hub-controller keeps the CAs and its serving certificate.
    let dir = tempfile::tempdir().unwrap();
    let file = |n: &str| dir.path().join(n).display().to_string();
    let log = hub.dir().join("hub-controller.log");
    let controller = Binary::start_as(
        hub.kubeconfig(),
        &[
            "--leader-elect=false",
            "--authorization=none",
            "--grpc-addr",
            &grpc.to_string(),
            "--grpc-manage-certificates",
            "--grpc-san=127.0.0.1",
            "--grpc-tls-cert",
            &file("tls.crt"),
            "--grpc-tls-key",
            &file("tls.key"),
            "--grpc-client-ca",
            &file("ca.crt"),
            "--certificate-check-interval=2s",
        ],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    wait::until("the hub-controller to be ready", TIMEOUT, || async {
        match net::http_get(controller.admin, "/readyz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!(
                "{other:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )),
        }
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), argocd_pull_addon::HUB_NAMESPACE);
    let signing = wait::exists(&secrets, argocd_pull_addon::SIGNING_CA_SECRET, TIMEOUT).await;
    assert_eq!(signing.type_.as_deref(), Some("kubernetes.io/tls"));
    wait::until(
        "the serving CA in the AddOnDeploymentConfig",
        TIMEOUT,
        || async {
            let adc = adc_api(&client)
                .get(argocd_pull_addon::DEPLOYMENT_CONFIG)
                .await
                .map_err(|e| e.to_string())?;
            let vars = adc.spec.customized_variables.unwrap_or_default();
            let value = |name: &str| {
                vars.iter()
                    .find(|v| v.name == name)
                    .and_then(|v| v.value.clone())
                    .unwrap_or_default()
            };
            if value(argocd_pull_addon::HUB_CA_VARIABLE).contains("BEGIN CERTIFICATE")
                && !value("HUB_GRPC_ADDRESS").is_empty()
            {
                Ok(())
            } else {
                Err(format!("{vars:?}"))
            }
        },
    )
    .await;

    // What a user types.
    run(
        &clusteradm,
        &[
            "addon",
            "enable",
            "--names",
            keys::ADDON_NAME,
            "--clusters",
            "cluster1,cluster2",
            "--kubeconfig",
            &kubeconfig,
        ],
    )
    .await;

    // OCM's addon-manager renders the template into the deploy work, and
    // the real work agent applies it.
    let deploy_work = format!("addon-{}-deploy-0", keys::ADDON_NAME);
    for cluster in ["cluster1", "cluster2"] {
        let works: Api<ManifestWork> = Api::namespaced(client.clone(), cluster);
        wait::until(
            &format!("{deploy_work} applied on {cluster}"),
            TIMEOUT,
            || async {
                let w = works
                    .get_opt(&deploy_work)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no work yet")?;
                let applied = w.status.and_then(|s| s.conditions).unwrap_or_default();
                if applied
                    .iter()
                    .any(|c| c.type_ == "Applied" && c.status == "True")
                {
                    Ok(())
                } else {
                    Err(format!("{applied:?}"))
                }
            },
        )
        .await;
    }

    // The agent's certificate comes through the real CSR flow, signed with
    // the CA the hub-controller keeps, for the identity the hub accepts.
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    wait::until("two signed CSRs of the addon's signer", TIMEOUT, || async {
        let list = csrs
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let signed = list
            .items
            .iter()
            .filter(|c| c.spec.signer_name == argocd_pull_addon::SIGNER_NAME)
            .filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.certificate.as_ref())
                    .is_some()
            })
            .count();
        if signed >= 2 {
            Ok(())
        } else {
            Err(format!("{signed} signed"))
        }
    })
    .await;
    let mut seen = Vec::new();
    for c in &fleet.clusters {
        let spoke_secrets: Api<Secret> = Api::namespaced(c.client().await.unwrap(), AGENT_NS);
        let secret = wait::exists(
            &spoke_secrets,
            &argocd_pull_addon::client_cert_secret(),
            TIMEOUT,
        )
        .await;
        assert_eq!(
            subject_of(&client_cert(&secret)),
            format!(
                "system:open-cluster-management:cluster:{}:addon:argocd-pull:agent:argocd-pull-agent",
                c.name()
            )
        );
        seen.push(kubelet_for(c));
    }

    // Connected with that identity, and OCM reports the addon Available.
    for (i, cluster) in ["cluster1", "cluster2"].iter().enumerate() {
        kubelet_shows(&seen[i], &format!("{cluster}'s agent connected"), |s| {
            s.connected
        })
        .await;
        wait::until(
            &format!("{cluster}'s agent connected, as the hub sees it"),
            TIMEOUT,
            || async {
                let (_, body) = net::http_get(controller.admin, "/metrics")
                    .await
                    .map_err(|e| e.to_string())?;
                let line =
                    format!("argocd_pull_hub_grpc_agent_connected{{cluster=\"{cluster}\"}} 1");
                if body.contains(&line) {
                    Ok(())
                } else {
                    Err(line)
                }
            },
        )
        .await;
        wait::until(&format!("{cluster}'s addon Available"), TIMEOUT, || {
            condition(&client, cluster, "Available")
        })
        .await;
    }

    // Applications go over gRPC to the cluster they name, status comes back.
    let team = hub.namespace("team").await.unwrap();
    let hub_apps = apps_api(&client, &team);
    for cluster in ["cluster1", "cluster2"] {
        let a = app(
            &format!("guestbook-{cluster}"),
            &team,
            json!({
                keys::MANAGED_CLUSTER: cluster,
                keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NS,
                keys::SKIP_RECONCILE: "true",
            }),
            json!({}),
        );
        hub_apps.create(&PostParams::default(), &a).await.unwrap();
    }
    let mut spoke_uids = Vec::new();
    for (i, c) in fleet.clusters.iter().enumerate() {
        let name = format!("guestbook-{}", c.name());
        let spoke = apps_api(&c.client().await.unwrap(), SPOKE_NS);
        let delivered = wait::exists(&spoke, &name, TIMEOUT).await;
        spoke_uids.push(delivered.metadata.uid.clone().unwrap());
        let works: Api<ManifestWork> = Api::namespaced(client.clone(), c.name());
        let list = works.list(&Default::default()).await.unwrap();
        assert!(
            list.items
                .iter()
                .all(|w| w.metadata.name.as_deref() == Some(&deploy_work)),
            "cluster {i}'s Application went over gRPC, not in a ManifestWork"
        );
        // The spoke's Argo CD reports; the hub copy shows it.
        spoke
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {
                    "sync": { "status": "Synced", "revision": "abc" },
                    "health": { "status": "Healthy" } } })),
            )
            .await
            .unwrap();
        wait::until(&format!("{name}'s status on the hub"), TIMEOUT, || async {
            let a: Application = hub_apps.get(&name).await.map_err(|e| e.to_string())?;
            if a.data["status"]["health"]["status"] == "Healthy" {
                Ok(())
            } else {
                Err(a.data["status"].to_string())
            }
        })
        .await;
    }

    // Rotation: the klusterlet's certificate Secret goes (as when OCM
    // renews it); the real CSR flow issues a new one, the kubelet copies it
    // into the pod's files, and the agent picks it up without a restart.
    let spoke1 = fleet.cluster("cluster1");
    let spoke1_secrets: Api<Secret> = Api::namespaced(spoke1.client().await.unwrap(), AGENT_NS);
    let cert_name = argocd_pull_addon::client_cert_secret();
    let before = client_cert(&spoke1_secrets.get(&cert_name).await.unwrap());
    let reloads_before = seen[0].borrow().reloads;
    spoke1_secrets
        .delete(&cert_name, &Default::default())
        .await
        .unwrap();
    wait::until(
        "a new certificate for cluster1's agent",
        TIMEOUT,
        || async {
            let now = spoke1_secrets
                .get_opt(&cert_name)
                .await
                .map_err(|e| e.to_string())?
                .map(|s| client_cert(&s))
                .unwrap_or_default();
            if !now.is_empty() && now != before {
                Ok(())
            } else {
                Err("the same certificate, or none".to_string())
            }
        },
    )
    .await;
    kubelet_shows(
        &seen[0],
        "cluster1's agent to load the new certificate",
        |s| s.reloads > reloads_before && s.connected,
    )
    .await;
    // Nothing dropped: a status change after the rotation still arrives.
    let spoke1_apps = apps_api(&spoke1.client().await.unwrap(), SPOKE_NS);
    spoke1_apps
        .patch(
            "guestbook-cluster1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "health": { "status": "Progressing" } } })),
        )
        .await
        .unwrap();
    wait::until("the post-rotation status on the hub", TIMEOUT, || async {
        let a: Application = hub_apps
            .get("guestbook-cluster1")
            .await
            .map_err(|e| e.to_string())?;
        if a.data["status"]["health"]["status"] == "Progressing" {
            Ok(())
        } else {
            Err(a.data["status"].to_string())
        }
    })
    .await;

    // Disable on cluster2: OCM removes the agent there; its Application
    // falls back to a ManifestWork without being deleted on the spoke.
    run(
        &clusteradm,
        &[
            "addon",
            "disable",
            "--names",
            keys::ADDON_NAME,
            "--clusters",
            "cluster2",
            "--kubeconfig",
            &kubeconfig,
        ],
    )
    .await;
    kubelet_shows(
        &seen[1],
        "cluster2's agent Deployment removed by OCM",
        |s| !s.running,
    )
    .await;
    let works2: Api<ManifestWork> = Api::namespaced(client.clone(), "cluster2");
    wait::until(
        "cluster2's Application in a ManifestWork",
        TIMEOUT,
        || async {
            let list = works2
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let names: Vec<_> = list
                .items
                .iter()
                .filter_map(|w| w.metadata.name.clone())
                .collect();
            if names.iter().any(|n| n != &deploy_work) && !names.contains(&deploy_work) {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        },
    )
    .await;
    let spoke2_apps = apps_api(&fleet.cluster("cluster2").client().await.unwrap(), SPOKE_NS);
    // Give a wrong deletion time to happen, then check it did not.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = spoke2_apps.get("guestbook-cluster2").await.unwrap();
    assert_eq!(
        still.metadata.uid.as_deref(),
        Some(spoke_uids[1].as_str()),
        "the spoke's Application was deleted and recreated in the hand-over"
    );
    // cluster1 is untouched.
    assert!(seen[0].borrow().connected);

    let hub_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !hub_log.contains("refused an agent's client certificate"),
        "the hub refused an OCM-issued certificate:\n{hub_log}"
    );
}
