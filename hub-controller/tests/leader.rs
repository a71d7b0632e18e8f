//! The leader's share on a real hub API server. A replica that loses the
//! leader Lease steps down without exiting: it keeps serving its agent
//! over gRPC, stops the ManifestWork transport, and leads again once the
//! Lease is free (the test takes the Lease over as another replica
//! would). The leader deletes a cluster's claim that no live replica has
//! held for `--grpc-abandoned-claim-after`, and no other. A replica cut
//! off from the API server stops writing, keeps its agent, and once it
//! reaches the API server again reads its claims back (one list) and
//! writes again.

mod common;
mod grpc_env;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::LEASE_NAME;
use argocd_pull_hub_controller::render::work::work_name;
use argocd_pull_hub_controller::transport::grpc::claims::{CLUSTER_ANNOTATION, ROLE_LABEL};
use argocd_pull_spoke_agent::Mode;
use grpc_env::{Env, TIMEOUT};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use testenv::wait;

const NS: &str = "argocd-pull";

/// Writes the leader Lease as held by `holder`, renewed now; retried on a
/// conflict with the replica's own renewal.
async fn hold(leases: &Api<Lease>, holder: &str) {
    wait::until(
        "the leader Lease written as held by the test",
        TIMEOUT,
        || async {
            let mut lease = leases.get(LEASE_NAME).await.map_err(|e| e.to_string())?;
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(holder.into());
            spec.lease_duration_seconds = Some(15);
            spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
            leases
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

async fn work(env: &Env, app: &str) -> Option<ManifestWork> {
    Api::<ManifestWork>::namespaced(env.hub_client.clone(), &env.spokes[0].name)
        .get_opt(&work_name(&env.team, app))
        .await
        .unwrap()
}

/// A proxy to the hub's API server that can freeze, through which the
/// hub-controllers started from now on reach it.
async fn through_freezing_proxy(env: &mut Env) -> testenv::freeze::FreezingProxy {
    let proxy = testenv::freeze::FreezingProxy::start(&env.hub)
        .await
        .unwrap();
    let path = env.dir.path().join("through-proxy.kubeconfig");
    env.hub_kubeconfig = Some(proxy.kubeconfig(&env.hub, &path).unwrap());
    proxy
}

/// One managed cluster, the Leases' namespace and Argo CD's.
async fn leader_env() -> Env {
    let env = Env::new(&["cluster1"]).await;
    env.hub.ensure_namespace(NS).await.unwrap();
    env.hub.ensure_namespace("argocd").await.unwrap();
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_loses_the_lease_steps_down_keeps_serving_and_leads_again() {
    let mut env = leader_env().await;
    let mut replica = env.start_replica("hub-0", &[]).await;
    let config = env.agent_config(0, &format!("https://{}", replica.grpc), Mode::Managed);
    env.start_agent_with(0, config);
    env.wait_connected().await;
    wait::until("hub-0 to lead", TIMEOUT, || async {
        replica.leads().await.then_some(()).ok_or("not yet")
    })
    .await;

    // Another holder takes the Lease and keeps renewing it.
    let leases: Api<Lease> = Api::namespaced(env.hub_client.clone(), NS);
    hold(&leases, "intruder").await;
    let renewing = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                hold(&leases, "intruder").await;
            }
        })
    };
    wait::until("hub-0 to step down", TIMEOUT, || async {
        match replica
            .metric("argocd_pull_hub_leader_terms_lost_total")
            .await
        {
            Some(n) if n >= 1.0 => Ok(()),
            other => Err(format!("terms lost: {other:?}")),
        }
    })
    .await;
    assert!(
        !replica.leads().await,
        "a replica that stepped down says so"
    );
    assert!(
        replica.process.child.try_wait().unwrap().is_none(),
        "hub-0 exited on losing the Lease:\n{}",
        replica.process.log_text()
    );
    assert!(
        replica.ready().await,
        "a replica that stepped down stays Ready"
    );

    // While another leads: an Application forced onto the ManifestWork
    // transport gets no work from hub-0, and one on gRPC, created after
    // it, still reaches the spoke through hub-0.
    let forced = json!({ "metadata": { "annotations": { keys::TRANSPORT: "manifestwork" } } });
    env.create("by-work", 0, forced).await;
    env.create("by-grpc", 0, json!({})).await;
    // by-grpc reaches cluster1 through hub-0.
    wait::exists(&env.spoke_apps(0), "by-grpc", TIMEOUT).await;
    assert!(
        work(&env, "by-work").await.is_none(),
        "a replica that does not lead wrote a ManifestWork"
    );

    // The Lease is free again: hub-0 stands, leads, and delivers the work.
    renewing.abort();
    let _ = renewing.await;
    leases
        .delete(LEASE_NAME, &DeleteParams::default())
        .await
        .unwrap();
    wait::until("hub-0 to lead again", TIMEOUT, || async {
        replica.leads().await.then_some(()).ok_or("not yet")
    })
    .await;
    wait::until("the work of by-work", TIMEOUT, || async {
        work(&env, "by-work").await.ok_or("none")
    })
    .await;
    assert!(replica.process.child.try_wait().unwrap().is_none());
    // The step-down is logged.
    replica.process.assert_logged("stepped down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_deletes_a_claim_no_live_replica_holds_and_only_that() {
    let mut env = leader_env().await;
    // A claim left by a replica that died and whose cluster never came
    // back (no presence Lease names its holder).
    let leases: Api<Lease> = Api::namespaced(env.hub_client.clone(), NS);
    let abandoned: Lease = serde_json::from_value(json!({
        "metadata": {
            "name": "argocd-pull-cluster-gone",
            "labels": { ROLE_LABEL: "claim" },
            "annotations": { CLUSTER_ANNOTATION: "gone" },
        },
        "spec": { "holderIdentity": "hub-dead_0123" },
    }))
    .unwrap();
    leases
        .create(&PostParams::default(), &abandoned)
        .await
        .unwrap();
    let replica = env
        .start_replica("hub-0", &["--grpc-abandoned-claim-after", "3s"])
        .await;
    let config = env.agent_config(0, &format!("https://{}", replica.grpc), Mode::Managed);
    env.start_agent_with(0, config);
    env.wait_connected().await;
    let claimed = wait::until("cluster1's claim, held by hub-0", TIMEOUT, || async {
        let l = leases
            .get_opt("argocd-pull-cluster-cluster1")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no claim")?;
        match l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) {
            Some(h) if h.starts_with("hub-0") => Ok(l.clone()),
            other => Err(format!("held by {other:?}")),
        }
    })
    .await;
    let claimed_at = k8s_openapi::jiff::Timestamp::now();
    wait::until(
        "the abandoned claim deleted by the leader",
        TIMEOUT,
        || async {
            match leases.get_opt("argocd-pull-cluster-gone").await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|l| l.is_some()))),
            }
        },
    )
    .await;
    // A claim held by a live replica is never deleted, however old: once
    // hub-0 has renewed its presence (and looked at every claim after
    // renewing) for more than twice the window since cluster1's claim
    // appeared, that claim is still the one it wrote.
    wait::until(
        "hub-0's presence renewed 6 s after the claim",
        TIMEOUT,
        || async {
            let renewed = common::leases_of_role(&leases, "presence")
                .await?
                .iter()
                .filter_map(|l| l.spec.as_ref()?.renew_time.as_ref())
                .map(|t| t.0)
                .max()
                .ok_or("no presence")?;
            if renewed.duration_since(claimed_at).as_secs_f64() > 6.0 {
                Ok(())
            } else {
                Err(format!("last renewal {renewed}"))
            }
        },
    )
    .await;
    let now = leases
        .get_opt("argocd-pull-cluster-cluster1")
        .await
        .unwrap()
        .expect("the live claim of cluster1 was deleted");
    assert_eq!(
        now.metadata.resource_version, claimed.metadata.resource_version,
        "the live claim of cluster1 was rewritten"
    );
    replica
        .process
        .assert_logged("deleted a claim no live replica has held for long");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_the_api_server_stops_writing_keeps_its_agent_and_resumes() {
    let mut env = leader_env().await;
    let proxy = through_freezing_proxy(&mut env).await;
    let mut replica = env.start_replica("hub-0", &[]).await;
    let config = env.agent_config(0, &format!("https://{}", replica.grpc), Mode::Managed);
    env.start_agent_with(0, config);
    env.wait_connected().await;
    env.create("app", 0, json!({})).await;
    let expected = std::collections::BTreeMap::from([("app".to_string(), 0)]);
    wait::until("app delivered and its status on the hub", TIMEOUT, || {
        env.converged(&expected)
    })
    .await;
    let lists = || async {
        replica
            .metric(
                r#"argocd_pull_hub_api_requests_total{verb="list",resource="leases",code="200"}"#,
            )
            .await
            .unwrap_or(0.0)
    };
    let lists_before = lists().await;

    // The API server stops answering for longer than the presence's
    // renew deadline (6 s) and its duration (8 s).
    let reconnects_before = env.spokes[0]
        .agent
        .as_ref()
        .unwrap()
        .metrics
        .reconnects
        .get();
    proxy.freeze();
    replica
        .process
        .wait_logged(
            "hub-0 to stop writing",
            "writes for none until it renews",
            TIMEOUT,
        )
        .await;
    // Frozen past the presence's duration.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    proxy.thaw();

    replica
        .process
        .wait_logged("hub-0 to write again", "presence is renewed again", TIMEOUT)
        .await;
    // Its one claim read back with one list, not one read per claim.
    assert_eq!(
        lists().await - lists_before,
        1.0,
        "claims read back by one list"
    );
    // A change made afterwards flows both ways through the same replica.
    env.hub_apps()
        .patch(
            "app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({ "spec": { "source": { "targetRevision": "after" } } }),
            ),
        )
        .await
        .unwrap();
    wait::until(
        "the change on the spoke and the status back",
        TIMEOUT,
        || async {
            let spoke = env
                .spoke_apps(0)
                .get("app")
                .await
                .map_err(|e| e.to_string())?;
            if spoke.data.pointer("/spec/source/targetRevision") != Some(&json!("after")) {
                return Err("not on the spoke yet".to_string());
            }
            env.converged(&expected).await
        },
    )
    .await;
    assert!(
        replica.process.child.try_wait().unwrap().is_none(),
        "hub-0 exited"
    );
    assert_eq!(replica.agents().await, ["cluster1"]);
    // The agent kept its stream through the freeze and since: not a
    // reconnect anywhere in the window.
    let agent = env.spokes[0].agent.as_ref().unwrap();
    assert!(agent.connected(), "the agent stays connected");
    assert_eq!(
        agent.metrics.reconnects.get(),
        reconnects_before,
        "the agent reconnected while its replica was cut off"
    );
}

/// Requests that wrote ManifestWorks, as `replica` counts them.
async fn work_writes(replica: &grpc_env::replicas::Replica) -> f64 {
    replica
        .process
        .metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("argocd_pull_hub_api_requests_total{"))
        .filter(|l| l.contains(r#"resource="manifestworks""#))
        .filter(|l| {
            ["create", "patch", "update"]
                .iter()
                .any(|v| l.contains(&format!(r#"verb="{v}""#)))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The target revision of Application `app` in its ManifestWork.
async fn revision_in_work(env: &Env, app: &str) -> Option<String> {
    let w = work(env, app).await?;
    let v = serde_json::to_value(&w).ok()?;
    v.pointer("/spec/workload/manifests/0/spec/source/targetRevision")?
        .as_str()
        .map(str::to_string)
}

/// Sets by-work's target revision to `revision` and waits until its work
/// carries it, `what` (which replica writes it).
async fn revise_by_work(env: &Env, revision: &str, what: &str) {
    common::set_source(&env.hub_apps(), "by-work", "targetRevision", revision).await;
    wait::until(what, TIMEOUT, || async {
        match revision_in_work(env, "by-work").await {
            Some(r) if r == revision => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The leader's API server stops answering (the 3,000-agent run's stall):
/// it steps down instead of exiting, the other replica leads and writes the
/// ManifestWorks, the one that stepped down writes none (even once it can
/// again) and keeps its agent on the same stream, and it leads again once
/// the other goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_steps_down_and_another_writes_the_manifestworks() {
    let mut env = leader_env().await;
    // hub-0 reaches the API server through a proxy that can freeze; hub-1
    // directly.
    let proxy = through_freezing_proxy(&mut env).await;
    let mut hub0 = env.start_replica("hub-0", &[]).await;
    env.hub_kubeconfig = None;
    wait::until("hub-0 to lead", TIMEOUT, || async {
        hub0.leads().await.then_some(()).ok_or("not yet")
    })
    .await;
    let hub1 = env.start_replica("hub-1", &[]).await;
    let config = env.agent_config(0, &format!("https://{}", hub0.grpc), Mode::Managed);
    env.start_agent_with(0, config);
    env.wait_connected().await;
    assert!(!hub1.leads().await, "two leaders");

    let forced = || json!({ "metadata": { "annotations": { keys::TRANSPORT: "manifestwork" } } });
    env.create("by-work", 0, forced()).await;
    wait::until("by-work's ManifestWork, from hub-0", TIMEOUT, || async {
        work(&env, "by-work").await.ok_or("none")
    })
    .await;
    assert!(work_writes(&hub0).await >= 1.0);
    assert_eq!(
        work_writes(&hub1).await,
        0.0,
        "a standby wrote a ManifestWork"
    );
    let reconnects = || {
        env.spokes[0]
            .agent
            .as_ref()
            .unwrap()
            .metrics
            .reconnects
            .get()
    };
    let reconnects_before = reconnects();

    // The API server stops answering hub-0: it cannot renew the Lease
    // (10 s), steps down, and hub-1 takes the Lease once it expires (15 s).
    proxy.freeze();
    hub0.process
        .wait_logged(
            "hub-0 to step down",
            "lost the leader Lease: stepped down",
            TIMEOUT,
        )
        .await;
    wait::until("hub-1 to lead", TIMEOUT, || async {
        hub1.leads().await.then_some(()).ok_or("not yet")
    })
    .await;
    assert!(
        hub0.process.child.try_wait().unwrap().is_none(),
        "hub-0 exited on losing the Lease:\n{}",
        hub0.process.log_text()
    );
    // The positive signal: hub-1 now writes the ManifestWorks.
    revise_by_work(
        &env,
        "while-frozen",
        "by-work's change in its work, by hub-1",
    )
    .await;
    assert!(work_writes(&hub1).await >= 1.0);

    // hub-0 reaches the API server again: it stands by, writes no
    // ManifestWork while hub-1 writes the next change, and its agent is
    // still on its first stream.
    proxy.thaw();
    let hub0_writes = work_writes(&hub0).await;
    let hub1_writes = work_writes(&hub1).await;
    env.create("by-grpc", 0, json!({})).await;
    // by-grpc reaches cluster1 through hub-0.
    wait::exists(&env.spoke_apps(0), "by-grpc", TIMEOUT).await;
    revise_by_work(&env, "after-thaw", "by-work's second change in its work").await;
    assert!(work_writes(&hub1).await > hub1_writes, "hub-1 wrote it");
    assert_eq!(
        work_writes(&hub0).await,
        hub0_writes,
        "hub-0 wrote a ManifestWork after stepping down"
    );
    assert!(!hub0.leads().await, "hub-0 leads next to hub-1");
    assert_eq!(hub0.agents().await, ["cluster1"]);
    assert_eq!(
        reconnects(),
        reconnects_before,
        "the agent reconnected while its replica stepped down"
    );
    assert_eq!(
        hub0.metric("argocd_pull_hub_leader_terms_lost_total").await,
        Some(1.0)
    );

    // hub-1 goes (SIGTERM hands the Lease back): hub-0 leads again and
    // writes the ManifestWorks.
    assert!(hub1.terminate().await.success());
    wait::until("hub-0 to lead again", TIMEOUT, || async {
        hub0.leads().await.then_some(()).ok_or("not yet")
    })
    .await;
    revise_by_work(
        &env,
        "hub-0-again",
        "by-work's third change in its work, by hub-0",
    )
    .await;
    assert!(work_writes(&hub0).await > hub0_writes, "hub-0 wrote it");
    assert!(hub0.process.child.try_wait().unwrap().is_none());
    let log = hub0.process.log_text();
    for line in log
        .lines()
        .filter(|l| l.to_lowercase().contains("lease") || l.contains("leading:"))
    {
        println!("hub-0: {line}");
    }
}
