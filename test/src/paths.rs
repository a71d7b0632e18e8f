//! Where the harness finds what `test/tools/build.sh` built, and where it
//! keeps cluster data. Each can be moved with an environment variable.

use std::path::PathBuf;

/// `$ARGOCD_PULL_CACHE`, or `.cache/` at the top of the workspace.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("ARGOCD_PULL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("test/ sits inside the workspace")
                .join(".cache")
        })
}

/// The upstream binaries: etcd, kube-apiserver, kube-controller-manager,
/// kubectl, clusteradm.
pub fn bin_dir() -> PathBuf {
    cache_dir().join("bin")
}

/// OCM's components (`registration`, `work`, `placement`, `addon`).
pub fn ocm_bin_dir() -> PathBuf {
    bin_dir().join("ocm")
}

/// What else the harness takes from the OCM module (its bootstrap RBAC).
pub fn ocm_dir() -> PathBuf {
    cache_dir().join("ocm")
}

/// The upstream CRDs, in `hub/` and `managed/`.
pub fn crd_dir() -> PathBuf {
    cache_dir().join("crds")
}

/// Where throw-away clusters keep their data (`$ARGOCD_PULL_RUN_DIR`, or
/// `<cache>/run`).
pub fn run_dir() -> PathBuf {
    std::env::var_os("ARGOCD_PULL_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("run"))
}

/// One of argocd-pull's own binaries (`hub-controller`, `spoke-agent`,
/// `kubectl-argocd-pull`) as
/// Cargo built it: in `$ARGOCD_PULL_BIN_DIR`, or the workspace's
/// `$CARGO_TARGET_DIR`/`target` `debug/` folder. `cargo test --workspace`
/// builds a package's binaries only when that package has integration tests
/// (hub-controller, spoke-agent and the plugin each do); `make demo` builds
/// them explicitly.
pub fn own_binary(name: &str) -> crate::Result<PathBuf> {
    let dir = std::env::var_os("ARGOCD_PULL_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_dir().join("target"))
                .join("debug")
        });
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(crate::Error::MissingBinary(path))
    }
}

/// One of the previous release's binaries (`hub-controller`,
/// `spoke-agent`), which `test/tools/build.sh` builds from this
/// repository's history (`PREVIOUS_RELEASE_COMMIT` in `versions.env`) for
/// the upgrade test.
pub fn previous_binary(name: &str) -> crate::Result<PathBuf> {
    let path = cache_dir().join("previous").join("bin").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(crate::Error::MissingTool(path))
    }
}

/// The previous release's version (`PREVIOUS_RELEASE` in
/// `test/tools/versions.env`), as its binaries report it.
pub fn previous_release() -> String {
    pin("PREVIOUS_RELEASE")
}

/// The commit the previous release was built from
/// (`PREVIOUS_RELEASE_COMMIT` in `test/tools/versions.env`).
pub fn previous_release_commit() -> String {
    pin("PREVIOUS_RELEASE_COMMIT")
}

/// A pin of `test/tools/versions.env`.
fn pin(key: &str) -> String {
    let pins = std::fs::read_to_string(workspace_dir().join("test/tools/versions.env"))
        .expect("test/tools/versions.env is readable");
    pins.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("versions.env pins {key}"))
        .trim()
        .to_string()
}

/// The top of the workspace (where `deploy/` and `example/` are).
pub fn workspace_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test/ sits inside the workspace")
        .to_path_buf()
}

/// Why Argo CD's web UI was not built on this machine (`test/tools/build.sh`
/// writes it when the pinned argo-ui commit is nowhere to be had), or
/// `None` when argocd-server embeds the real UI.
pub fn argocd_ui_not_built() -> Option<String> {
    std::fs::read_to_string(cache_dir().join("argocd-ui").join("NOT-BUILT"))
        .ok()
        .map(|why| why.trim().to_string())
}

/// Says that `what` did not run, and why: on standard error, and as a line
/// of the file `$ARGOCD_PULL_NOT_RUN` names, which `test/tools/run-tests.sh`
/// prints in its summary (libtest shows a passing test's output only when
/// asked, so a line on standard error alone would go unseen).
pub fn not_run(what: &str, why: &str) {
    let line = format!("NOT RUN: {what}: {why}");
    eprintln!("{line}");
    if let Some(file) = std::env::var_os("ARGOCD_PULL_NOT_RUN") {
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            eprintln!("could not write to {}: {e}", file.to_string_lossy());
        }
    }
}
