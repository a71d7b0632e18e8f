//! `kubectl argocd-pull` against the stack, as an operator runs it: the
//! hub's kubeconfig, and the hub-controller's admin port as `kubectl
//! port-forward` gives it (`--admin`).

use std::process::Output;

use serde_json::Value;
use testenv::paths;
use testenv::stack::Stack;

fn plugin(stack: &Stack, admin: bool, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(paths::own_binary("kubectl-argocd-pull").unwrap());
    cmd.arg("--kubeconfig").arg(stack.hub().kubeconfig());
    if admin {
        cmd.arg("--admin").arg(format!("http://{}", stack.admin));
    }
    cmd.args(args).output().unwrap()
}

/// Runs a command that must succeed; prints its table (what the docs and
/// the closing note show) and returns its `-o json` output.
fn shown(stack: &Stack, args: &[&str]) -> Value {
    let table = plugin(stack, true, args);
    assert!(
        table.status.success(),
        "kubectl argocd-pull {args:?}: {}",
        String::from_utf8_lossy(&table.stderr)
    );
    eprintln!(
        "$ kubectl argocd-pull {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&table.stdout)
    );
    let json = plugin(stack, true, &[args, &["-o", "json"]].concat());
    assert!(json.status.success());
    serde_json::from_slice(&json.stdout).unwrap()
}

fn find<'a>(rows: &'a Value, key: &str, value: &str) -> &'a Value {
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r[key] == value)
        .unwrap_or_else(|| panic!("no row with {key}={value}: {rows:#}"))
}

/// With cluster1 on gRPC, cluster2 on ManifestWorks, both converged, and
/// guestbook-nowhere refused (UnknownCluster).
pub async fn shows_the_fleet(stack: &Stack) {
    // OCM's Available comes with its next health check, a few seconds
    // after the agents connected.
    super::support::eventually(stack, "both agents and addons in the status", || async {
        let out = plugin(stack, true, &["status", "-o", "json"]);
        let rows: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        let all = ["cluster1", "cluster2"].iter().all(|c| {
            rows.as_array()
                .into_iter()
                .flatten()
                .any(|r| r["cluster"] == *c && r["addonAvailable"] == true && !r["agent"].is_null())
        });
        if all {
            Ok(())
        } else {
            Err(format!("{rows} {}", String::from_utf8_lossy(&out.stderr)))
        }
    })
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;

    let agents = shown(stack, &["status"]);
    for cluster in ["cluster1", "cluster2"] {
        let row = find(&agents, "cluster", cluster);
        assert_eq!(row["addonAvailable"], true, "{row}");
        assert!(
            row["replica"]
                .as_str()
                .unwrap()
                .starts_with("argocd-pull-hub-controller-"),
            "the pod's name: {row}"
        );
        let agent = &row["agent"];
        assert_eq!(agent["mode"], "managed", "{row}");
        assert_eq!(agent["version"], env!("CARGO_PKG_VERSION"), "{row}");
        assert!(
            agent["certificateNotAfter"].as_i64().unwrap() > now,
            "{row}"
        );
        assert!(agent["connectedSince"].as_i64().unwrap() <= now, "{row}");
        assert_eq!(
            agent["certificateFingerprint"].as_str().unwrap().len(),
            64,
            "{row}"
        );
    }

    let apps = shown(stack, &["apps", "-n", "argocd"]);
    let app = |name: &str| find(&apps, "name", name).clone();
    let one = app("guestbook-cluster1");
    assert_eq!(
        (&one["cluster"], &one["transport"], &one["routed"]),
        (&"cluster1".into(), &"grpc".into(), &true.into())
    );
    assert_eq!(
        (&one["sync"], &one["health"]),
        (&"Synced".into(), &"Healthy".into())
    );
    let two = app("guestbook-cluster2");
    assert_eq!(two["transport"], "manifestwork");
    let nowhere = app("guestbook-nowhere");
    assert_eq!(nowhere["routed"], false);
    assert!(
        nowhere["condition"]
            .as_str()
            .unwrap()
            .starts_with("UnknownCluster:"),
        "{nowhere}"
    );

    // `explain` of `name` says whether it is delivered, and why in words.
    let explains = |name: &str, delivered: bool, says: &str| {
        let e = shown(stack, &["explain", &format!("argocd/{name}")]);
        assert_eq!(e["delivered"], delivered, "{e}");
        assert!(e.to_string().contains(says), "{e}");
    };
    explains(
        "guestbook-cluster1",
        true,
        "connected to replica argocd-pull-hub-controller-",
    );
    explains(
        "guestbook-cluster2",
        true,
        "ManifestWork cluster2/argocd.guestbook-cluster2 is applied",
    );
    explains("guestbook-nowhere", false, "UnknownCluster");

    let certs = shown(stack, &["certs"]);
    for name in [
        "agents' signing CA",
        "serving CA",
        "gRPC serving certificate",
    ] {
        let c = &find(&certs, "name", name)["certificate"];
        let (after, renew) = (c["notAfter"].as_i64(), c["renewAt"].as_i64());
        assert!(
            after.unwrap() > now && renew.unwrap() < after.unwrap(),
            "{name}: {c}"
        );
    }

    // Without --admin the reports go through the API server's pod proxy,
    // which cannot reach this harness's pods: the plugin says so and what
    // to do, and shows what the hub API has.
    let out = plugin(stack, false, &["status"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: no report from argocd-pull-hub-controller-")
            && err.contains("port-forward"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("not connected"));

    // Bad input: a clear message and a failing exit status.
    for (args, says) in [
        (&["explain", "guestbook"][..], "is not NAMESPACE/NAME"),
        (
            &["explain", "argocd/no-such-app"][..],
            "does not exist on the hub",
        ),
    ] {
        let out = plugin(stack, true, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    let out = plugin(stack, false, &["--admin", "127.0.0.1:1", "status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("give an http:// URL"), "{err}");
}

/// `revoke cluster1`: the certificate its agent is connected with goes on
/// the hub's deny list, and the hub ends the agent's stream. Last: cluster1
/// stays cut off (OCM renews the certificate only daily).
pub async fn revoke_cuts_cluster1_off(stack: &Stack) {
    // Once (a second run may find the agent gone already).
    let out = plugin(
        stack,
        true,
        &["revoke", "cluster1", "--note", "e2e: revoked", "-o", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let revoked: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("$ kubectl argocd-pull revoke cluster1 -o json\n{revoked:#}");
    let fingerprint = revoked[0]["certificateFingerprint"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(fingerprint.len(), 64, "{revoked}");
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(stack.hub().client().await.unwrap(), "argocd-pull");
    let listed = cms
        .get("argocd-pull-denied-certificates")
        .await
        .unwrap()
        .data
        .unwrap_or_default();
    assert_eq!(
        listed.get(&fingerprint).map(String::as_str),
        Some("e2e: revoked")
    );
    super::support::eventually(stack, "cluster1's agent cut off", || async {
        let out = plugin(stack, true, &["status", "-o", "json"]);
        let rows: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        let one = find(&rows, "cluster", "cluster1");
        let two = find(&rows, "cluster", "cluster2");
        if one["agent"].is_null() && !two["agent"].is_null() {
            Ok(())
        } else {
            Err(rows.to_string())
        }
    })
    .await;
    // Nothing to deny for a cluster without a connected agent: it says what
    // to do instead.
    let out = plugin(stack, true, &["revoke", "cluster1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("clusteradm addon disable"),
        "{err}"
    );
}
