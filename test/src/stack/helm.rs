//! argocd-pull on the hub from its Helm chart, as a platform team installs,
//! upgrades and rolls it back: one values file kept for the hub, `helm
//! install` of the previous release's chart (from this repository's
//! history, with the previous release's images on the nodes), then `helm
//! upgrade` to this build's chart (`deploy/helm/argocd-pull`) and `helm
//! rollback`.

use std::path::{Path, PathBuf};

use crate::{Cluster, Error, Result, paths};

use super::pods::HUB_GRPC;

/// The Helm release's name (and the namespace of its record, as
/// docs/install.md installs it).
pub const RELEASE: &str = "argocd-pull";
pub const RECORD_NAMESPACE: &str = "default";

/// The chart of this build.
pub fn chart() -> PathBuf {
    paths::workspace_dir().join("deploy/helm/argocd-pull")
}

/// The previous release's chart (`PREVIOUS_RELEASE_COMMIT`), taken from
/// this repository's history into `dir`.
pub fn previous_chart(dir: &Path) -> Result<PathBuf> {
    let commit = paths::previous_release_commit();
    let out = dir.join("previous-chart");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let archive = std::process::Command::new("git")
        .arg("-C")
        .arg(paths::workspace_dir())
        .args([
            "archive",
            "--format=tar",
            &commit,
            "deploy/helm/argocd-pull",
        ])
        .output()?;
    if !archive.status.success() {
        return Err(Error::Command {
            command: format!("git archive {commit} deploy/helm/argocd-pull"),
            output: String::from_utf8_lossy(&archive.stderr).into_owned(),
        });
    }
    let mut untar = std::process::Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&out)
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        untar
            .stdin
            .take()
            .expect("a piped stdin")
            .write_all(&archive.stdout)?;
    }
    if !untar.wait()?.success() {
        return Err(Error::Command {
            command: "tar -x (the previous release's chart)".into(),
            output: String::new(),
        });
    }
    Ok(out.join("deploy/helm/argocd-pull"))
}

/// The values a platform team keeps for this hub, written into `dir`: one
/// replica (two cores here), and [`HUB_GRPC`] as the address the agents
/// dial and in the gRPC certificate. Both releases' charts take them.
pub fn values(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = values_path(dir);
    std::fs::write(
        &path,
        format!(
            r#"hubController:
  replicas: 1
grpc:
  address: https://{HUB_GRPC}
  sans:
    - argocd-pull-grpc.argocd-pull.svc
    - {}
"#,
            HUB_GRPC.ip()
        ),
    )?;
    Ok(path)
}

/// Where [`values`] writes the values file in `dir`.
pub fn values_path(dir: &Path) -> PathBuf {
    dir.join("values.yaml")
}

/// Runs the built `helm` against `hub` with `args` (the release's record
/// in [`RECORD_NAMESPACE`]), its own configuration under the hub's folder;
/// its standard output.
pub async fn helm(hub: &Cluster, args: &[&str]) -> Result<String> {
    let home = hub.dir().join("helm");
    let args: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--namespace", RECORD_NAMESPACE])
        .collect();
    super::tool_with(
        &paths::bin_dir().join("helm"),
        hub,
        &args,
        &[
            ("HELM_CACHE_HOME", home.join("cache")),
            ("HELM_CONFIG_HOME", home.join("config")),
            ("HELM_DATA_HOME", home.join("data")),
        ],
    )
    .await
}
