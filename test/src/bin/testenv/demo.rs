//! `testenv demo` (what `make demo` runs) and `testenv status`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use testenv::stack::{self, Stack, StackOptions};

/// Namespace of Argo CD, and of the example's Applications, everywhere.
const NAMESPACE: &str = "argocd";

pub async fn run(dir: PathBuf, git_port: u16, timeout: Duration) -> Result<()> {
    let pid_file = super::claim(&dir)?;
    let started = Instant::now();
    let progress = |step: &str| println!("==> [{:>4}s] {step}", started.elapsed().as_secs());
    let stack = Stack::start(
        StackOptions {
            git_port: Some(git_port),
            // cluster2's ManifestWorks bring its managed resources back, so
            // the hub UI draws its tree too.
            raw_feedback: true,
            ..StackOptions::default()
        },
        &progress,
    )
    .await
    .context("starting the demo")?;

    // Kubeconfigs where the user can find them.
    let mut kubeconfigs = vec![(
        stack.hub().name().to_string(),
        kubeconfig(&dir, stack.hub())?,
    )];
    for c in stack.clusters() {
        kubeconfigs.push((c.name().to_string(), kubeconfig(&dir, c)?));
    }

    let example = testenv::paths::workspace_dir().join("example");
    progress(
        "choosing the clusters:  kubectl apply -f example/placement.yaml -f example/generator-configmap.yaml",
    );
    stack.apply(&example.join("placement.yaml")).await?;
    stack
        .apply(&example.join("generator-configmap.yaml"))
        .await?;
    stack
        .wait_placement(NAMESPACE, "guestbook", stack.clusters().len())
        .await?;
    progress("deploying the guestbook to them:  kubectl apply -f example/applicationset.yaml");
    stack.apply(&example.join("applicationset.yaml")).await?;
    progress(
        "OCM's placement picks the clusters, Argo CD's ApplicationSet makes one Application per cluster, argocd-pull delivers each, the cluster's Argo CD syncs it, the status comes back:",
    );
    let expected = stack.clusters().len();
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let rows = stack.applications(NAMESPACE).await.unwrap_or_default();
        let table = stack::render_table(&rows);
        if table != last {
            println!("\n[{:>4}s]\n{table}", started.elapsed().as_secs());
            last = table;
        }
        if rows.len() == expected && rows.iter().all(stack::AppRow::converged) {
            break;
        }
        if Instant::now() > deadline {
            println!("\n{}", stack.log_tails(30));
            bail!(
                "the example did not converge within {timeout:?}; logs above, and in {}",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // argocd-pull's own pods, from the built images, on each cluster's node.
    for (cluster, _) in stack.cluster_nodes() {
        let namespace = if cluster.name() == stack::HUB {
            stack::HUB_NAMESPACE
        } else {
            stack::AGENT_NAMESPACE
        };
        println!(
            "\n$ kubectl --kubeconfig {}.kubeconfig -n {namespace} get pods -o wide\n{}",
            cluster.name(),
            stack::kubectl(cluster, &["-n", namespace, "get", "pods", "-o", "wide"])
                .await?
                .trim_end()
        );
    }
    // The fleet as `kubectl argocd-pull` shows it (the hub-controller's
    // admin port reached as `kubectl port-forward` would).
    let plugin = testenv::paths::own_binary("kubectl-argocd-pull")?;
    let hub_kubeconfig = &kubeconfigs[0].1;
    for args in [
        &["status"][..],
        &["apps"],
        &["explain", &format!("{NAMESPACE}/guestbook-cluster1")],
        &["certs"],
    ] {
        let out = std::process::Command::new(&plugin)
            .arg("--kubeconfig")
            .arg(hub_kubeconfig)
            .arg("--admin")
            .arg(format!("http://{}", stack.admin))
            .args(args)
            .output()?;
        println!(
            "\n$ kubectl argocd-pull --admin http://{} {}\n{}{}",
            stack.admin,
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim_end(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    // The hub's Argo CD shows the pulled Applications: its CLI, logged in
    // as the local admin with a configuration of its own in the demo folder.
    let cli = testenv::argocd::cli()?;
    let cli_config = dir.join("argocd-cli.config");
    let server = &stack.argocd_server;
    let login = std::process::Command::new(&cli)
        .args([
            "login",
            &server.addr().to_string(),
            "--plaintext",
            "--username",
            "admin",
        ])
        .args(["--password", server.admin_password()])
        .arg("--config")
        .arg(&cli_config)
        .output()?;
    if !login.status.success() {
        bail!(
            "argocd login against the hub's argocd-server failed: {}",
            String::from_utf8_lossy(&login.stderr)
        );
    }
    let c1 = format!("{NAMESPACE}/guestbook-cluster1");
    let c2 = format!("{NAMESPACE}/guestbook-cluster2");
    for args in [
        &["app", "list"][..],
        &["app", "get", &c1],
        // What cluster1's own Argo CD cached, as its agent reported it.
        &["app", "resources", &c1],
        &["app", "manifests", &c1, "--source", "live"],
        &["app", "diff", &c1],
        // Read on cluster1 when asked, through the hub's live endpoint and
        // cluster1's agent: a live manifest and a pod's logs.
        &[
            "app",
            "get-resource",
            &c1,
            "--kind",
            "ConfigMap",
            "--resource-name",
            "guestbook-ui",
        ],
        &[
            "app",
            "logs",
            &c1,
            "--group",
            "apps",
            "--kind",
            "Deployment",
            "--name",
            "guestbook-ticker",
            "--tail",
            "5",
        ],
        // cluster2's, from its ManifestWork's feedback; its tree has no
        // uids (the status it comes from is the hub copy's, which a tenant
        // may write), so argocd-server reads nothing live there.
        &["app", "resources", &c2],
        &[
            "app",
            "get-resource",
            &c2,
            "--kind",
            "ConfigMap",
            "--resource-name",
            "guestbook-ui",
        ],
    ] {
        let out = std::process::Command::new(&cli)
            .args(args)
            .arg("--config")
            .arg(&cli_config)
            .output()?;
        println!(
            "\n$ argocd {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim_end(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    let hints = hints(&dir, &kubeconfigs, &stack);
    println!("\n{hints}");
    std::fs::write(dir.join("ready"), &hints)?;

    super::shutdown_signal().await;
    println!("stopping the demo");
    drop(stack);
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(dir.join("ready"));
    for (_, path) in kubeconfigs {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Copies a cluster's admin kubeconfig to `<dir>/<name>.kubeconfig`.
fn kubeconfig(dir: &Path, cluster: &testenv::Cluster) -> Result<PathBuf> {
    let path = dir.join(format!("{}.kubeconfig", cluster.name()));
    std::fs::copy(cluster.kubeconfig(), &path)?;
    Ok(path)
}

fn hints(dir: &Path, kubeconfigs: &[(String, PathBuf)], stack: &Stack) -> String {
    let kubectl = testenv::paths::bin_dir().join("kubectl");
    let k = |name: &str| {
        let path = kubeconfigs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.display().to_string())
            .unwrap_or_default();
        format!("{} --kubeconfig {path}", kubectl.display())
    };
    let hub = k(stack::HUB);
    let n1 = stack
        .clusters()
        .first()
        .map(|c| c.name())
        .unwrap_or("cluster1");
    let n2 = stack
        .clusters()
        .get(1)
        .map(|c| c.name())
        .unwrap_or("cluster2");
    let (c1, c2) = (n1, n2);
    let k1 = k(n1);
    let plugin = testenv::paths::own_binary("kubectl-argocd-pull")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "kubectl-argocd-pull".into());
    let hub_kubeconfig = kubeconfigs
        .first()
        .map(|(_, p)| p.display().to_string())
        .unwrap_or_default();
    let admin = stack.admin;
    let ui = stack.argocd_server.url();
    let password = stack.argocd_server.admin_password();
    let argocd = format!(
        "{} --config {}",
        testenv::argocd::cli()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "argocd".into()),
        dir.join("argocd-cli.config").display()
    );
    // Where the UI could not be built, the CLI below shows the same.
    let ui_note = match testenv::paths::argocd_ui_not_built() {
        Some(why) => format!(
            "  (not on this machine: the UI was not built, because {why}; README, Prerequisites, says how to build it)\n"
        ),
        None => String::new(),
    };
    let logs: Vec<String> = stack
        .logs()
        .iter()
        .map(|(name, log)| format!("  {name}\n    {}", log.display()))
        .collect();
    format!(
        "The example converged: both clusters run the guestbook, and the hub shows their status.

Look around:
  {hub} -n argocd-pull get pods -o wide            # the hub-controller, from its image, on the hub's node
  {k1} -n argocd-pull-agent get pods -o wide      # the spoke-agent OCM deployed
  {hub} -n argocd get applicationsets,applications
  {hub} get managedclusters,managedclusteraddons -A
  {hub} -n {c2} get manifestworks          # {c2}'s Application travels in a ManifestWork
  {k1} -n argocd get applications -o wide
  {k1} -n guestbook get configmaps

Sync from the hub (the agent hands the operation to {c1}'s Argo CD; its result comes back):
  {hub} -n argocd patch application guestbook-{c1} --type merge -p '{{\"operation\":{{\"initiatedBy\":{{\"username\":\"demo\"}},\"sync\":{{}}}}}}'
  {hub} -n argocd get application guestbook-{c1} -o jsonpath='{{.status.operationState.phase}}{{\"\\n\"}}'
Refresh:
  {hub} -n argocd annotate application guestbook-{c2} argocd.argoproj.io/refresh=normal --overwrite
Break something on purpose (an Application for a cluster OCM does not know):
  {hub} apply -f example/mistakes/unknown-cluster.yaml
  {hub} -n argocd get application guestbook-nowhere -o jsonpath='{{.status.conditions}}{{\"\\n\"}}'
  {hub} -n argocd get events --field-selector involvedObject.name=guestbook-nowhere
  (the other Applications carry on; delete it with: {hub} delete -f example/mistakes/unknown-cluster.yaml)

The hub's Argo CD UI:  {ui}  (user admin, password {password})
{ui_note}  open {ui}/applications/argocd/guestbook-{c1} for {c1}'s Application: its sync and health as {c1} reported them
  (its tree, live states and diff are what {c1}'s Argo CD cached; a resource's LIVE MANIFEST, EVENTS and LOGS tabs are read on {c1} through its agent: docs/ui.md)
  open {ui}/applications/argocd/guestbook-{c1}?node=apps%2FDeployment%2Fguestbook%2Fguestbook-ticker%2F0&tab=logs for its ticker pod's logs
Its CLI, logged in as admin:
  {argocd} app list
  {argocd} app get argocd/guestbook-{c1}
  {argocd} app manifests argocd/guestbook-{c1} --source live
  {argocd} app diff argocd/guestbook-{c1}
  {argocd} app get-resource argocd/guestbook-{c1} --kind ConfigMap --resource-name guestbook-ui
  {argocd} app logs argocd/guestbook-{c1} --group apps --kind Deployment --name guestbook-ticker --follow

The fleet as the hub sees it (`make install-plugin` puts it on the PATH as `kubectl argocd-pull`):
  {plugin} --kubeconfig {hub_kubeconfig} --admin http://{admin} status
  {plugin} --kubeconfig {hub_kubeconfig} --admin http://{admin} explain argocd/guestbook-nowhere

The status table again:  make demo-status
Logs of argocd-pull's containers (or: kubectl logs -n argocd-pull deploy/argocd-pull-hub-controller):
{}
Everything else (API servers, OCM, Argo CD) logs under {}
Stop everything:  make demo-down  (or Ctrl-C while `make demo` runs)
",
        logs.join("\n"),
        dir.join("run").display(),
    )
}

/// `testenv status`: the table, from the kubeconfigs `testenv demo` left.
pub async fn status(dir: PathBuf, namespace: &str) -> Result<()> {
    let hub_kubeconfig = dir.join(format!("{}.kubeconfig", stack::HUB));
    if !hub_kubeconfig.is_file() {
        bail!(
            "no demo running in {} (start one with `make demo`)",
            dir.display()
        );
    }
    let hub = testenv::client_for(&hub_kubeconfig).await?;
    let mut clusters = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".kubeconfig"))
        else {
            continue;
        };
        if name != stack::HUB {
            clusters.push((name.to_string(), testenv::client_for(&path).await?));
        }
    }
    let rows = stack::applications(&hub, &clusters, namespace).await?;
    println!("{}", stack::render_table(&rows));
    Ok(())
}
