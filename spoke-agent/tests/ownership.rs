//! The agent never overwrites or deletes an Application it did not deliver
//! for the hub Application a message is about, and says so to the hub; and
//! the RBAC the addon gives it is all it needs and no more. Against a real
//! API server, with the agent's worker running as the agent's service
//! account with exactly the RBAC `argocd-pull-addon` renders.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_addon::{AGENT_NAME, AGENT_NAMESPACE};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_proto::owner::{self, Holder};
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, ApplicationUpsert, ObjectKey, ObjectMeta, OperationRequest,
    RefreshRequest, agent_message, operation_request, status_report,
};
use argocd_pull_spoke_agent::Mode;
use argocd_pull_spoke_agent::metrics::AgentMetrics;
use argocd_pull_spoke_agent::state::{AgentState, Instruction};
use argocd_pull_spoke_agent::worker::Worker;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::{CrdSet, wait};

mod common;
use common::{ARGOCD, agent_kubeconfig, install_rbac, managed_cluster};

const TIMEOUT: Duration = Duration::from_secs(30);

fn kubectl(kubeconfig: &Path, args: &[&str]) -> bool {
    let out = std::process::Command::new(testenv::paths::bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["auth", "can-i"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

fn application(name: &str, path: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": ARGOCD },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://git.example.com/r.git", "path": path },
            "destination": { "server": "https://kubernetes.default.svc" },
        },
    })
}

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: ARGOCD.into(),
        name: name.into(),
    }
}

struct Agent {
    worker: Arc<Worker>,
    state: Arc<AgentState>,
    seq: u64,
    _watch: tokio::task::JoinHandle<()>,
}

impl Agent {
    /// The agent on the shared test cluster `cluster`, as its service
    /// account (with a kubeconfig written as `kubeconfig`), and the
    /// cluster's Applications as its admin sees them.
    async fn on(cluster: &str, kubeconfig: &str) -> (Self, Api<Application>) {
        let (cluster, kubeconfig) = managed_cluster(cluster, kubeconfig).await;
        let admin = Api::namespaced_with(
            cluster.client().await.unwrap(),
            ARGOCD,
            &application_resource(),
        );
        let agent = Self::start(testenv::client_for(&kubeconfig).await.unwrap()).await;
        (agent, admin)
    }

    /// The agent's worker and its watch of managed Applications, as
    /// `run_agent` wires them, on `client`.
    async fn start(client: kube::Client) -> Self {
        let ar = application_resource();
        let writer = reflector::store::Writer::new(ar.clone());
        let store = writer.as_reader();
        let api = Api::<Application>::all_with(client.clone(), &ar);
        let config = watcher::Config::default().labels(&format!("{}=true", keys::HUB_MANAGED));
        let watch = tokio::spawn(async move {
            let events = reflector(writer, watcher::watcher(api, config)).default_backoff();
            tokio::pin!(events);
            while events.next().await.is_some() {}
        });
        store.wait_until_ready().await.unwrap();
        let state = Arc::new(AgentState::default());
        state.attach(1, Default::default());
        let mut registry = prometheus_client::registry::Registry::default();
        let worker = Arc::new(Worker::new(
            client,
            state.clone(),
            store,
            Mode::Managed,
            AgentMetrics::register(&mut registry),
        ));
        Self {
            worker,
            state,
            seq: 0,
            _watch: watch,
        }
    }

    /// Carries out one instruction and returns the acknowledgement.
    async fn instruct(&mut self, name: &str, instruction: Instruction) -> (AckOutcome, String) {
        let (outcome, message, _) = self.instruct_all(name, instruction).await;
        (outcome, message)
    }

    /// Also every message it queued for the hub.
    async fn instruct_all(
        &mut self,
        name: &str,
        instruction: Instruction,
    ) -> (AckOutcome, String, Vec<AgentMessage>) {
        self.seq += 1;
        self.state.instruct(key(name), self.seq, instruction);
        self.worker.reconcile(&key(name)).await;
        let all = self.acks();
        let (outcome, message) = all
            .iter()
            .cloned()
            .find_map(|m| match m.kind {
                Some(agent_message::Kind::ObjectAck(a)) if a.seq == self.seq => {
                    Some((AckOutcome::try_from(a.outcome).unwrap(), a.message))
                }
                _ => None,
            })
            .expect("an acknowledgement");
        (outcome, message, all)
    }

    async fn upsert(&mut self, name: &str, hub_uid: &str, path: &str) -> (AckOutcome, String) {
        let u = ApplicationUpsert {
            key: Some(key(name)),
            seq: self.seq + 1,
            meta: Some(ObjectMeta {
                uid: hub_uid.into(),
                version: format!("{hub_uid}.{path}"),
                ..Default::default()
            }),
            application_json: serde_json::to_vec(&application(name, path)).unwrap(),
            trace_parent: String::new(),
        };
        self.instruct(name, Instruction::Upsert(Arc::new(u))).await
    }

    /// Runs the refresh `id` from hub Application `hub_uid` on `name` and
    /// returns the answer.
    async fn refresh(&self, name: &str, id: &str, hub_uid: &str) -> (AckOutcome, String) {
        let op = OperationRequest {
            operation_id: id.into(),
            key: Some(key(name)),
            kind: Some(operation_request::Kind::Refresh(RefreshRequest { kind: 1 })),
            hub_uid: hub_uid.into(),
        };
        self.state.add_op(key(name), op);
        self.worker.reconcile(&key(name)).await;
        self.acks()
            .into_iter()
            .find_map(|m| match m.kind {
                Some(agent_message::Kind::OperationAck(a)) => {
                    Some((AckOutcome::try_from(a.outcome).unwrap(), a.message))
                }
                _ => None,
            })
            .expect("an operation acknowledgement")
    }

    /// Everything queued for the hub, status reports acknowledged as the
    /// hub does (one per key is in flight at a time).
    fn acks(&self) -> Vec<AgentMessage> {
        let mut all = Vec::new();
        loop {
            let batch = self.state.next_messages(1, 1000);
            if batch.is_empty() {
                return all;
            }
            for m in &batch {
                if let Some(agent_message::Kind::Status(s)) = &m.kind {
                    self.state.acked(s.key.as_ref().unwrap(), s.seq);
                }
            }
            all.extend(batch);
        }
    }
}

/// The answer is a refusal naming `holder` as the holder of the Application.
#[track_caller]
fn assert_held_by((outcome, message): (AckOutcome, String), holder: Holder) {
    assert_eq!(outcome, AckOutcome::Rejected, "{message}");
    assert_eq!(owner::parse_conflict(&message), Some(holder), "{message}");
}

async fn resource_version(api: &Api<Application>, name: &str) -> String {
    api.get(name).await.unwrap().resource_version().unwrap()
}

#[tokio::test]
async fn the_agent_leaves_what_it_did_not_deliver_alone_and_says_who_holds_it() {
    let (mut agent, admin) = Agent::on("agent-ownership", "agent-managed.kubeconfig").await;

    // An Application created on the cluster, not by argocd-pull.
    admin
        .create(
            &PostParams::default(),
            &serde_json::from_value(application("local", "mine")).unwrap(),
        )
        .await
        .unwrap();
    let local_rv = resource_version(&admin, "local").await;
    assert_held_by(
        agent.upsert("local", "hub-a", "theirs").await,
        Holder::NotArgocdPull,
    );
    assert_eq!(
        resource_version(&admin, "local").await,
        local_rv,
        "not touched"
    );

    // Delivered for hub Application a; b's upsert of the same name is refused
    // and names a as the holder.
    let (outcome, message) = agent.upsert("gb", "hub-a", "a").await;
    assert_eq!(outcome, AckOutcome::Applied, "{message}");
    let gb_rv = wait::until("the agent to see its own write", TIMEOUT, || async {
        let a = admin.get("gb").await.map_err(|e| e.to_string())?;
        if agent.worker.cache().get(&key("gb")).is_some() {
            Ok(a.resource_version().unwrap())
        } else {
            Err("not in the cache yet".to_string())
        }
    })
    .await;
    assert_held_by(
        agent.upsert("gb", "hub-b", "b").await,
        Holder::HubApplication("hub-a".into()),
    );
    let gb = admin.get("gb").await.unwrap();
    assert_eq!(gb.resource_version().unwrap(), gb_rv, "not touched");
    assert_eq!(gb.data["spec"]["source"]["path"], "a");

    // Deleting the refused one (or anything for a hub Application that
    // holds nothing here) leaves the cluster alone.
    for (name, hub_uid) in [("gb", "hub-b"), ("local", "hub-a")] {
        let rv = resource_version(&admin, name).await;
        let (outcome, _, sent) = agent
            .instruct_all(
                name,
                Instruction::Delete {
                    hub_uid: hub_uid.into(),
                },
            )
            .await;
        assert_eq!(
            outcome,
            AckOutcome::Applied,
            "nothing of {hub_uid}'s to delete"
        );
        // What the hub last hears about that key: nothing there for it
        // (gone), or the holder's Application, which names the holder.
        let last = sent
            .iter()
            .rev()
            .filter_map(|m| match &m.kind {
                Some(agent_message::Kind::Status(s)) if s.key == Some(key(name)) => s.state.clone(),
                _ => None,
            })
            .next();
        match (name, last) {
            ("gb", Some(status_report::State::Observed(o))) => assert_eq!(o.hub_uid, "hub-a"),
            ("local", Some(status_report::State::Gone(_))) => {}
            (_, other) => panic!("{name} after {hub_uid}'s delete: {other:?}"),
        }
        assert_eq!(
            resource_version(&admin, name).await,
            rv,
            "{name} not touched"
        );
        let (outcome, _) = agent
            .instruct(
                name,
                Instruction::Release {
                    hub_uid: hub_uid.into(),
                },
            )
            .await;
        assert_eq!(outcome, AckOutcome::Applied);
        assert_eq!(
            resource_version(&admin, name).await,
            rv,
            "{name} not released"
        );
    }

    // A command never reaches an Application the agent does not manage.
    assert_held_by(
        agent.refresh("local", "op-1", "hub-a").await,
        Holder::NotArgocdPull,
    );
    assert_eq!(resource_version(&admin, "local").await, local_rv);

    // Its own it deletes, as the service account.
    let (outcome, message) = agent
        .instruct(
            "gb",
            Instruction::Delete {
                hub_uid: "hub-a".into(),
            },
        )
        .await;
    assert_eq!(outcome, AckOutcome::Applied, "{message}");
    wait::until("gb deleted", TIMEOUT, || async {
        match admin.get_opt("gb").await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|a| a.is_some()))),
        }
    })
    .await;
}

/// A command names the hub Application it is for, and the
/// agent runs it only on the copy it applied for that one; a hub of the
/// release before names none, and any managed copy takes it, as then.
#[tokio::test]
async fn a_command_runs_only_on_the_copy_applied_for_its_hub_application() {
    let (mut agent, admin) = Agent::on("agent-ownership", "agent-commands.kubeconfig").await;
    let (outcome, message) = agent.upsert("owned", "hub-owner", "app").await;
    assert_eq!(outcome, AckOutcome::Applied, "{message}");
    let rv = resource_version(&admin, "owned").await;

    // For another hub Application (the hub's owner of the key changed, or
    // a replica decided from an older view): refused, nothing written.
    assert_held_by(
        agent.refresh("owned", "op-other", "hub-other").await,
        Holder::HubApplication("hub-owner".into()),
    );
    assert_eq!(resource_version(&admin, "owned").await, rv, "not touched");
    // For its owner: run.
    let (outcome, message) = agent.refresh("owned", "op-owner", "hub-owner").await;
    assert_eq!(outcome, AckOutcome::Applied, "{message}");
    let refreshed = admin.get("owned").await.unwrap();
    assert_eq!(
        refreshed
            .annotations()
            .get("argocd.argoproj.io/refresh")
            .map(String::as_str),
        Some("normal")
    );
    // From a hub of the release before (no uid): any managed copy, as then.
    admin
        .patch(
            "owned",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "annotations": { "argocd.argoproj.io/refresh": null } } }),
            ),
        )
        .await
        .unwrap();
    let (outcome, message) = agent.refresh("owned", "op-old-hub", "").await;
    assert_eq!(outcome, AckOutcome::Applied, "{message}");
}

#[tokio::test]
async fn the_agents_rbac_allows_what_it_calls_and_nothing_else() {
    testenv::init_tracing();
    let cluster = testenv::shared("agent-rbac", CrdSet::Managed)
        .await
        .unwrap();
    cluster.ensure_namespace(ARGOCD).await.unwrap();
    let kubeconfig = agent_kubeconfig(cluster, "agent-rbac.kubeconfig");
    let apps = "applications.argoproj.io";
    let never: &[&[&str]] = &[
        &["update", apps, "-n", ARGOCD],
        &["deletecollection", apps, "-n", ARGOCD],
        &["create", apps, "-n", "default"],
        &["patch", apps, "-n", "default"],
        &["delete", apps, "-n", "default"],
        &["list", "secrets", "--all-namespaces"],
        &["delete", "appprojects.argoproj.io", "-n", ARGOCD],
        &["patch", "appprojects.argoproj.io", "-n", "default"],
        &["patch", "secrets", "-n", "default"],
        &["get", "secrets", "-n", AGENT_NAMESPACE],
        &["create", "pods", "-n", AGENT_NAMESPACE],
        &["update", "appprojects.argoproj.io", "-n", ARGOCD],
        &["create", "applicationsets.argoproj.io", "-n", ARGOCD],
        &["create", "rolebindings", "-n", ARGOCD],
        &["escalate", "roles", "-n", ARGOCD],
    ];
    for (mode, allowed, denied) in [
        (
            "managed",
            &[
                &["list", apps, "--all-namespaces"][..],
                &["watch", apps, "--all-namespaces"],
                &["get", apps, "-n", ARGOCD],
                &["create", apps, "-n", ARGOCD],
                &["patch", apps, "-n", ARGOCD],
                &["delete", apps, "-n", ARGOCD],
                // The AppProjects and credentials the hub sends.
                &["patch", "appprojects.argoproj.io", "-n", ARGOCD],
                &["watch", "appprojects.argoproj.io", "-n", ARGOCD],
                &["get", "secrets", "-n", ARGOCD],
                &["patch", "secrets", "-n", ARGOCD],
                &["delete", "secrets", "-n", ARGOCD],
            ][..],
            &[][..],
        ),
        (
            "autonomous",
            &[
                &["list", apps, "-n", ARGOCD][..],
                &["watch", apps, "-n", ARGOCD],
                &["get", apps, "-n", ARGOCD],
                &["patch", apps, "-n", ARGOCD],
            ][..],
            &[
                &["create", apps, "-n", ARGOCD][..],
                &["delete", apps, "-n", ARGOCD],
                &["patch", "appprojects.argoproj.io", "-n", ARGOCD],
                &["get", "secrets", "-n", ARGOCD],
                &["patch", "secrets", "-n", ARGOCD],
            ][..],
        ),
    ] {
        // What OCM does on a change of mode: the other binding goes.
        let admin = cluster.client().await.unwrap();
        let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> = Api::namespaced(admin, ARGOCD);
        for other in ["managed", "autonomous"].iter().filter(|m| **m != mode) {
            let _ = bindings
                .delete(&format!("{AGENT_NAME}-{other}"), &Default::default())
                .await;
        }
        install_rbac(cluster, mode).await;
        for a in allowed {
            assert!(kubectl(&kubeconfig, a), "{mode}: the agent needs {a:?}");
        }
        for d in denied.iter().chain(never) {
            assert!(!kubectl(&kubeconfig, d), "{mode}: the agent may {d:?}");
        }
    }
}
