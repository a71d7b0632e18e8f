//! An upgrade and a rollback from the Helm chart, on real pods, under load,
//! as a platform team runs them: the hub starts on the previous release
//! (`PREVIOUS_RELEASE` in `test/tools/versions.env`: its chart from this
//! repository's history, its images built from its binaries), installed
//! with `helm install`, its addon enabled with `clusteradm`, so the agents
//! of the previous release run as pods on both managed clusters. Then, as
//! docs/operations.md orders it: `helm upgrade` to this build's chart with
//! `agent.image.tag` kept at the previous release (the hub's Deployment
//! rolls; the agents are rendered from the new template with the old
//! image), `helm upgrade` without that (OCM's addon manager rolls the
//! agents to this build), and `helm rollback` to the first revision (both
//! at once). cluster1's Applications go over gRPC, cluster2's in
//! ManifestWorks.
//!
//! Changes (a new `spec.info` on every Application, every 700 ms) and
//! syncs (asked on the hub, as `argocd app sync` asks) flow through every
//! step. Watches on both clusters record every version of every copy.
//! After each step: every change arrived and every sync came back; no copy
//! was deleted, recreated or taken back to an older spec; every sync ran
//! exactly once; Applications nobody touched were not rewritten (spec, no
//! operation) on the hub or on their cluster; the ManifestWorks kept their
//! uids (adopted, not replaced); `HUB_CA` never left the
//! AddOnDeploymentConfig (the agents' trust in the hub) while Helm applied
//! its own entries of the same list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::ocm::{AddOnDeploymentConfig, ManifestWork};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::stack::{self, Install, Stack, StackOptions, helm};
use testenv::{net, paths, wait};

const NS: &str = testenv::argocd::NAMESPACE;
const CLUSTERS: [&str; 2] = ["cluster1", "cluster2"];
/// Applications per cluster that changes and syncs go to.
const BUSY: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(240);
const CURRENT: &str = env!("CARGO_PKG_VERSION");
/// The AddOnDeploymentConfig variable with the hub's serving CA, which the
/// hub-controller keeps set (`argocd_pull_addon::HUB_CA_VARIABLE`).
const HUB_CA: &str = "HUB_CA";
/// The `operation.info` entry that names each sync the test asks for.
const SYNC_INFO: &str = "upgrade-test-sync";

fn busy(cluster: &str, i: usize) -> String {
    format!("busy-{cluster}-{i}")
}

fn still(cluster: &str) -> String {
    format!("still-{cluster}")
}

fn names() -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for c in CLUSTERS {
        for i in 0..BUSY {
            out.push((busy(c, i), c));
        }
        out.push((still(c), c));
    }
    out
}

fn at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn round_of(a: &Value) -> u64 {
    a.pointer("/spec/info")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|i| i["name"] == "round")
        .and_then(|i| i["value"].as_str()?.parse().ok())
        .unwrap_or(0)
}

/// The test's name of the sync an operation (or an operation state's
/// operation) carries.
fn sync_of(operation: &Value) -> Option<String> {
    operation
        .pointer("/info")?
        .as_array()?
        .iter()
        .find(|i| i["name"] == SYNC_INFO)
        .and_then(|i| i["value"].as_str())
        .map(str::to_string)
}

fn to_value(o: &DynamicObject) -> Value {
    serde_json::to_value(o).expect("an object serializes")
}

/// What the watch on a cluster saw of one copy, over the whole test.
#[derive(Debug, Default)]
struct Seen {
    uids: BTreeSet<String>,
    deleted: bool,
    /// `spec.info` rounds in the order the versions came (repeats dropped).
    rounds: Vec<u64>,
    /// Each sync's start times, as the cluster's Argo CD wrote them.
    runs: BTreeMap<String, BTreeSet<String>>,
    /// Versions that carried an operation, by its sync name (`""`: none
    /// of the test's).
    operations: BTreeMap<String, usize>,
}

type Record = Arc<Mutex<BTreeMap<(String, String), Seen>>>;

/// Records every version of the test's Applications on `cluster`.
fn watch_copies(
    cluster: &'static str,
    client: kube::Client,
    record: Record,
) -> tokio::task::JoinHandle<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &application_resource());
    let ours: BTreeSet<String> = names().into_iter().map(|(n, _)| n).collect();
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let (obj, deleted) = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
                Ok(watcher::Event::Delete(o)) => (o, true),
                _ => continue,
            };
            let name = obj.metadata.name.clone().unwrap_or_default();
            if !ours.contains(&name) {
                continue;
            }
            let v = to_value(&obj);
            let mut all = record.lock().unwrap();
            let seen = all.entry((cluster.to_string(), name)).or_default();
            seen.uids
                .insert(obj.metadata.uid.clone().unwrap_or_default());
            seen.deleted |= deleted || obj.metadata.deletion_timestamp.is_some();
            let round = round_of(&v);
            if seen.rounds.last() != Some(&round) {
                seen.rounds.push(round);
            }
            if let Some(op) = v.get("operation").filter(|o| !o.is_null()) {
                *seen
                    .operations
                    .entry(sync_of(op).unwrap_or_default())
                    .or_default() += 1;
            }
            let state = &v["status"]["operationState"];
            if let Some(sync) = sync_of(&state["operation"]) {
                let started = at(state, "/startedAt").to_string();
                seen.runs.entry(sync).or_default().insert(started);
            }
        }
    })
}

/// What the load asked for so far.
#[derive(Debug, Default)]
struct Asked {
    round: u64,
    /// Syncs asked, by Application, in order.
    syncs: BTreeMap<String, Vec<String>>,
    changes: usize,
}

/// `Ok` once sync `last` of `name` (if any) ran on its cluster, ended
/// (`Succeeded` only, with `succeeded`), and the hub copy shows that run
/// (same start, same phase; the ManifestWork transport's feedback carries
/// no `operation`) with no operation pending.
async fn sync_back(
    hub: &Api<DynamicObject>,
    spoke: &Api<DynamicObject>,
    name: &str,
    last: Option<&str>,
    succeeded: bool,
) -> Result<(), String> {
    let on_hub = to_value(&hub.get(name).await.map_err(|e| e.to_string())?);
    if !on_hub.get("operation").is_none_or(Value::is_null) {
        return Err(format!("the hub copy's operation {}", on_hub["operation"]));
    }
    let Some(last) = last else { return Ok(()) };
    let copy = to_value(&spoke.get(name).await.map_err(|e| e.to_string())?);
    let (ran, shown) = (
        &copy["status"]["operationState"],
        &on_hub["status"]["operationState"],
    );
    let phase = at(ran, "/phase");
    let ended = if succeeded {
        phase == "Succeeded"
    } else {
        matches!(phase, "Succeeded" | "Failed" | "Error")
    };
    if sync_of(&ran["operation"]).as_deref() == Some(last)
        && ended
        && at(shown, "/startedAt") == at(ran, "/startedAt")
        && at(shown, "/phase") == phase
    {
        Ok(())
    } else {
        Err(format!(
            "sync {last}: on the cluster {ran}; on the hub {shown}"
        ))
    }
}

/// Changes every busy Application every 700 ms and asks one of them for a
/// sync every fourth round (when its last one came back to the hub), until
/// `stop`; API errors are retried on the next round (the hub's API server
/// stays up throughout; a failed write just did not happen).
async fn load(
    hub: Api<DynamicObject>,
    spokes: BTreeMap<&'static str, Api<DynamicObject>>,
    asked: Arc<Mutex<Asked>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let busy_names: Vec<(String, &str)> = names()
        .into_iter()
        .filter(|(n, _)| n.starts_with("busy-"))
        .collect();
    let mut tick = 0usize;
    loop {
        tick += 1;
        let round = {
            let mut a = asked.lock().unwrap();
            a.round += 1;
            a.round
        };
        for (name, _) in &busy_names {
            let patch =
                json!({ "spec": { "info": [{ "name": "round", "value": round.to_string() }] } });
            if hub
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                asked.lock().unwrap().changes += 1;
            }
        }
        if tick.is_multiple_of(4) {
            let (name, cluster) = &busy_names[(tick / 4) % busy_names.len()];
            let last = asked
                .lock()
                .unwrap()
                .syncs
                .get(name)
                .and_then(|s| s.last().cloned());
            let ready = sync_back(&hub, &spokes[cluster], name, last.as_deref(), false)
                .await
                .is_ok();
            if ready {
                let sync = format!("{name}-{round}");
                let patch = json!({ "operation": {
                    "initiatedBy": { "username": "upgrade-test" },
                    "info": [{ "name": SYNC_INFO, "value": sync }],
                    "sync": { "revision": "main" },
                } });
                if hub
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    asked
                        .lock()
                        .unwrap()
                        .syncs
                        .entry(name.clone())
                        .or_default()
                        .push(sync);
                }
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(700)) => {}
        }
    }
}

/// The release the hub-controller reports, and its agents', from its
/// `/status` (through the admin port the stack forwards).
async fn releases(stack: &Stack) -> Option<(String, BTreeMap<String, String>)> {
    let Ok((200, body)) = net::http_get(stack.admin, "/status").await else {
        return None;
    };
    let report: Value = serde_json::from_str(&body).ok()?;
    let agents = report["agents"]
        .as_array()?
        .iter()
        .map(|a| (at(a, "/cluster").to_string(), at(a, "/version").to_string()))
        .collect();
    Some((at(&report, "/version").to_string(), agents))
}

/// The image and whether this build's template rendered it (it passes the
/// trace endpoint in the environment, the previous one passed none) of
/// each cluster's agent Deployment.
async fn agent_deployments(stack: &Stack) -> BTreeMap<String, (String, bool)> {
    let mut out = BTreeMap::new();
    for c in CLUSTERS {
        let Ok(client) = stack.cluster(c).client().await else {
            continue;
        };
        let api: Api<Deployment> = Api::namespaced(client, stack::AGENT_NAMESPACE);
        let Ok(Some(d)) = api.get_opt(stack::AGENT).await else {
            continue;
        };
        let Some(container) = d
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().next())
        else {
            continue;
        };
        let current = container
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "ARGOCD_PULL_OTLP_ENDPOINT");
        out.insert(
            c.to_string(),
            (container.image.unwrap_or_default(), current),
        );
    }
    out
}

/// Waits until the hub's Deployment and every agent's are rolled out, the
/// hub runs release `hub_release` and every agent `agent_release`, from
/// this build's template if `current_template`; returns each state it saw
/// on the way (hub release, agents' releases) with the time since `start`.
async fn rolled_to(
    stack: &Stack,
    hub_release: &str,
    agent_release: &str,
    current_template: bool,
    start: Instant,
) -> Vec<String> {
    let rendered: BTreeMap<String, (String, bool)> = CLUSTERS
        .iter()
        .map(|c| {
            let image = format!("argocd-pull-spoke-agent:{agent_release}");
            (c.to_string(), (image, current_template))
        })
        .collect();
    let want: BTreeMap<String, String> = CLUSTERS
        .iter()
        .map(|c| (c.to_string(), agent_release.to_string()))
        .collect();
    let mut states: Vec<String> = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let now = releases(stack).await;
        if let Some((hub, agents)) = &now {
            let state = format!("hub {hub}, agents {agents:?}");
            if states.last().and_then(|s| s.split_once(": ")).map(|x| x.1) != Some(&state) {
                states.push(format!("{:.1}s: {state}", start.elapsed().as_secs_f64()));
            }
        }
        let pods = stack.pods().await;
        let deployments = agent_deployments(stack).await;
        let ready =
            pods.as_ref().is_ok_and(|p| p.values().all(|p| p.ready)) && deployments == rendered;
        match &now {
            Some((hub, agents)) if hub == hub_release && *agents == want && ready => break,
            _ if Instant::now() > deadline => panic!(
                "the hub on {hub_release} and the agents on {agent_release} within {TIMEOUT:?}: now {now:?}, pods {pods:?}, agent Deployments {deployments:?}, on the way {states:?}\n{}",
                stack.log_tails(40)
            ),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    states
}

/// Every busy Application's last change is on its cluster and every sync
/// asked ran there and came back to the hub.
async fn flowed(
    hub: &Api<DynamicObject>,
    spokes: &BTreeMap<&str, Api<DynamicObject>>,
    asked: &Mutex<Asked>,
) {
    let (round, syncs) = {
        let a = asked.lock().unwrap();
        (a.round, a.syncs.clone())
    };
    for (name, cluster) in names().into_iter().filter(|(n, _)| n.starts_with("busy-")) {
        let last = syncs.get(&name).and_then(|s| s.last().cloned());
        wait::until(
            &format!("round {round} and sync {last:?} of {name}"),
            TIMEOUT,
            || async {
                let copy = to_value(
                    &spokes[cluster]
                        .get(&name)
                        .await
                        .map_err(|e| e.to_string())?,
                );
                if round_of(&copy) != round {
                    return Err(format!("the cluster's copy at round {}", round_of(&copy)));
                }
                sync_back(hub, &spokes[cluster], &name, last.as_deref(), true).await
            },
        )
        .await;
    }
}

/// The uids of the ManifestWorks in cluster2's namespace on the hub.
async fn works(api: &Api<ManifestWork>) -> BTreeMap<String, String> {
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| {
            (
                w.metadata.name.unwrap_or_default(),
                w.metadata.uid.unwrap_or_default(),
            )
        })
        .collect()
}

/// The spec of each Application nobody touches, on the hub and on its
/// cluster.
async fn still_specs(
    hub: &Api<DynamicObject>,
    spokes: &BTreeMap<&str, Api<DynamicObject>>,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for c in CLUSTERS {
        let name = still(c);
        out.push((
            format!("hub/{name}"),
            to_value(&hub.get(&name).await.unwrap())["spec"].clone(),
        ));
        out.push((
            format!("{c}/{name}"),
            to_value(&spokes[c].get(&name).await.unwrap())["spec"].clone(),
        ));
    }
    out
}

/// What every step must leave: no copy deleted or recreated or taken back
/// to an older round, every sync asked ran once, the untouched ones carry
/// no operation, the ManifestWorks of before are the same objects.
fn check(
    step: &str,
    record: &Record,
    asked: &Mutex<Asked>,
    works_before: &BTreeMap<String, String>,
    works_now: &BTreeMap<String, String>,
) {
    let all = record.lock().unwrap();
    let asked = asked.lock().unwrap();
    for (name, cluster) in names() {
        let seen = all
            .get(&(cluster.to_string(), name.clone()))
            .unwrap_or_else(|| panic!("{step}: the watch on {cluster} saw {name}"));
        assert_eq!(
            seen.uids.len(),
            1,
            "{step}: {cluster}/{name} was recreated: {seen:?}"
        );
        assert!(
            !seen.deleted,
            "{step}: {cluster}/{name} was deleted: {seen:?}"
        );
        assert!(
            seen.rounds.windows(2).all(|w| w[0] <= w[1]),
            "{step}: {cluster}/{name} was taken back to an older spec: rounds {:?}",
            seen.rounds
        );
        if name.starts_with("still-") {
            assert!(
                seen.operations.is_empty(),
                "{step}: {cluster}/{name}, which nobody touched, got an operation: {seen:?}"
            );
            assert!(
                seen.runs.is_empty(),
                "{step}: {cluster}/{name} was synced: {seen:?}"
            );
        }
        for sync in asked.syncs.get(&name).into_iter().flatten() {
            let runs = seen.runs.get(sync).map_or(0, BTreeSet::len);
            assert_eq!(
                runs, 1,
                "{step}: sync {sync} of {cluster}/{name} ran {runs} times: {:?}",
                seen.runs
            );
        }
        assert!(
            seen.operations
                .keys()
                .all(|s| s.is_empty() || asked.syncs.get(&name).is_some_and(|a| a.contains(s))),
            "{step}: {cluster}/{name} got an operation nobody asked for: {:?}",
            seen.operations
        );
    }
    for (name, uid) in works_before {
        assert_eq!(
            works_now.get(name),
            Some(uid),
            "{step}: ManifestWork cluster2/{name} was replaced or removed (before: {works_before:?}, now: {works_now:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_helm_upgrade_and_rollback_under_load_lose_nothing_and_run_nothing_twice() {
    testenv::init_tracing();
    let started = Instant::now();
    let phase = |name: &str| eprintln!("[{:>4}s] {name}", started.elapsed().as_secs());
    let previous = paths::previous_release();
    assert_ne!(
        previous, CURRENT,
        "versions.env's PREVIOUS_RELEASE names the release before this one"
    );
    let stack = Stack::start(
        StackOptions {
            install: Install::PreviousChart,
            ..StackOptions::default()
        },
        &|step: &str| eprintln!("stack: {step}"),
    )
    .await
    .expect("the hub, clusters, Argo CD and the previous release of argocd-pull start");
    let hub_client = stack.hub().client().await.unwrap();
    let hub: Api<DynamicObject> =
        Api::namespaced_with(hub_client.clone(), NS, &application_resource());
    let mut spokes = BTreeMap::new();
    for c in CLUSTERS {
        let api: Api<DynamicObject> = Api::namespaced_with(
            stack.cluster(c).client().await.unwrap(),
            NS,
            &application_resource(),
        );
        spokes.insert(c, api);
    }
    let states = rolled_to(&stack, &previous, &previous, false, Instant::now()).await;
    phase(&format!(
        "the previous release runs from its chart: {}",
        states.join("; ")
    ));

    // HUB_CA, from the moment the hub-controller published it.
    let configs: Api<AddOnDeploymentConfig> =
        Api::namespaced(hub_client.clone(), stack::HUB_NAMESPACE);
    let ca_lost = Arc::new(Mutex::new(Vec::<String>::new()));
    let ca_watch = {
        let lost = ca_lost.clone();
        let configs = configs.clone();
        tokio::spawn(async move {
            let mut had = false;
            let mut events = watcher(configs, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event else {
                    continue;
                };
                let has = c
                    .spec
                    .customized_variables
                    .iter()
                    .flatten()
                    .any(|v| v.name == HUB_CA);
                if had && !has {
                    lost.lock()
                        .unwrap()
                        .push(c.metadata.resource_version.clone().unwrap_or_default());
                }
                had |= has;
            }
        })
    };

    phase("the Applications");
    stack
        .apply(&paths::workspace_dir().join("example/placement.yaml"))
        .await
        .unwrap();
    stack.wait_placement(NS, "guestbook", 2).await.unwrap();
    let repo = stack.repo.url().to_string();
    for (name, cluster) in names() {
        stack
            .cluster(cluster)
            .ensure_namespace(&name)
            .await
            .unwrap();
    }
    for (name, cluster) in names() {
        // No automated sync: only the syncs this test asks for run. The
        // destination namespace was made beforehand, as a platform team would.
        let app = stack::application(&name, cluster, &repo, &name, 0);
        hub.create(&PostParams::default(), &app).await.unwrap();
    }
    for (name, cluster) in names() {
        wait::exists(&spokes[cluster], &name, TIMEOUT).await;
    }
    let record: Record = Arc::default();
    let watches: Vec<_> = CLUSTERS
        .iter()
        .map(|c| watch_copies(c, spokes[c].clone().into_client(), record.clone()))
        .collect();
    let cluster2_works: Api<ManifestWork> = Api::namespaced(hub_client.clone(), "cluster2");
    let asked = Arc::new(Mutex::new(Asked::default()));
    let specs = still_specs(&hub, &spokes).await;

    let chart = helm::chart().display().to_string();
    let values = stack.helm_values().display().to_string();
    let keep_agents = format!("agent.image.tag={previous}");
    // The hub first (the agents kept on the previous release, as
    // docs/operations.md orders it), then the agents, then back to the
    // first revision in one step: (step, helm's arguments, the hub's
    // release after it, the agents', whether this build's template renders
    // the agents).
    let steps = [
        (
            "the hub upgraded",
            vec![
                "upgrade",
                helm::RELEASE,
                &chart,
                "-f",
                &values,
                "--set",
                &keep_agents,
            ],
            CURRENT,
            previous.as_str(),
            true,
        ),
        (
            "the agents upgraded",
            vec!["upgrade", helm::RELEASE, &chart, "-f", &values],
            CURRENT,
            CURRENT,
            true,
        ),
        (
            "the rollback",
            vec!["rollback", helm::RELEASE, "1"],
            previous.as_str(),
            previous.as_str(),
            false,
        ),
    ];
    for (step, command, hub_release, agent_release, current_template) in steps {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let before = asked.lock().unwrap().changes;
        let syncs_before: usize = asked.lock().unwrap().syncs.values().map(Vec::len).sum();
        let works_before = works(&cluster2_works).await;
        let loader = tokio::spawn(load(hub.clone(), spokes.clone(), asked.clone(), stopped));
        tokio::time::sleep(Duration::from_secs(3)).await;
        phase(&format!("{step}: helm {}", command.join(" ")));
        let t0 = Instant::now();
        helm::helm(stack.hub(), &command)
            .await
            .unwrap_or_else(|e| panic!("helm {step}: {e}"));
        let states = rolled_to(&stack, hub_release, agent_release, current_template, t0).await;
        let rolled = t0.elapsed();
        // Load keeps flowing a little on the new release, then stops.
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.send(true).unwrap();
        loader.await.unwrap();
        flowed(&hub, &spokes, &asked).await;
        let (changes, syncs) = {
            let a = asked.lock().unwrap();
            (
                a.changes - before,
                a.syncs.values().map(Vec::len).sum::<usize>() - syncs_before,
            )
        };
        phase(&format!(
            "{step}: the hub on {hub_release}, the agents on {agent_release} after {:.1}s; on the way: {}; meanwhile {changes} changes and {syncs} syncs flowed, each change on its cluster and each sync run once",
            rolled.as_secs_f64(),
            states.join("; ")
        ));
        let works_now = works(&cluster2_works).await;
        eprintln!(
            "  ManifestWorks for cluster2 after it: {:?}",
            works_now.keys().collect::<Vec<_>>()
        );
        check(step, &record, &asked, &works_before, &works_now);
        assert_eq!(
            still_specs(&hub, &spokes).await,
            specs,
            "{step}: an Application nobody touched was rewritten"
        );
        assert!(
            ca_lost.lock().unwrap().is_empty(),
            "{step}: HUB_CA left the AddOnDeploymentConfig at resourceVersions {:?}",
            ca_lost.lock().unwrap()
        );
        let total: usize = asked.lock().unwrap().syncs.values().map(Vec::len).sum();
        assert!(
            syncs > 0 && changes > 0,
            "{step}: the load flowed ({changes} changes, {syncs} syncs; {total} syncs in all)"
        );
    }
    ca_watch.abort();
    for w in watches {
        w.abort();
    }
    phase("done");
}
