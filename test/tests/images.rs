//! The container images `make images` builds: what they carry, how they
//! are tagged, and that each really runs under runc the way the
//! Deployments ask (read-only root, no capabilities, a non-root user). The
//! images here come from the tests' own debug binaries; `make images`
//! builds the same from release binaries with the same script.

use std::process::Command;

use testenv::images::{self, Image};
use testenv::paths::workspace_dir;

const VERSION: &str = env!("CARGO_PKG_VERSION");

async fn images() -> &'static [Image] {
    images::shared().await.expect("the images build")
}

fn commit() -> String {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(workspace_dir())
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn each_image_is_tagged_with_the_version_and_the_commit() {
    for image in images().await {
        assert!(
            image.repository == "argocd-pull-hub-controller"
                || image.repository == "argocd-pull-spoke-agent"
        );
        assert_eq!(image.references[0], image.version_reference());
        let exact = &image.references[1];
        assert!(
            exact.starts_with(&format!("{}:{VERSION}-{}", image.repository, commit())),
            "{exact} names the commit"
        );
        let labels = &image.config["config"]["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], VERSION);
        assert!(
            labels["org.opencontainers.image.revision"]
                .as_str()
                .unwrap()
                .starts_with(&commit())
        );
    }
}

#[tokio::test]
async fn each_image_holds_its_binary_and_no_shell_and_runs_as_a_numeric_non_root_user() {
    for image in images().await {
        let name = image.repository.trim_start_matches("argocd-pull-");
        let c = &image.config["config"];
        // Numeric, so that the kubelet can check runAsNonRoot against it.
        assert_eq!(c["User"], "65532:65532");
        assert_eq!(c["Entrypoint"][0], format!("/usr/local/bin/{name}"));
        let rootfs = tempfile::tempdir().unwrap();
        image.unpack(rootfs.path()).unwrap();
        let root = rootfs.path();
        assert!(root.join("usr/local/bin").join(name).is_file());
        assert!(root.join("etc/ssl/certs/ca-certificates.crt").is_file());
        for shell in ["bin/sh", "bin/bash", "usr/bin/sh", "bin/busybox"] {
            assert!(
                !root.join(shell).exists(),
                "{shell} in {}",
                image.repository
            );
        }
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("nonroot:x:65532:65532:"));
    }
}

#[tokio::test]
async fn each_image_runs_under_runc_with_a_read_only_root() {
    for image in images().await {
        let name = image.repository.trim_start_matches("argocd-pull-");
        let out = image.run(&["--version"]).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim() == format!("{name} {VERSION}"),
            "{name} --version in its image: {out:?}"
        );
        let out = image.run(&["--help"]).unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Usage:"),
            "{name} --help in its image: {out:?}"
        );
    }
    // The hub-controller gets as far as looking for its cluster: the
    // libraries, the user and the read-only root are enough to start.
    let hub = images()
        .await
        .iter()
        .find(|i| i.repository == "argocd-pull-hub-controller")
        .unwrap();
    let out = hub
        .run(&["--kubeconfig=/nonexistent", "--leader-elect=false"])
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/nonexistent"),
        "{out:?}"
    );
}

#[test]
fn the_deployments_name_the_images_by_version_and_lock_them_down() {
    let hub = std::fs::read_to_string(workspace_dir().join("deploy/hub/deployment.yaml")).unwrap();
    assert!(hub.contains(&format!("image: argocd-pull-hub-controller:{VERSION}\n")));
    let addon = std::fs::read_to_string(workspace_dir().join("deploy/hub/addon.yaml")).unwrap();
    assert!(addon.contains(&format!("value: argocd-pull-spoke-agent:{VERSION}\n")));
    for text in [&hub, &addon] {
        assert!(text.contains("readOnlyRootFilesystem: true"));
        assert!(text.contains("runAsNonRoot: true"));
    }
}
