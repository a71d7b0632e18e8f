//! Three hub-controller replicas against real API servers, as the
//! Deployment runs them: every replica serves gRPC behind one Service, the
//! replica an agent is connected to writes for its cluster, the leader runs
//! the rest. Churn on 300 Applications over three clusters while one
//! serving replica is killed with SIGKILL, then the leader, then all three
//! are restarted one by one: in the end every hub and spoke copy is exact,
//! every sync ran once on its spoke, and every live claim is held by a
//! live replica. The times each recovery took are printed (measured, not
//! asserted; docs/operations.md).

mod common;
mod grpc_env;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use argocd_pull_hub_controller::transport::grpc::claims::CLUSTER_ANNOTATION;
use argocd_pull_spoke_agent::Mode;
use grpc_env::replicas::{
    self, Replica, app_name, cluster_of, converged, create_apps, leader, point_service,
    replicas_env, request_sync,
};
use grpc_env::{Env, TIMEOUT};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use testenv::wait;

const CLUSTERS: [&str; 3] = ["cluster1", "cluster2", "cluster3"];
const APPS_PER_CLUSTER: usize = 100;

fn name(cluster: usize, n: usize) -> String {
    app_name(cluster, n)
}

async fn churn(env: &Env, round: usize, step: usize) {
    replicas::churn(env, CLUSTERS.len(), APPS_PER_CLUSTER, round, step).await
}

async fn all_connected(replicas: &[Replica]) -> Result<BTreeMap<String, String>, String> {
    replicas::all_connected(replicas, CLUSTERS.len()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_serve_and_survive_kills_and_restarts() {
    let (mut env, service) = replicas_env(&CLUSTERS).await;
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(env.start_replica(&format!("hub-{i}"), &[]).await);
    }
    // Every replica is Ready (each serves what the Service sends it), and
    // exactly one leads.
    for r in &replicas {
        assert!(r.ready().await, "{} is Ready", r.name);
    }
    wait::until("one replica to lead", TIMEOUT, || async {
        let mut leading = Vec::new();
        for r in &replicas {
            if r.leads().await {
                leading.push(r.name.clone());
            }
        }
        if leading.len() == 1 {
            Ok(())
        } else {
            Err(format!("{leading:?}"))
        }
    })
    .await;
    point_service(&service, &replicas);
    for i in 0..CLUSTERS.len() {
        let config = env.agent_config(i, &service.address(), Mode::Managed);
        env.start_agent_with(i, config);
    }
    env.wait_connected().await;
    let on = wait::until("every agent on a replica", TIMEOUT, || {
        all_connected(&replicas)
    })
    .await;
    let serving: std::collections::BTreeSet<&String> = on.values().collect();
    assert!(
        serving.len() >= 2,
        "the Service spreads the agents over the replicas: {on:?}"
    );
    eprintln!("agents: {on:?}");

    // 300 Applications.
    let expected = create_apps(&env, CLUSTERS.len(), APPS_PER_CLUSTER).await;
    let took = converged(
        &env,
        &expected,
        "300 Applications delivered and their status back",
    )
    .await;
    eprintln!("delivered: {took:?}");
    let mut syncs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut round = 0;
    let mut figures = Vec::new();

    // Kill -9 a serving replica that is not the leader, with syncs in flight
    // on its clusters and changes coming.
    let lead = leader(&replicas).await.expect("a leader");
    let on = all_connected(&replicas).await.unwrap();
    let victim = (0..replicas.len())
        .filter(|i| *i != lead)
        .max_by_key(|i| on.values().filter(|r| **r == replicas[*i].name).count())
        .unwrap();
    let victim_clusters: Vec<usize> = CLUSTERS
        .iter()
        .enumerate()
        .filter(|(_, c)| on.get(**c) == Some(&replicas[victim].name))
        .map(|(i, _)| i)
        .collect();
    eprintln!(
        "killing {} (serving {:?})",
        replicas[victim].name, victim_clusters
    );
    for &c in &victim_clusters {
        let (n, rev) = (name(c, 1), "kill-serving".to_string());
        request_sync(&env, &n, &rev).await;
        syncs.entry(n).or_default().push(rev);
    }
    let killed = replicas.remove(victim);
    let start = Instant::now();
    killed.kill().await;
    point_service(&service, &replicas);
    round += 1;
    churn(&env, round, 3).await;
    wait::until("every agent back on a live replica", TIMEOUT, || {
        all_connected(&replicas)
    })
    .await;
    let back = start.elapsed();
    converged(
        &env,
        &expected,
        "exact again after a serving replica was killed",
    )
    .await;
    figures.push(("serving replica killed", back, start.elapsed()));
    replicas.push(env.start_replica("hub-3", &[]).await);
    point_service(&service, &replicas);

    // Kill -9 the leader: another one leads within the Lease's duration,
    // and the clusters it served go elsewhere.
    let lead = leader(&replicas).await.expect("a leader");
    for c in 0..CLUSTERS.len() {
        let (n, rev) = (name(c, 2), "kill-leader".to_string());
        request_sync(&env, &n, &rev).await;
        syncs.entry(n).or_default().push(rev);
    }
    let killed = replicas.remove(lead);
    eprintln!("killing the leader {}", killed.name);
    let start = Instant::now();
    killed.kill().await;
    point_service(&service, &replicas);
    round += 1;
    churn(&env, round, 3).await;
    wait::until(
        "another replica to lead",
        Duration::from_secs(30),
        || async { leader(&replicas).await.ok_or("no leader yet") },
    )
    .await;
    let led = start.elapsed();
    wait::until("every agent back on a live replica", TIMEOUT, || {
        all_connected(&replicas)
    })
    .await;
    converged(&env, &expected, "exact again after the leader was killed").await;
    figures.push(("leader killed (new leader after)", led, start.elapsed()));
    replicas.push(env.start_replica("hub-4", &[]).await);
    point_service(&service, &replicas);

    // A rolling restart: each replica stopped (SIGTERM) and replaced in
    // turn, with changes and syncs between.
    let leases: Api<Lease> = Api::namespaced(env.hub_client.clone(), "argocd-pull");
    let mut restarted_the_leader = false;
    for k in 0..3 {
        let old = replicas.remove(0);
        let was_leader = old.leads().await;
        restarted_the_leader |= was_leader;
        eprintln!("restarting {}", old.name);
        for c in 0..CLUSTERS.len() {
            let (n, rev) = (name(c, 3 + k), format!("restart-{k}"));
            request_sync(&env, &n, &rev).await;
            syncs.entry(n).or_default().push(rev);
        }
        let start = Instant::now();
        point_service(&service, &replicas);
        let old_name = old.name.clone();
        let status = old.terminate().await;
        assert!(status.success(), "a replica stops cleanly: {status:?}");
        if was_leader {
            // Released on the way out, not left to expire: the Lease no
            // longer names the stopped replica the moment it has exited.
            let lease = leases
                .get(argocd_pull_hub_controller::LEASE_NAME)
                .await
                .unwrap();
            let holder = lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            assert!(
                !holder.starts_with(&format!("{old_name}_")),
                "the stopped leader released its Lease, but it still names {holder}"
            );
        }
        round += 1;
        churn(&env, round, 5).await;
        replicas.push(env.start_replica(&format!("hub-{}", 5 + k), &[]).await);
        point_service(&service, &replicas);
        wait::until("every agent on a live replica", TIMEOUT, || {
            all_connected(&replicas)
        })
        .await;
        let back = start.elapsed();
        converged(&env, &expected, "exact again after a replica restarted").await;
        figures.push(("replica restarted", back, start.elapsed()));
    }
    assert!(
        restarted_the_leader,
        "the rolling restart stopped the leader too"
    );

    // Every sync ran exactly once on its spoke.
    for (n, revs) in &syncs {
        let c = cluster_of(n);
        assert_eq!(
            &env.spokes[c].argocd.syncs_of(n),
            revs,
            "{n}: every sync ran once"
        );
    }
    // Each cluster is held by the replica its agent is on, and no Lease
    // names a replica that is gone.
    let on = all_connected(&replicas).await.unwrap();
    wait::until(
        "each cluster's claim held by its agent's replica",
        TIMEOUT,
        || async {
            let claims: BTreeMap<String, String> = common::leases_of_role(&leases, "claim")
                .await?
                .iter()
                .map(|l| {
                    (
                        l.annotations()
                            .get(CLUSTER_ANNOTATION)
                            .cloned()
                            .unwrap_or_default(),
                        l.spec
                            .as_ref()
                            .and_then(|s| s.holder_identity.clone())
                            .unwrap_or_default(),
                    )
                })
                .collect();
            let held_by: BTreeMap<String, String> = claims
                .iter()
                .map(|(c, holder)| {
                    (
                        c.clone(),
                        holder.split('_').next().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            if held_by == on {
                Ok(())
            } else {
                Err(format!("claims {claims:?}, agents on {on:?}"))
            }
        },
    )
    .await;
    for (what, first, exact) in &figures {
        eprintln!(
            "{what}: {first:?} to the first signal, {exact:?} until every Application was exact"
        );
    }
    for r in replicas {
        assert!(r.terminate().await.success());
    }
    let log = env.hub_log();
    for l in log.lines().filter(|l| {
        l.contains("WARN")
            || l.contains("ERROR")
            || l.contains("took over")
            || l.contains("asked its previous")
    }) {
        eprintln!("hub: {l}");
    }
}
