//! Capability `projects`: the agent keeps on its cluster the AppProjects
//! and credentials the hub sends, and nothing the hub may not send. Against
//! a real API server, as the agent's service account with exactly the RBAC
//! `argocd-pull-addon` renders for managed mode.

use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::appproject_resource;
use argocd_pull_proto::v1::{AckOutcome, AgentMessage, ProjectSet, agent_message};
use argocd_pull_runtime::shutdown;
use argocd_pull_spoke_agent::projects::{PROJECT_SET_LABEL, Projects};
use argocd_pull_spoke_agent::state::AgentState;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::wait;

mod common;
use common::{ARGOCD, managed_cluster};

const TIMEOUT: Duration = Duration::from_secs(30);

fn project(name: &str, repos: &[&str]) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": { "name": name, "namespace": "hub-side" },
        "spec": { "sourceRepos": repos,
                  "destinations": [{ "server": "https://kubernetes.default.svc", "namespace": "*" }] },
    })
}

fn credential(name: &str, password: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": "hub-side",
                      "labels": { "argocd.argoproj.io/secret-type": "repository" } },
        "type": "Opaque",
        "data": { "project": "dGVhbQ==", "password": password },
    })
}

fn set(version: &str, objects: &[Value]) -> ProjectSet {
    ProjectSet {
        version: version.into(),
        objects_json: objects
            .iter()
            .map(|o| serde_json::to_vec(o).unwrap())
            .collect(),
    }
}

/// The agent's answer to the set of `version`.
async fn answer(state: &AgentState, version: &str) -> (AckOutcome, String) {
    wait::until(&format!("the answer to {version}"), TIMEOUT, || async {
        state
            .next_messages(1, 100)
            .into_iter()
            .find_map(|m: AgentMessage| match m.kind {
                Some(agent_message::Kind::ProjectSetAck(a)) if a.version == version => {
                    Some((AckOutcome::try_from(a.outcome).unwrap(), a.message))
                }
                _ => None,
            })
            .ok_or("no answer yet")
    })
    .await
}

#[tokio::test]
async fn the_agent_keeps_what_the_hub_sends_reverts_edits_and_touches_nothing_else() {
    let (cluster, kubeconfig) =
        managed_cluster("agent-projects", "agent-projects.kubeconfig").await;
    let admin = cluster.client().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ARGOCD);
    let projects: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), ARGOCD, &appproject_resource());
    // Argo CD's own Secret, and one a cluster admin made under a name the
    // hub also uses.
    for (name, value) in [("argocd-secret", "c2VjcmV0"), ("local-repo", "bG9jYWw=")] {
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": { "name": name, "namespace": ARGOCD },
                    "data": { "password": value },
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }

    let state = Arc::new(AgentState::default());
    // A stream whose hub negotiated `projects`: it takes the answers.
    state.attach(
        1,
        [argocd_pull_proto::version::CAPABILITY_PROJECTS.to_string()].into(),
    );
    let agent = Projects::new(
        testenv::client_for(&kubeconfig).await.unwrap(),
        ARGOCD,
        state.clone(),
    );
    let (stop, down) = shutdown::channel();
    let task = tokio::spawn(agent.clone().run(down));

    agent.set(&set(
        "v1",
        &[
            project("team", &["https://git.example/team.git"]),
            credential("team-repo", "czNjcmV0"),
            credential("local-repo", "aGlqYWNr"),
            // What a hostile hub might try: overwrite Argo CD's own Secret.
            json!({ "apiVersion": "v1", "kind": "Secret",
                    "metadata": { "name": "argocd-secret" }, "data": { "password": "b3ducw==" } }),
        ],
    ));
    let (outcome, message) = answer(&state, "v1").await;
    assert_eq!(outcome, AckOutcome::Rejected, "{message}");
    assert!(
        message.contains("Secret argocd-secret is not a repository or repo-creds Secret")
            && message.contains(
                "Secret argocd/local-repo exists on the cluster and argocd-pull did not create it"
            ),
        "{message}"
    );
    let p = projects.get("team").await.unwrap();
    assert_eq!(
        p.data["spec"]["sourceRepos"],
        json!(["https://git.example/team.git"])
    );
    assert_eq!(
        p.labels().get(PROJECT_SET_LABEL).map(String::as_str),
        Some("true")
    );
    let repo = secrets.get("team-repo").await.unwrap();
    assert_eq!(repo.data.unwrap()["password"].0, b"s3cret");
    for (name, untouched) in [
        ("argocd-secret", b"secret".as_slice()),
        ("local-repo", b"local"),
    ] {
        let s = secrets.get(name).await.unwrap();
        assert_eq!(
            s.data.unwrap()["password"].0,
            untouched,
            "{name} was written"
        );
    }

    // An edit on the cluster is reverted.
    secrets
        .patch(
            "team-repo",
            &PatchParams::apply("cluster-admin").force(),
            &Patch::Apply(json!({ "apiVersion": "v1", "kind": "Secret",
                                   "data": { "password": "ZWRpdGVk" } })),
        )
        .await
        .unwrap();
    wait::until("the edited credential reverted", TIMEOUT, || async {
        let s = secrets.get("team-repo").await.map_err(|e| e.to_string())?;
        let pw = s.data.unwrap_or_default()["password"].0.clone();
        (pw == b"s3cret")
            .then_some(())
            .ok_or(String::from_utf8_lossy(&pw).to_string())
    })
    .await;

    // The hub stops listing the credential: deleted; the project stays
    // (an Application being deleted may still need it).
    agent.set(&set(
        "v2",
        &[project("team", &["https://git.example/team.git"])],
    ));
    assert_eq!(answer(&state, "v2").await.0, AckOutcome::Applied);
    wait::gone(&secrets, "team-repo", TIMEOUT).await;
    assert!(projects.get_opt("team").await.unwrap().is_some());
    assert!(secrets.get_opt("local-repo").await.unwrap().is_some());
    assert!(secrets.get_opt("argocd-secret").await.unwrap().is_some());

    stop.fire();
    task.await.unwrap();
}
