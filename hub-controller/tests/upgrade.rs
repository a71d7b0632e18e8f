//! A rolling upgrade from the previous release, as a platform team runs
//! one. Three hub-controller replicas and every cluster's spoke-agent start
//! on the previous release (`PREVIOUS_RELEASE` in `test/tools/versions.env`,
//! built from this repository's own history by `test/tools/build.sh`). The
//! hub Deployment is then rolled to this build one replica at a time, so
//! replicas of both releases serve side by side while the agents stay one
//! release behind; then the agents are upgraded one by one. Then all of it
//! is rolled back the same way (the replicas first, with agents one
//! release ahead meanwhile, then the agents). Changes and syncs flow
//! throughout: after every step every hub and spoke copy is exact, and in
//! the end every sync ran once on its spoke.

mod common;
mod grpc_env;

use std::collections::BTreeMap;

use argocd_pull_spoke_agent::Mode;
use grpc_env::replicas::{
    self, Replica, app_name, cluster_of, converged, point_service, request_sync,
};
use grpc_env::{Env, TIMEOUT};
use testenv::{net, paths, wait};

const CLUSTERS: [&str; 3] = ["cluster1", "cluster2", "cluster3"];
const APPS_PER_CLUSTER: usize = 30;
const CURRENT: &str = env!("CARGO_PKG_VERSION");

/// The release each replica runs, and the release of each connected
/// agent, as the replicas' `/status` pages report them.
async fn releases(replicas: &[Replica]) -> (Vec<String>, BTreeMap<String, String>) {
    let (mut hubs, mut agents) = (Vec::new(), BTreeMap::new());
    for r in replicas {
        let report = r.report().await.expect("every replica answers /status");
        hubs.push(report.version);
        for a in report.agents {
            agents.insert(a.cluster, a.version);
        }
    }
    hubs.sort();
    (hubs, agents)
}

/// Waits until `cluster`'s agent is connected to a replica on `release`.
async fn agent_release(replicas: &[Replica], cluster: &str, release: &str, what: &str) {
    wait::until(what, TIMEOUT, || async {
        match releases(replicas).await.1.get(cluster) {
            Some(v) if v == release => Ok(()),
            other => Err(format!("{cluster}: {other:?}")),
        }
    })
    .await;
}

/// Every cluster's agent connected and on release `agent`, the replicas on
/// `hubs` (sorted); prints how long it took.
async fn expect_releases(replicas: &[Replica], hubs: &[&str], agent: &str, what: &str) {
    let start = std::time::Instant::now();
    let want_agents: BTreeMap<String, String> = CLUSTERS
        .iter()
        .map(|c| (c.to_string(), agent.to_string()))
        .collect();
    wait::until(what, TIMEOUT, || async {
        let (h, a) = releases(replicas).await;
        if h == hubs && a == want_agents {
            Ok(())
        } else {
            Err(format!("replicas on {h:?}, agents on {a:?}"))
        }
    })
    .await;
    println!("{what}: {:.1}s", start.elapsed().as_secs_f64());
}

/// Every spoke Application's resourceVersion, by name.
async fn spoke_versions(env: &Env) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for i in 0..CLUSTERS.len() {
        for a in env.spoke_apps(i).list(&Default::default()).await.unwrap() {
            out.insert(
                a.metadata.name.clone().unwrap_or_default(),
                a.metadata.resource_version.clone().unwrap_or_default(),
            );
        }
    }
    out
}

/// The spoke Applications that neither the churn of `round` nor the sync
/// of `synced` touched kept their resourceVersion from `before`: the
/// upgrade itself rewrote none.
fn untouched_kept(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    round: usize,
    synced: usize,
    what: &str,
) {
    let mut checked = 0;
    for (name, rv) in before {
        let n: usize = name[6..].parse().unwrap();
        if n % 4 == round % 4 || n == synced {
            continue;
        }
        assert_eq!(after.get(name), Some(rv), "{what}: {name} was rewritten");
        checked += 1;
    }
    assert!(
        checked >= CLUSTERS.len() * APPS_PER_CLUSTER / 2,
        "{what}: {checked}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_upgrade_and_rollback_with_agents_one_release_apart() {
    let previous_hub = paths::previous_binary("hub-controller").unwrap();
    let previous_agent = paths::previous_binary("spoke-agent").unwrap();
    let previous = paths::previous_release();
    assert_ne!(
        previous, CURRENT,
        "versions.env's PREVIOUS_RELEASE names the release before this one"
    );

    let (mut env, service) = replicas::replicas_env(&CLUSTERS).await;

    // Everything on the previous release.
    let mut replicas = Vec::new();
    for i in 0..3 {
        let name = format!("old-{i}");
        replicas.push(env.start_replica_from(&previous_hub, &name, &[]).await);
    }
    point_service(&service, &replicas);
    let address = service.address();
    let mut old_agents: Vec<_> = (0..CLUSTERS.len())
        .map(|i| env.spawn_agent_from(&previous_agent, i, &address))
        .collect();
    let p = previous.as_str();
    expect_releases(&replicas, &[p, p, p], p, "the previous release everywhere").await;

    let expected = replicas::create_apps(&env, CLUSTERS.len(), APPS_PER_CLUSTER).await;
    converged(&env, &expected, "delivered by the previous release").await;

    let mut syncs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut round = 0;
    let mut sync_everywhere = async |env: &Env, n: usize, rev: String| {
        for c in 0..CLUSTERS.len() {
            let name = app_name(c, n);
            request_sync(env, &name, &rev).await;
            syncs.entry(name).or_default().push(rev.clone());
        }
    };

    // The hub Deployment rolled: each old replica stopped (SIGTERM) and
    // replaced by one of this build, with syncs in flight and changes
    // coming; the agents stay on the previous release.
    for k in 0..3 {
        let before = spoke_versions(&env).await;
        let old = replicas.remove(0);
        sync_everywhere(&env, 1 + k, format!("upgrade-hub-{k}")).await;
        point_service(&service, &replicas);
        let status = old.terminate().await;
        assert!(status.success(), "an old replica stops cleanly: {status:?}");
        round += 1;
        replicas::churn(&env, CLUSTERS.len(), APPS_PER_CLUSTER, round, 4).await;
        replicas.push(env.start_replica(&format!("new-{k}"), &[]).await);
        point_service(&service, &replicas);
        let mut hubs = vec![p; 2 - k];
        hubs.extend(vec![CURRENT; k + 1]);
        hubs.sort();
        expect_releases(&replicas, &hubs, p, "the hub part-way through its upgrade").await;
        converged(&env, &expected, "exact while the hub is upgraded").await;
        let after = spoke_versions(&env).await;
        untouched_kept(&before, &after, round, 1 + k, "the hub's upgrade");
    }
    wait::until("a replica of this build to lead", TIMEOUT, || async {
        replicas::leader(&replicas).await.ok_or("no leader yet")
    })
    .await;

    // The agents upgraded one by one (each pod replaced: SIGTERM, then the
    // new release starts).
    for (i, old) in old_agents.iter_mut().enumerate() {
        let before = spoke_versions(&env).await;
        sync_everywhere(&env, 10 + i, format!("upgrade-agent-{i}")).await;
        let status = net::terminate(old, std::time::Duration::from_secs(30)).await;
        assert!(status.success(), "an old agent stops cleanly: {status:?}");
        let config = env.agent_config(i, &address, Mode::Managed);
        env.start_agent_with(i, config);
        round += 1;
        replicas::churn(&env, CLUSTERS.len(), APPS_PER_CLUSTER, round, 4).await;
        agent_release(
            &replicas,
            CLUSTERS[i],
            CURRENT,
            "the new agent on a replica",
        )
        .await;
        converged(&env, &expected, "exact while the agents are upgraded").await;
        let after = spoke_versions(&env).await;
        untouched_kept(&before, &after, round, 10 + i, "an agent's upgrade");
    }
    let c = CURRENT;
    expect_releases(&replicas, &[c, c, c], c, "this build everywhere").await;

    // A rollback (`helm rollback`): the hub Deployment rolled back to the
    // previous release one replica at a time, the agents one release
    // ahead meanwhile; then the agents rolled back too.
    for k in 0..3 {
        let new = replicas.remove(0);
        sync_everywhere(&env, 20 + k, format!("rollback-hub-{k}")).await;
        point_service(&service, &replicas);
        let status = new.terminate().await;
        assert!(status.success(), "a replica stops cleanly: {status:?}");
        round += 1;
        replicas::churn(&env, CLUSTERS.len(), APPS_PER_CLUSTER, round, 4).await;
        replicas.push(
            env.start_replica_from(&previous_hub, &format!("back-{k}"), &[])
                .await,
        );
        point_service(&service, &replicas);
        let mut hubs = vec![c; 2 - k];
        hubs.extend(vec![p; k + 1]);
        hubs.sort();
        // This build's agents stay on the previous release's replicas
        // (they answer no AppProject set there: it does not know the
        // message), within the same patience as every other step.
        expect_releases(&replicas, &hubs, c, "the hub part-way through its rollback").await;
        converged(&env, &expected, "exact while the hub is rolled back").await;
    }
    for i in 0..CLUSTERS.len() {
        sync_everywhere(&env, 25 + i, format!("rollback-agent-{i}")).await;
        if let Some(agent) = env.spokes[i].agent.take() {
            agent.stop().await;
        }
        old_agents[i] = env.spawn_agent_from(&previous_agent, i, &address);
        round += 1;
        replicas::churn(&env, CLUSTERS.len(), APPS_PER_CLUSTER, round, 4).await;
        agent_release(
            &replicas,
            CLUSTERS[i],
            p,
            "the previous agent back on a replica",
        )
        .await;
        converged(&env, &expected, "exact while the agents are rolled back").await;
    }
    expect_releases(
        &replicas,
        &[p, p, p],
        p,
        "the previous release everywhere again",
    )
    .await;

    // Every sync ran exactly once on its spoke, whichever release carried it.
    for (n, revs) in &syncs {
        assert_eq!(
            &env.spokes[cluster_of(n)].argocd.syncs_of(n),
            revs,
            "{n}: every sync ran once"
        );
    }
    for r in replicas {
        assert!(r.terminate().await.success());
    }
}

/// The addon's template renders the agents of the previous release too
/// while the hub moves first (`agent.image.tag` kept back, docs/operations.md
/// Upgrades): their container, with this build's arguments and environment
/// and the default variables, must get past its argument parsing to its
/// first real step (reading the kubeconfig, here missing). A flag added
/// since then makes the previous agent exit at once ("unexpected
/// argument"), which is how `test/tests/helm_upgrade.rs` found the trace
/// endpoint's flag; this finds it in a second.
#[tokio::test]
async fn the_agent_template_starts_an_agent_of_the_previous_release() {
    let config = argocd_pull_addon::AddonConfig::default();
    let template = argocd_pull_addon::add_on_template(&config);
    let deployment = template["spec"]["agentSpec"]["workload"]["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["kind"] == "Deployment")
        .expect("the template deploys the agent")
        .clone();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut variables: Vec<(String, String)> = argocd_pull_addon::default_variables(&config)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    variables.push(("CLUSTER_NAME".into(), "cluster1".into()));
    let fill = |s: &str| {
        variables.iter().fold(s.to_string(), |s, (k, v)| {
            s.replace(&format!("{{{{{k}}}}}"), v)
        })
    };
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| fill(a.as_str().unwrap()))
        .collect();
    let env: Vec<(String, String)> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                fill(e["value"].as_str().unwrap_or_default()),
            )
        })
        .collect();
    assert!(
        args.iter()
            .chain(env.iter().map(|(_, v)| v))
            .all(|a| !a.contains("{{")),
        "every variable filled: {args:?} {env:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("no-kubeconfig");
    for (release, agent) in [
        ("previous", paths::previous_binary("spoke-agent").unwrap()),
        ("this", paths::own_binary("spoke-agent").unwrap()),
    ] {
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            tokio::process::Command::new(&agent)
                .args(&args)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .env("KUBECONFIG", &kubeconfig)
                .env("RUST_BACKTRACE", "0")
                .output(),
        )
        .await
        .expect("the agent gives up on a missing kubeconfig at once")
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot read kubeconfig"),
            "the {release} release's agent with the template's arguments {args:?} and environment {env:?}: {stderr}"
        );
    }
}
