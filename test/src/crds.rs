//! Installs the upstream CRDs that `test/tools/build.sh` collected from the
//! pinned OCM and Argo CD modules, and waits until they are served.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;

use crate::{Error, Result, paths};

/// Which set of CRDs a cluster gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrdSet {
    /// None: a bare API server.
    None,
    /// What an OCM hub serves (ManagedCluster, ManifestWork, Placement,
    /// addons, ...) plus Argo CD's Application, AppProject and ApplicationSet.
    Hub,
    /// What a klusterlet installs on a managed cluster, plus Argo CD's.
    Managed,
}

impl CrdSet {
    fn folder(self) -> Option<PathBuf> {
        match self {
            CrdSet::None => None,
            CrdSet::Hub => Some(paths::crd_dir().join("hub")),
            CrdSet::Managed => Some(paths::crd_dir().join("managed")),
        }
    }
}

/// Reads every CRD of a set from disk.
fn load(set: CrdSet) -> Result<Vec<CustomResourceDefinition>> {
    let Some(dir) = set.folder() else {
        return Ok(Vec::new());
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|_| Error::MissingTool(dir.clone()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc)?;
            if value.is_null() {
                continue;
            }
            crds.push(serde_yaml::from_value(value)?);
        }
    }
    Ok(crds)
}

/// Applies the CRDs of `set` and waits until every one is Established.
pub async fn install(client: &kube::Client, set: CrdSet) -> Result<()> {
    let crds = load(set)?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("argocd-pull-testenv").force();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(crd)).await?;
    }
    // Generous: on a 2-core machine busy compiling, a fresh API server took
    // over 30 s to establish the hub's CRDs (a CI run failed
    // `CrdNotEstablished("applicationsets.argoproj.io")` that way). This
    // waits for a positive signal; the deadline only bounds a hang.
    let deadline = Instant::now() + Duration::from_secs(120);
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let got = api.get(&name).await?;
            let established = got
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::CrdNotEstablished(name));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
