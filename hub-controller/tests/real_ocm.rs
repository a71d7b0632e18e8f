//! The hub-controller against real OCM: a hub running OCM's controllers,
//! managed clusters joined to it for real, each with the real work agent.
//! Nothing plays the work agent here: the delivered Application is applied
//! onto the managed API server by the work agent, and its status comes back
//! through the work agent's real feedback. The test plays only the spoke's
//! Argo CD (not in the harness yet): it writes the Application's status on
//! the managed cluster, clears the operation it ran, and releases its
//! finalizer when the Application is deleted.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use argocd_pull_hub_controller::render::work::applied_on_spoke;
use argocd_pull_hub_controller::status::CONDITION;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::ocm::{Fleet, JoinOptions};
use testenv::{Cluster, wait};

mod common;
use common::ocm::place_everywhere;
use common::{Binary, app, apps_api, set_source, writes_until};

const TIMEOUT: Duration = Duration::from_secs(120);
/// Where the spoke's Argo CD keeps its Applications.
const SPOKE_NAMESPACE: &str = "argocd";
/// The field manager Argo CD's application-controller writes status with.
const ARGOCD: &str = "argocd-application-controller";

/// A fleet with the hub-controller binary running against its hub, and a
/// team namespace whose real Placement selects every managed cluster.
struct Setup {
    fleet: Fleet,
    controller: Option<Binary>,
    ns: String,
}

async fn setup(clusters: &[(&str, JoinOptions)], controller_args: &[&str]) -> Setup {
    let this_build = Path::new(env!("CARGO_BIN_EXE_hub-controller"));
    setup_from(this_build, clusters, controller_args).await
}

/// [`setup`] with another build of the hub-controller running.
async fn setup_from(
    binary: &Path,
    clusters: &[(&str, JoinOptions)],
    controller_args: &[&str],
) -> Setup {
    testenv::init_tracing();
    let fleet = Fleet::start("hub", clusters)
        .await
        .expect("the hub starts and the clusters join");
    let hub = fleet.hub.cluster();
    let client = hub.client().await.unwrap();
    hub.ensure_namespace("argocd").await.unwrap();
    for managed in &fleet.clusters {
        managed.ensure_namespace(SPOKE_NAMESPACE).await.unwrap();
    }

    // Authorization by the real placement controller's decisions: the team
    // namespace binds OCM's `global` cluster set and places on all of it.
    let ns = hub.namespace("team").await.unwrap();
    place_everywhere(&client, &ns).await;

    File::create(hub.dir().join("hub-controller.log")).unwrap();
    let mut setup = Setup {
        fleet,
        controller: None,
        ns,
    };
    setup.start_controller(binary, controller_args);
    setup
}

impl Setup {
    /// Stops the running hub-controller with SIGTERM, as a rolling update
    /// stops a pod.
    async fn stop_controller(&mut self) {
        let mut old = self.controller.take().expect("a hub-controller runs");
        let status = testenv::net::terminate(&mut old.child, TIMEOUT).await;
        assert!(status.success(), "the hub-controller stopped with {status}");
    }

    /// Starts `binary` as the hub-controller, its log appended to the
    /// same file as the ones before it.
    fn start_controller(&mut self, binary: &Path, controller_args: &[&str]) {
        assert!(self.controller.is_none(), "one hub-controller at a time");
        let hub = self.fleet.hub.cluster();
        let log = OpenOptions::new()
            .append(true)
            .open(hub.dir().join("hub-controller.log"))
            .unwrap();
        let mut args = vec!["--leader-elect=false"];
        args.extend(controller_args);
        self.controller = Some(Binary::start_from(binary, hub.kubeconfig(), &args, log));
    }

    fn controller_log(&self) -> String {
        let text =
            std::fs::read_to_string(self.fleet.hub.cluster().dir().join("hub-controller.log"))
                .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// Waits for argocd-pull's condition on hub Application `name`; its message.
async fn condition_message(apps: &Api<Application>, name: &str, what: &str) -> String {
    wait::until(what, TIMEOUT, || async {
        let a = apps.get(name).await.map_err(|e| e.to_string())?;
        a.data
            .pointer("/status/conditions")
            .and_then(|c| c.as_array())
            .and_then(|cs| cs.iter().find(|c| c["type"] == CONDITION))
            .and_then(|c| c["message"].as_str().map(String::from))
            .ok_or_else(|| format!("{:?}", a.data.get("status")))
    })
    .await
}

fn spoke_apps(client: &kube::Client) -> Api<Application> {
    Api::namespaced_with(client.clone(), SPOKE_NAMESPACE, &application_resource())
}

/// What the work agent's feedback brings back beyond the scalar status
/// (health, sync, revision, operation phase and start).
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    /// Nothing: the controller asks for nothing more (no `--raw-feedback`).
    Nothing,
    /// The messages, which are strings, but not the conditions, a list that
    /// only a work agent with `RawFeedbackJsonString` returns (as JsonRaw).
    Messages,
    /// Messages and conditions.
    MessagesAndConditions,
}

/// Delivers one Application to `managed` through the real work agent,
/// reports status from there as the spoke's Argo CD would, checks what comes
/// back on the hub copy, updates and deletes it.
async fn round_trip(setup: &Setup, managed: &Cluster, extra: Extra) {
    let name = managed.name();
    let hub = setup.fleet.hub.cluster().client().await.unwrap();
    let apps = apps_api(&hub, &setup.ns);
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), name);
    let spoke = spoke_apps(&managed.client().await.unwrap());
    let app_name = format!("guestbook-{name}");

    // The real registration agent reports its cluster's URL, a loopback one
    // here: the Argo CD cluster Secret never points at a loopback address
    // (a klusterlet chooses it), so it names the cluster instead.
    assert!(managed.server().starts_with("https://127.0.0.1:"));
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), "argocd");
    let secret = wait::exists(&secrets, &format!("{name}-cluster-secret"), TIMEOUT).await;
    assert_eq!(
        secret.data.unwrap()["server"].0,
        format!("https://{name}").as_bytes(),
        "{name}"
    );

    let annotations = json!({
        keys::MANAGED_CLUSTER: name,
        keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NAMESPACE,
        keys::SKIP_RECONCILE: "true",
    });
    let fields = json!({
        "finalizers": [keys::RESOURCES_FINALIZER],
        "operation": { "sync": { "revision": "HEAD" }, "initiatedBy": { "username": "alice" } }
    });
    apps.create(
        &PostParams::default(),
        &app(&app_name, &setup.ns, annotations, fields),
    )
    .await
    .unwrap();

    // Applied onto the managed API server by the real work agent.
    let delivered = wait::until(&format!("{app_name} on {name}"), TIMEOUT, || async {
        spoke
            .get_opt(&app_name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("not there yet; controller log:\n{}", setup.controller_log()))
    })
    .await;
    let annotations = delivered.metadata.annotations.clone().unwrap_or_default();
    assert!(!annotations.contains_key(keys::SKIP_RECONCILE), "{name}");
    assert!(!annotations.contains_key(keys::MANAGED_CLUSTER), "{name}");
    assert!(
        !delivered
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .contains_key(keys::PULL_LABEL)
    );
    assert_eq!(
        delivered.metadata.finalizers.as_deref(),
        Some(&[keys::RESOURCES_FINALIZER.to_string()][..])
    );
    assert_eq!(delivered.data["spec"]["source"]["path"], "app");
    assert_eq!(delivered.data["operation"]["sync"]["revision"], "HEAD");

    // The spoke's Argo CD runs the operation: it clears `.operation` and
    // reports the result, with the same write.
    let started_at = "2026-11-21T10:00:00Z";
    let resources = json!([
        { "version": "v1", "kind": "Service", "namespace": "guestbook", "name": "guestbook-ui",
          "status": "Synced", "health": { "status": "Healthy" } },
        { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "guestbook",
          "name": "guestbook-ui", "status": "Synced", "health": { "status": "Progressing" } },
    ]);
    let status = json!({
        "health": { "status": "Healthy", "message": "all pods ready" },
        "sync": { "status": "Synced", "revision": "abc123" },
        "operationState": {
            "phase": "Succeeded", "startedAt": started_at, "finishedAt": "2026-11-21T10:00:05Z",
            "message": "successfully synced (all tasks run)",
            "operation": { "sync": { "revision": "HEAD" } }
        },
        "conditions": [{ "type": "SyncError", "message": "one warning",
                         "lastTransitionTime": "2026-11-21T10:00:05Z" }],
        // What the hub's Argo CD UI draws its tree from.
        "resources": resources.clone(),
    });
    let operation_cleared = spoke
        .patch(
            &app_name,
            &PatchParams {
                field_manager: Some(ARGOCD.into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "operation": null, "status": status })),
        )
        .await
        .unwrap();

    // ... and the status comes back through the work agent's feedback.
    let hub_status = wait::until(
        &format!("the spoke's status on the hub copy of {app_name}"),
        TIMEOUT,
        || async {
            let a = apps.get(&app_name).await.map_err(|e| e.to_string())?;
            let s = a.data.get("status").cloned().unwrap_or_default();
            let complete = s.pointer("/health/status") == Some(&json!("Healthy"))
                && (extra != Extra::MessagesAndConditions
                    || (s.get("conditions").is_some_and(|c| c != &json!([]))
                        && s.get("resources").is_some()));
            if complete {
                Ok(s)
            } else {
                let work = works
                    .get_opt(&setup.work_name(&app_name))
                    .await
                    .ok()
                    .flatten()
                    .map(|w| serde_json::to_value(w.status).unwrap());
                Err(format!("hub status {s}\nwork status {work:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        hub_status["sync"]["status"], "Synced",
        "{name}: {hub_status}"
    );
    assert_eq!(
        hub_status["sync"]["revision"], "abc123",
        "{name}: {hub_status}"
    );
    assert_eq!(
        hub_status["operationState"]["phase"], "Succeeded",
        "{name}: {hub_status}"
    );
    assert_eq!(
        hub_status["operationState"]["startedAt"], started_at,
        "{name}: {hub_status}"
    );
    let messages = (
        hub_status["operationState"]["message"].as_str(),
        hub_status["health"]["message"].as_str(),
    );
    if extra == Extra::Nothing {
        assert_eq!(messages, (None, None), "{name}: {hub_status}");
    } else {
        assert_eq!(
            messages,
            (
                Some("successfully synced (all tasks run)"),
                Some("all pods ready")
            ),
            "{name}: {hub_status}"
        );
    }
    let conditions = hub_status["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // The managed resources, for the hub UI's tree, with the gate only.
    if extra == Extra::MessagesAndConditions {
        assert_eq!(hub_status["resources"], resources, "{name}: {hub_status}");
    } else {
        assert!(
            hub_status.get("resources").is_none(),
            "{name}: resources without the gate: {hub_status}"
        );
    }
    if extra == Extra::MessagesAndConditions {
        assert_eq!(conditions.len(), 1, "{name}: {hub_status}");
        assert_eq!(conditions[0]["type"], "SyncError", "{name}: {hub_status}");
        assert_eq!(
            conditions[0]["message"], "one warning",
            "{name}: {hub_status}"
        );
    } else {
        assert!(
            conditions.iter().all(|c| c["type"] != "SyncError"),
            "no conditions without the gate: {hub_status}"
        );
    }
    // Asked for the conditions (--raw-feedback) from a work agent without
    // the gate: the hub copy says so, and what to do.
    if extra == Extra::Messages {
        let message = condition_message(
            &apps,
            &app_name,
            &format!("{name}: the missing feedback explained"),
        )
        .await;
        assert!(
            message.starts_with("StatusFeedbackSyncFailed: ")
                && message.contains("RawFeedbackJsonString=true"),
            "{message}"
        );
    } else {
        assert!(
            conditions.iter().all(|c| c["type"] != CONDITION),
            "{name}: no delivery problem: {hub_status}"
        );
    }

    // The operation has been handed over: it leaves the work, and the work
    // agent never puts it back on the spoke (ignoreFields OnSpokeChange):
    // once it has applied the work without it, no version the spoke's
    // Application went through since Argo CD cleared it has it.
    let work_name = setup.work_name(&app_name);
    wait::until(
        "the work without the operation, applied by the work agent",
        TIMEOUT,
        || async {
            let w = works.get(&work_name).await.map_err(|e| e.to_string())?;
            let manifest = common::first_manifest(&w);
            if let Some(op) = manifest.get("operation") {
                return Err(op.to_string());
            }
            if applied_on_spoke(&w) {
                Ok(())
            } else {
                Err(format!(
                    "generation {:?} not applied yet: {:?}",
                    w.metadata.generation,
                    w.status.and_then(|s| s.conditions)
                ))
            }
        },
    )
    .await;
    assert!(
        apps.get(&app_name)
            .await
            .unwrap()
            .data
            .get("operation")
            .is_none()
    );
    let on_spoke = spoke.get(&app_name).await.unwrap();
    let (from, now) = (
        operation_cleared.resource_version().unwrap(),
        on_spoke.resource_version().unwrap(),
    );
    let since = if from == now {
        vec![]
    } else {
        writes_until(
            &spoke,
            &app_name,
            &from,
            TIMEOUT,
            "the spoke's writes",
            |a| a.resource_version().as_deref() == Some(&now),
        )
        .await
    };
    for version in since.iter().chain([&on_spoke]) {
        assert!(
            version.data.get("operation").is_none(),
            "{name}: the operation came back on the spoke: {:?}",
            version.data
        );
    }
    assert_eq!(on_spoke.data["status"]["health"]["status"], "Healthy");

    // A change on the hub reaches the spoke through the work agent, which
    // leaves the status the spoke's Argo CD wrote alone.
    set_source(&apps, &app_name, "targetRevision", "v2").await;
    let updated = wait::until(&format!("the new revision on {name}"), TIMEOUT, || async {
        let a = spoke.get(&app_name).await.map_err(|e| e.to_string())?;
        if a.data["spec"]["source"]["targetRevision"] == "v2" {
            Ok(a)
        } else {
            Err(a.data["spec"].to_string())
        }
    })
    .await;
    assert_eq!(updated.data["status"]["sync"]["revision"], "abc123");
    let hub_copy = apps.get(&app_name).await.unwrap();
    assert_eq!(hub_copy.data["status"]["health"]["status"], "Healthy");

    // Converged: a status change on the spoke comes back to the hub copy
    // and sets off nothing else: the work is not rewritten, nobody writes
    // the spoke's Application, the hub copy is written once. Two changes in
    // a row, each the proof that the whole way back (the work agent's
    // feedback, the hub-controller) has handled what came before it.
    let settled = wait::until(
        &format!("the new revision applied by {name}'s work agent"),
        TIMEOUT,
        || async {
            let w = works.get(&work_name).await.map_err(|e| e.to_string())?;
            if applied_on_spoke(&w) {
                Ok(w)
            } else {
                Err(format!("{:?}", w.status.and_then(|s| s.conditions)))
            }
        },
    )
    .await;
    let hub_from = apps
        .get(&app_name)
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    // The spoke's Argo CD reports new revisions, each write conditional on
    // the version it last saw: a Conflict is someone else's write.
    let report = |revision: &'static str, version: String| {
        let (spoke, app_name) = (spoke.clone(), app_name.clone());
        async move {
            let written = spoke
                .patch(
                    &app_name,
                    &PatchParams {
                        field_manager: Some(ARGOCD.into()),
                        ..Default::default()
                    },
                    &Patch::Merge(json!({
                        "metadata": { "resourceVersion": version },
                        "status": { "sync": { "revision": revision } },
                    })),
                )
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{app_name} on the spoke was written since version {version}, \
                         by nobody the test plays: {e}"
                    )
                });
            written.resource_version().unwrap()
        }
    };
    let shows = |revision: &'static str| {
        move |a: &Application| a.data.pointer("/status/sync/revision") == Some(&json!(revision))
    };
    let first = report("def456", updated.resource_version().unwrap()).await;
    let arrived = writes_until(
        &apps,
        &app_name,
        &hub_from,
        TIMEOUT,
        "the first new revision on the hub copy",
        shows("def456"),
    )
    .await;
    let arrived = arrived.last().unwrap().resource_version().unwrap();
    let second = report("fed789", first).await;
    let writes = writes_until(
        &apps,
        &app_name,
        &arrived,
        TIMEOUT,
        "the second new revision on the hub copy",
        shows("fed789"),
    )
    .await;
    assert_eq!(
        writes.len(),
        1,
        "{name}: the hub copy was written again between two status changes: {writes:#?}"
    );
    let work = works.get(&work_name).await.unwrap();
    assert_eq!(
        (
            work.metadata.generation,
            &work.metadata.labels,
            &work.metadata.annotations
        ),
        (
            settled.metadata.generation,
            &settled.metadata.labels,
            &settled.metadata.annotations
        ),
        "{name}: the work was rewritten for a status change"
    );
    assert_eq!(
        spoke
            .get(&app_name)
            .await
            .unwrap()
            .resource_version()
            .unwrap(),
        second,
        "{name}: {app_name} on the spoke was written after the spoke's Argo CD"
    );

    // Deleting the hub Application deletes the spoke's through the work
    // agent; the spoke's Argo CD releases its finalizer once it has cleaned
    // up, and only then is the hub's released.
    apps.delete(&app_name, &DeleteParams::default())
        .await
        .unwrap();
    wait::until(
        &format!("{app_name} being deleted on {name}"),
        TIMEOUT,
        || async {
            let a = spoke.get(&app_name).await.map_err(|e| e.to_string())?;
            a.metadata
                .deletion_timestamp
                .map(|_| ())
                .ok_or_else(|| format!("not yet; controller log:\n{}", setup.controller_log()))
        },
    )
    .await;
    assert!(
        apps.get_opt(&app_name).await.unwrap().is_some(),
        "the hub copy waits for the spoke"
    );
    spoke
        .patch(
            &app_name,
            &PatchParams {
                field_manager: Some(ARGOCD.into()),
                ..Default::default()
            },
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    wait::until(
        &format!("{app_name} gone from {name}, its work and the hub"),
        TIMEOUT,
        || async {
            let spoke_left = spoke.get_opt(&app_name).await.map_err(|e| e.to_string())?;
            let work_left = works.get_opt(&work_name).await.map_err(|e| e.to_string())?;
            let hub_left = apps.get_opt(&app_name).await.map_err(|e| e.to_string())?;
            if spoke_left.is_none() && work_left.is_none() && hub_left.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "spoke: {}, work: {}, hub: {:?}",
                    spoke_left.is_some(),
                    work_left.is_some(),
                    hub_left.map(|a| a.metadata.finalizers)
                ))
            }
        },
    )
    .await;
}

impl Setup {
    fn work_name(&self, app_name: &str) -> String {
        format!("{}.{app_name}", self.ns)
    }
}

/// With `--raw-feedback`: cluster1's work agent has `RawFeedbackJsonString`
/// and the conditions and messages come back too; cluster2's has not: the
/// scalar status and the messages still come back, the conditions do not.
#[tokio::test]
async fn status_comes_back_through_the_real_work_agent_with_raw_feedback() {
    let setup = setup(
        &[
            ("cluster1", JoinOptions { raw_feedback: true }),
            (
                "cluster2",
                JoinOptions {
                    raw_feedback: false,
                },
            ),
        ],
        &["--raw-feedback"],
    )
    .await;
    tokio::join!(
        round_trip(
            &setup,
            setup.fleet.cluster("cluster1"),
            Extra::MessagesAndConditions
        ),
        round_trip(&setup, setup.fleet.cluster("cluster2"), Extra::Messages),
    );
}

/// The default: no `--raw-feedback`, a work agent without the gate. Then
/// a mistake only the spoke can see (the Application's namespace does not
/// exist there): the work agent's error shows on the hub copy, and goes once
/// the namespace exists.
#[tokio::test]
async fn status_comes_back_through_the_real_work_agent_by_default() {
    let gate_off = JoinOptions {
        raw_feedback: false,
    };
    let setup = setup(&[("cluster1", gate_off)], &[]).await;
    let managed = setup.fleet.cluster("cluster1");
    round_trip(&setup, managed, Extra::Nothing).await;

    let hub = setup.fleet.hub.cluster().client().await.unwrap();
    let apps = apps_api(&hub, &setup.ns);
    let annotations = json!({
        keys::MANAGED_CLUSTER: "cluster1",
        keys::MANAGED_CLUSTER_APP_NAMESPACE: "argocd-elsewhere",
    });
    apps.create(
        &PostParams::default(),
        &app("misplaced", &setup.ns, annotations, json!({})),
    )
    .await
    .unwrap();
    let message = condition_message(&apps, "misplaced", "the spoke's error on the hub copy").await;
    assert!(
        message.contains(r#"namespaces "argocd-elsewhere" not found"#),
        "{message}"
    );

    managed.ensure_namespace("argocd-elsewhere").await.unwrap();
    let spoke: Api<Application> = Api::namespaced_with(
        managed.client().await.unwrap(),
        "argocd-elsewhere",
        &application_resource(),
    );
    wait::exists(&spoke, "misplaced", TIMEOUT).await;
    wait::until("the condition to clear", TIMEOUT, || async {
        let a = apps.get("misplaced").await.map_err(|e| e.to_string())?;
        let conditions = a.data.pointer("/status/conditions").cloned();
        match conditions {
            Some(c)
                if c.as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == CONDITION)) =>
            {
                Err(c.to_string())
            }
            _ => Ok(()),
        }
    })
    .await;
}

/// What an upgrade must keep of one delivered Application: the uid of its
/// ManifestWork on the hub and of its copy on the cluster (a new uid is a
/// delete and a create).
#[derive(Debug, PartialEq)]
struct Kept {
    work_uid: String,
    spoke_uid: String,
}

async fn kept(works: &Api<ManifestWork>, spoke: &Api<Application>, work: &str, name: &str) -> Kept {
    Kept {
        work_uid: works.get(work).await.unwrap().uid().unwrap(),
        spoke_uid: spoke.get(name).await.unwrap().uid().unwrap(),
    }
}

/// An upgrade of the hub-controller from the previous release
/// (`PREVIOUS_RELEASE` in `test/tools/versions.env`, built from this
/// repository's history) to this build, then a rollback, with the real
/// work agent applying the ManifestWorks the previous release wrote.
/// Each release takes over the other's ManifestWorks in place: no work is
/// recreated and no Application deleted on the cluster (every version the
/// spoke's copies went through is read back from a watch), an operation
/// the spoke's Argo CD ran before the upgrade never comes back, and the
/// changes made while no hub-controller ran, and after each step, arrive.
#[tokio::test]
async fn an_upgrade_and_a_rollback_adopt_the_manifestworks_without_a_delete_on_the_cluster() {
    let previous = testenv::paths::previous_binary("hub-controller").unwrap();
    let this_build = Path::new(env!("CARGO_BIN_EXE_hub-controller"));
    let gate_off = JoinOptions {
        raw_feedback: false,
    };
    let mut setup = setup_from(&previous, &[("cluster1", gate_off)], &[]).await;
    let managed = setup.fleet.cluster("cluster1");
    let hub = setup.fleet.hub.cluster().client().await.unwrap();
    let apps = apps_api(&hub, &setup.ns);
    let works: Api<ManifestWork> = Api::namespaced(hub.clone(), "cluster1");
    let spoke = spoke_apps(&managed.client().await.unwrap());
    let names: Vec<String> = (0..3).map(|i| format!("guestbook-{i}")).collect();

    // The previous release delivers three Applications; the first carries
    // a sync, which the spoke's Argo CD (played here) runs and clears.
    for (i, name) in names.iter().enumerate() {
        let annotations = json!({
            keys::MANAGED_CLUSTER: "cluster1",
            keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NAMESPACE,
            keys::SKIP_RECONCILE: "true",
        });
        let mut fields = json!({ "finalizers": [keys::RESOURCES_FINALIZER] });
        if i == 0 {
            fields["operation"] = json!({ "sync": { "revision": "HEAD" } });
        }
        apps.create(
            &PostParams::default(),
            &app(name, &setup.ns, annotations, fields),
        )
        .await
        .unwrap();
    }
    for name in &names {
        wait::exists(&spoke, name, TIMEOUT).await;
    }
    let synced = &names[0];
    spoke
        .patch(
            synced,
            &PatchParams {
                field_manager: Some(ARGOCD.into()),
                ..Default::default()
            },
            &Patch::Merge(json!({
                "operation": null,
                "status": {
                    "health": { "status": "Healthy" },
                    "sync": { "status": "Synced", "revision": "abc123" },
                    "operationState": {
                        "phase": "Succeeded", "startedAt": "2026-11-27T10:00:00Z",
                        "finishedAt": "2026-11-27T10:00:05Z",
                        "operation": { "sync": { "revision": "HEAD" } }
                    }
                }
            })),
        )
        .await
        .unwrap();
    // The previous release hands the operation over: its work no longer
    // carries it, applied on the cluster.
    let work_name = setup.work_name(synced);
    wait::until(
        "the previous release's work without the operation, applied",
        TIMEOUT,
        || async {
            let w = works.get(&work_name).await.map_err(|e| e.to_string())?;
            if common::first_manifest(&w).contains_key("operation") {
                return Err("the operation is still in the work".into());
            }
            if applied_on_spoke(&w) {
                Ok(())
            } else {
                Err(format!("{:?}", w.status.and_then(|s| s.conditions)))
            }
        },
    )
    .await;

    let mut before = Vec::new();
    // Where each spoke copy's history is read from next.
    let mut from = Vec::new();
    for name in &names {
        before.push(kept(&works, &spoke, &setup.work_name(name), name).await);
        from.push(spoke.get(name).await.unwrap().resource_version().unwrap());
    }

    // Each step: the hub-controller replaced (none runs while a change is
    // made to the second Application), then a change to every Application,
    // which must reach the cluster through the works the other release
    // wrote.
    let steps: [(&str, &Path, &str); 2] = [
        ("the upgrade to this build", this_build, "v2"),
        ("the rollback to the previous release", &previous, "v3"),
    ];
    for (step, binary, revision) in steps {
        setup.stop_controller().await;
        set_source(
            &apps,
            &names[1],
            "targetRevision",
            &format!("{revision}-while-down"),
        )
        .await;
        setup.start_controller(binary, &[]);
        wait::until(
            &format!("{step}: the change made while no hub-controller ran, on the cluster"),
            TIMEOUT,
            || async {
                let a = spoke.get(&names[1]).await.map_err(|e| e.to_string())?;
                let got = &a.data["spec"]["source"]["targetRevision"];
                if got == &json!(format!("{revision}-while-down")) {
                    Ok(())
                } else {
                    Err(format!(
                        "{got}; controller log:\n{}",
                        setup.controller_log()
                    ))
                }
            },
        )
        .await;
        for name in &names {
            set_source(&apps, name, "targetRevision", revision).await;
        }
        for (name, from) in names.iter().zip(from.iter_mut()) {
            // Every version since the last step, from a watch: it fails on
            // a delete.
            let versions = writes_until(
                &spoke,
                name,
                from,
                TIMEOUT,
                &format!("{step}: {revision} on {name} on the cluster"),
                |a| a.data["spec"]["source"]["targetRevision"] == revision,
            )
            .await;
            for v in &versions {
                assert!(
                    v.data.get("operation").is_none(),
                    "{step}: the sync the spoke ran came back on {name}: {:?}",
                    v.data
                );
                assert!(
                    v.metadata.deletion_timestamp.is_none(),
                    "{step}: {name} deleted"
                );
            }
        }
        let mut after = Vec::new();
        for name in &names {
            after.push(kept(&works, &spoke, &setup.work_name(name), name).await);
        }
        assert_eq!(
            after, before,
            "{step}: a work or a spoke Application was recreated"
        );
        println!("{step}: {} works taken over in place", names.len());
    }
    assert!(
        apps.get(synced)
            .await
            .unwrap()
            .data
            .get("operation")
            .is_none(),
        "the hub copy's operation came back"
    );
}
