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
    secret: bool,
    name: String,
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
        let (secret, object) = match (&volume.secret, &volume.config_map) {
            (Some(s), _) => (true, s.secret_name.clone().unwrap_or_default()),
            (_, Some(c)) => (false, c.name.clone()),
            _ => continue,
        };
        mounts.push(Mount {
            path: m.mount_path.trim_end_matches('/').to_string(),
            dir: dir.join("volumes").join(&m.name),
            secret,
            name: object,
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
    pod.env = container
        .env
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.value.map(|v| (e.name, rewrite(&v))))
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
/// does not exist.
pub async fn refresh(cluster: &Cluster, namespace: &str, pod: &Pod) -> Result<bool> {
    let client = cluster.client().await?;
    for m in &pod.mounts {
        let files: BTreeMap<String, Vec<u8>> = if m.secret {
            match Api::<Secret>::namespaced(client.clone(), namespace)
                .get_opt(&m.name)
                .await?
            {
                Some(s) => s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect(),
                None => return Ok(false),
            }
        } else {
            match Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .get_opt(&m.name)
                .await?
            {
                Some(c) => c
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect(),
                None => return Ok(false),
            }
        };
        std::fs::create_dir_all(&m.dir)?;
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

/// Writes what the kubelet would onto the Deployment's pods (created by
/// the cluster's real deployment and replica-set controllers): running, and
/// ready or not. The controllers then count them into the Deployment's
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
    for pod in &list.items {
        let patch = json!({ "status": {
            "phase": "Running",
            "conditions": [
                { "type": "PodScheduled", "status": "True" },
                { "type": "Initialized", "status": "True" },
                { "type": "ContainersReady", "status": status },
                { "type": "Ready", "status": status },
            ],
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
