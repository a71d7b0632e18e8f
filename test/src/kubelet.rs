//! The kubelet's part for one Deployment, since the local clusters have
//! none: what a pod of the Deployment would see, as files and a command
//! line, and the Deployment's status once the process is ready.
//!
//! [`materialize`] reads the Deployment from its cluster, writes every
//! Secret and ConfigMap volume it mounts into a folder (as the kubelet
//! projects them), rewrites the container's arguments and environment from
//! mount paths to those folders, and gives the pod's service account a
//! kubeconfig with a token of that account (so the process runs with
//! exactly the RBAC the Deployment was given). [`refresh`] copies changed
//! Secrets and ConfigMaps into the folders again, as the kubelet does for a
//! rotated certificate. [`set_ready`] writes the pod status the kubelet
//! would write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod as PodObject, Secret, ServiceAccount};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::{Cluster, Result};

/// What the first container of a Deployment's pod would run with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// The container's arguments, mount paths replaced by local folders.
    pub args: Vec<String>,
    /// Its literal environment, mount paths replaced likewise.
    pub env: Vec<(String, String)>,
    /// Kubeconfig of the pod's service account for its own cluster.
    pub kubeconfig: PathBuf,
    /// The pod template's generation, to tell a rollout.
    pub generation: i64,
    /// Mount path -> (folder, volume source kind, object name).
    mounts: Vec<Mount>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Mount {
    path: String,
    dir: PathBuf,
    source: Source,
}

/// What a volume holds: a Secret's or ConfigMap's keys as files, or an
/// empty folder the process writes to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    /// A Secret by name, and whether it is `optional` (absent: an empty
    /// folder, as the kubelet mounts it).
    Secret(String, bool),
    ConfigMap(String, bool),
    EmptyDir,
}

impl Pod {
    /// The container's arguments with each `--flag=value` of `overrides`
    /// in place of the Deployment's own value of that flag (what a
    /// process outside a pod must change: its listen addresses, say).
    pub fn args_with(&self, overrides: &[(&str, String)]) -> Vec<String> {
        let mut args: Vec<String> = self
            .args
            .iter()
            .filter(|a| {
                !overrides
                    .iter()
                    .any(|(flag, _)| *a == flag || a.starts_with(&format!("{flag}=")))
            })
            .cloned()
            .collect();
        args.extend(overrides.iter().map(|(flag, v)| format!("{flag}={v}")));
        args
    }
}

/// Reads Deployment `namespace/name` of `cluster` and prepares its pod in
/// `dir`; `None` while the Deployment, one of its volumes' objects or its
/// service account does not exist yet.
pub async fn materialize(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    dir: &Path,
) -> Result<Option<Pod>> {
    let client = cluster.client().await?;
    let Some(deployment) = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    let generation = deployment.metadata.generation.unwrap_or_default();
    let Some(spec) = deployment.spec.and_then(|s| s.template.spec) else {
        return Ok(None);
    };
    let container = spec.containers.first().cloned().unwrap_or_default();
    let mut mounts = Vec::new();
    for m in container.volume_mounts.unwrap_or_default() {
        let Some(volume) = spec.volumes.iter().flatten().find(|v| v.name == m.name) else {
            continue;
        };
        let source = match (&volume.secret, &volume.config_map, &volume.empty_dir) {
            (Some(s), _, _) => Source::Secret(
                s.secret_name.clone().unwrap_or_default(),
                s.optional == Some(true),
            ),
            (_, Some(c), _) => Source::ConfigMap(c.name.clone(), c.optional == Some(true)),
            (_, _, Some(_)) => Source::EmptyDir,
            _ => continue,
        };
        mounts.push(Mount {
            path: m.mount_path.trim_end_matches('/').to_string(),
            dir: dir.join("volumes").join(&m.name),
            source,
        });
    }
    let mut pod = Pod {
        args: Vec::new(),
        env: Vec::new(),
        kubeconfig: dir.join("kubeconfig"),
        generation,
        mounts,
    };
    if !refresh(cluster, namespace, &pod).await? {
        return Ok(None);
    }
    let rewrite = |s: &str| {
        let mut out = s.to_string();
        for m in &pod.mounts {
            out = out.replace(&format!("{}/", m.path), &format!("{}/", m.dir.display()));
        }
        out
    };
    pod.args = container
        .args
        .unwrap_or_default()
        .iter()
        .map(|a| rewrite(a))
        .collect();
    // Literal values, and the two downward-API fields a controller reads
    // (its pod's name and namespace, for leader election).
    let pod_name = format!("{name}-kubelet");
    pod.env = container
        .env
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| {
            let field = e
                .value_from
                .as_ref()
                .and_then(|f| f.field_ref.as_ref())
                .map(|f| f.field_path.as_str());
            let value = match (e.value, field) {
                (Some(v), _) => rewrite(&v),
                (None, Some("metadata.name")) => pod_name.clone(),
                (None, Some("metadata.namespace")) => namespace.to_string(),
                _ => return None,
            };
            Some((e.name, value))
        })
        .collect();
    let sa = spec
        .service_account_name
        .unwrap_or_else(|| "default".into());
    if Api::<ServiceAccount>::namespaced(client, namespace)
        .get_opt(&sa)
        .await?
        .is_none()
    {
        return Ok(None);
    }
    cluster
        .write_kubeconfig_for_service_account(namespace, &sa, &pod.kubeconfig)
        .await?;
    Ok(Some(pod))
}

/// Writes the current contents of the pod's Secret and ConfigMap volumes
/// into their folders (only files that changed); `false` while one of them
/// that is not `optional` does not exist.
pub async fn refresh(cluster: &Cluster, namespace: &str, pod: &Pod) -> Result<bool> {
    let client = cluster.client().await?;
    for m in &pod.mounts {
        let files: BTreeMap<String, Vec<u8>> = match &m.source {
            Source::EmptyDir => {
                std::fs::create_dir_all(&m.dir)?;
                continue;
            }
            Source::Secret(name, optional) => {
                match Api::<Secret>::namespaced(client.clone(), namespace)
                    .get_opt(name)
                    .await?
                {
                    Some(s) => s
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect(),
                    None if *optional => BTreeMap::new(),
                    None => return Ok(false),
                }
            }
            Source::ConfigMap(name, optional) => {
                match Api::<ConfigMap>::namespaced(client.clone(), namespace)
                    .get_opt(name)
                    .await?
                {
                    Some(c) => c
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect(),
                    None if *optional => BTreeMap::new(),
                    None => return Ok(false),
                }
            }
        };
        std::fs::create_dir_all(&m.dir)?;
        if matches!(m.source, Source::Secret(..)) {
            // As the kubelet does: every file of the Secret changes at once
            // (a certificate never pairs with the previous key), and each
            // is readable by its owner only.
            let unchanged = files
                .iter()
                .all(|(key, content)| std::fs::read(m.dir.join(key)).is_ok_and(|c| &c == content));
            if !unchanged {
                crate::pki::write_files_atomically(&m.dir, &files)?;
            }
            continue;
        }
        for (key, content) in files {
            let path = m.dir.join(&key);
            if std::fs::read(&path).is_ok_and(|c| c == content) {
                continue;
            }
            let tmp = m.dir.join(format!(".{key}.tmp"));
            std::fs::write(&tmp, &content)?;
            std::fs::rename(&tmp, &path)?;
        }
    }
    Ok(true)
}

/// Writes what the kubelet would onto the Deployment's newest pod (created
/// by the cluster's real deployment and replica-set controllers): running,
/// and ready or not. The controllers then count them into the Deployment's
/// status, which is what OCM's health check reads. `false` while the
/// Deployment has no pod yet.
pub async fn set_ready(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    ready: bool,
) -> Result<bool> {
    let client = cluster.client().await?;
    let Some(deployment) = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(false);
    };
    let selector = deployment
        .spec
        .and_then(|s| s.selector.match_labels)
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<PodObject> = Api::namespaced(client, namespace);
    let list = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    let status = if ready { "True" } else { "False" };
    // One process runs here, so one pod is shown running: the newest (of
    // the newest ReplicaSet during a rollout). Other replicas stay pending.
    let newest = list.items.iter().max_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
    if let Some(pod) = newest {
        // The containers too, so that `kubectl get pods` shows them ready.
        let containers: Vec<_> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| {
                json!({
                    "name": c.name,
                    "image": c.image.clone().unwrap_or_default(),
                    "imageID": "",
                    "ready": ready,
                    "started": true,
                    "restartCount": 0,
                    "state": { "running": {} },
                })
            })
            .collect();
        let patch = json!({ "status": {
            "phase": "Running",
            "conditions": [
                { "type": "PodScheduled", "status": "True" },
                { "type": "Initialized", "status": "True" },
                { "type": "ContainersReady", "status": status },
                { "type": "Ready", "status": status },
            ],
            "containerStatuses": containers,
        }});
        pods.patch_status(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await?;
    }
    Ok(!list.items.is_empty())
}

/// What a [`Runner`] last saw of its pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// The Deployment exists and its process runs.
    pub running: bool,
    /// The process answers its readiness probe (`/readyz` on its admin
    /// address) with 200.
    pub ready: bool,
    /// How often the process exited and was started again.
    pub restarts: u32,
}

/// Runs one Deployment's pod as a local process, as the kubelet would run
/// its container: from the command line, files and service account
/// [`materialize`] prepares, with `overrides` in place of what only works
/// inside a pod (listen addresses, say) and the admin address (where
/// `/readyz` is probed) on a free loopback port. Call [`Runner::tick`]
/// periodically: it starts the process once the Deployment and everything
/// it mounts exist, restarts it when it exits (with a back-off, its
/// previous log kept as `<name>.previous.log`) or when the pod template
/// changes, stops it when the Deployment goes, copies rotated Secrets into
/// its files, and writes its readiness onto the Deployment's pods. The
/// process is killed when the runner is dropped, or by the reaper when the
/// whole process dies.
pub struct Runner {
    namespace: String,
    deployment: String,
    process: &'static str,
    binary: PathBuf,
    overrides: Vec<(&'static str, String)>,
    dir: PathBuf,
    group: crate::process::Group,
    current: Option<Current>,
    restarts: u32,
}

struct Current {
    generation: i64,
    pod: Pod,
    admin: std::net::SocketAddr,
    started: std::time::Instant,
    ready: Option<bool>,
}

/// How long an exited process waits before it is started again.
const RESTART_BACKOFF: std::time::Duration = std::time::Duration::from_secs(2);

impl Runner {
    /// A runner for Deployment `namespace/deployment`, running `binary` as
    /// process `process` (its log: `<dir>/<process>.log`).
    pub fn new(
        namespace: &str,
        deployment: &str,
        process: &'static str,
        binary: PathBuf,
        overrides: Vec<(&'static str, String)>,
        dir: PathBuf,
    ) -> Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let keep = std::env::var_os("ARGOCD_PULL_KEEP_DATA").is_some();
        let group = crate::process::Group::new(dir.join("process"), keep)?;
        std::fs::create_dir_all(dir.join("process"))?;
        Ok(Self {
            namespace: namespace.to_string(),
            deployment: deployment.to_string(),
            process,
            binary,
            overrides,
            dir,
            group,
            current: None,
            restarts: 0,
        })
    }

    /// The log of the running (or last) process.
    pub fn log(&self) -> PathBuf {
        self.dir
            .join("process")
            .join(format!("{}.log", self.process))
    }

    /// The admin address (`/readyz`, `/metrics`) of the running process.
    pub fn admin(&self) -> Option<std::net::SocketAddr> {
        self.current.as_ref().map(|c| c.admin)
    }

    /// One round of the kubelet's work; see [`Runner`].
    pub async fn tick(&mut self, cluster: &Cluster) -> Result<Status> {
        let client = cluster.client().await?;
        let generation = Api::<Deployment>::namespaced(client, &self.namespace)
            .get_opt(&self.deployment)
            .await?
            .map(|d| d.metadata.generation.unwrap_or_default());
        // Deleted or rolled out: the old pod goes.
        if self
            .current
            .as_ref()
            .is_some_and(|c| Some(c.generation) != generation)
        {
            self.group.stop(self.process);
            self.current = None;
        }
        let Some(generation) = generation else {
            return Ok(Status {
                restarts: self.restarts,
                ..Status::default()
            });
        };
        if self.current.is_none() {
            let pod_dir = self.dir.join("pod");
            let Some(pod) =
                materialize(cluster, &self.namespace, &self.deployment, &pod_dir).await?
            else {
                return Ok(Status {
                    restarts: self.restarts,
                    ..Status::default()
                });
            };
            let admin = crate::net::free_addr()?;
            self.spawn(&pod, admin)?;
            self.current = Some(Current {
                generation,
                pod,
                admin,
                started: std::time::Instant::now(),
                ready: None,
            });
        }
        let started = self.current.as_ref().expect("started above").started;
        if self.group.exited(Some(self.process)).is_some() && started.elapsed() > RESTART_BACKOFF {
            let log = self.log();
            let _ = std::fs::rename(&log, log.with_extension("previous.log"));
            self.group.stop(self.process);
            let current = self.current.as_ref().expect("started above");
            let (pod, admin) = (current.pod.clone(), current.admin);
            self.spawn(&pod, admin)?;
            self.restarts += 1;
            let current = self.current.as_mut().expect("still there");
            current.started = std::time::Instant::now();
        }
        let current = self.current.as_mut().expect("still there");
        // Rotated Secrets reach the pod's files, as the kubelet syncs them.
        refresh(cluster, &self.namespace, &current.pod).await?;
        let ready = matches!(
            crate::net::http_get(current.admin, "/readyz").await,
            Ok((200, _))
        );
        if current.ready != Some(ready)
            && set_ready(cluster, &self.namespace, &self.deployment, ready).await?
        {
            current.ready = Some(ready);
        }
        Ok(Status {
            running: self.group.exited(Some(self.process)).is_none(),
            ready,
            restarts: self.restarts,
        })
    }

    fn spawn(&mut self, pod: &Pod, admin: std::net::SocketAddr) -> Result<()> {
        let mut overrides = self.overrides.clone();
        overrides.push(("--admin-addr", admin.to_string()));
        overrides.push(("--kubeconfig", pod.kubeconfig.display().to_string()));
        let mut cmd = std::process::Command::new(&self.binary);
        cmd.args(pod.args_with(&overrides))
            .envs(pod.env.iter().map(|(k, v)| (k, v)));
        self.group.spawn(self.process, cmd)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_the_deployments_own_flags() {
        let pod = Pod {
            args: vec![
                "--grpc-addr=0.0.0.0:8443".into(),
                "--grpc-manage-certificates".into(),
                "--log-format=json".into(),
            ],
            env: Vec::new(),
            kubeconfig: PathBuf::from("/k"),
            generation: 1,
            mounts: Vec::new(),
        };
        assert_eq!(
            pod.args_with(&[
                ("--grpc-addr", "127.0.0.1:1".into()),
                ("--admin-addr", "127.0.0.1:2".into())
            ]),
            [
                "--grpc-manage-certificates",
                "--log-format=json",
                "--grpc-addr=127.0.0.1:1",
                "--admin-addr=127.0.0.1:2",
            ]
        );
    }
}
