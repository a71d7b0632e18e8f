//! The plugin as a user runs it, on input it must refuse with a message that
//! says what to fix. (The plugin against a real hub is in the end-to-end
//! test, `test/tests/e2e/plugin.rs`, which runs this same binary.)

use std::process::{Command, Output};

fn plugin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-argocd-pull"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("the plugin runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A kubeconfig whose server is a loopback port nothing listens on.
fn kubeconfig(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: hub\n\
         clusters: [{name: hub, cluster: {server: 'http://127.0.0.1:1'}}]\n\
         contexts: [{name: hub, context: {cluster: hub, user: u}}]\n\
         users: [{name: u, user: {}}]\n",
    )
    .unwrap();
    path
}

#[test]
fn prints_its_version() {
    let out = plugin(&["--version"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("kubectl argocd-pull {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_missing_kubeconfig_is_named() {
    let out = plugin(&["--kubeconfig", "/nonexistent/kubeconfig", "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot read kubeconfig /nonexistent/kubeconfig"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn explain_wants_namespace_and_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path());
    for bad in ["guestbook", "/guestbook", "argocd/"] {
        let out = plugin(&["--kubeconfig", config.to_str().unwrap(), "explain", bad]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(
            stderr(&out).contains("is not NAMESPACE/NAME, e.g. argocd/guestbook"),
            "{bad}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn an_unreachable_hub_is_an_error_not_an_empty_table() {
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path());
    let out = plugin(&["--kubeconfig", config.to_str().unwrap(), "apps"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr(&out).starts_with("error: "), "{}", stderr(&out));
}
