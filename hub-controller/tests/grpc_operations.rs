//! A sync on the gRPC path stays on the hub copy for as long as Argo CD
//! would keep it on a local Application, and an operation set again
//! meanwhile is folded into it, as Argo CD does: from the hub-controller binary and
//! a real spoke-agent against real API servers, the test plays the
//! ApplicationSet controller on the hub (it sets `.operation` again, without
//! argocd-pull's stamp, while the first sync runs, as RollingSync does on
//! every pass while a step is Pending) and Argo CD's application controller
//! on the spoke (it finishes the sync and clears `.operation`). A hub copy
//! that lost `.operation` before its status showed the sync ran lets a
//! RollingSync start a second sync after the step is Healthy; so every
//! version of the hub copy is watched, and none may show the operation gone
//! before the status shows the start.
//!
//! A terminate-op on the hub copy (the second test) is carried to the spoke
//! the same way, and the hub copy never shows the sync `Running` again
//! after it.

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use testenv::wait;

mod common;
mod grpc_env;
use common::merge;
use grpc_env::{Env, TIMEOUT};

const STARTED: &str = "2026-11-24T01:00:00Z";

/// What one version of the hub copy shows of its sync.
#[derive(Clone, Debug)]
struct Seen {
    operation: Option<Value>,
    started_at: Option<String>,
}

/// Every version of one hub Application from the moment it is watched,
/// by resourceVersion, as `of` reads it.
struct History<T> {
    seen: Arc<Mutex<Vec<(String, T)>>>,
    watch: tokio::task::JoinHandle<()>,
}

impl<T: Clone + std::fmt::Debug + Send + 'static> History<T> {
    /// Starts watching; returns once the watch has listed the current version.
    async fn watch(env: &Env, name: &str, of: fn(&Application) -> T) -> Self {
        let seen: Arc<Mutex<Vec<(String, T)>>> = Arc::default();
        let api: Api<Application> =
            Api::namespaced_with(env.hub_client.clone(), &env.team, &application_resource());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let watch = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let events = watcher::watcher(api, config)
                    .default_backoff()
                    .applied_objects();
                tokio::pin!(events);
                while let Some(Ok(app)) = events.next().await {
                    let rv = app.metadata.resource_version.clone().unwrap_or_default();
                    seen.lock().unwrap().push((rv, of(&app)));
                }
            })
        };
        wait::until("the watch to list the Application", TIMEOUT, || async {
            if seen.lock().unwrap().is_empty() {
                Err("nothing yet")
            } else {
                Ok(())
            }
        })
        .await;
        Self { seen, watch }
    }

    /// Every version seen, once the watch has reached version `last`.
    async fn until(self, last: &str) -> Vec<(String, T)> {
        wait::until(
            "the watch to have seen the last version",
            TIMEOUT,
            || async {
                match self.seen.lock().unwrap().last() {
                    Some((rv, _)) if rv == last => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        self.watch.abort();
        self.seen.lock().unwrap().clone()
    }
}

/// The hub with one managed cluster on gRPC, whose Argo CD the test plays
/// itself, and Application `name` delivered to it; the hub's and the
/// spoke's Application APIs.
async fn delivered(name: &str) -> (Env, Api<Application>, Api<Application>) {
    let mut env = Env::new(&["cluster1"]).await;
    env.spokes[0].argocd.stop();
    env.start_hub(&[]).await;
    env.connect_agent(0).await;
    let hub = env.hub_apps();
    let spoke = env.spoke_apps(0);
    env.create(name, 0, json!({})).await;
    wait::until(&format!("{name} on the spoke"), TIMEOUT, || async {
        spoke
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .map(|_| ())
            .ok_or("absent".to_string())
    })
    .await;
    (env, hub, spoke)
}

fn phase(a: &Application) -> Option<String> {
    a.data
        .pointer("/status/operationState/phase")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn stamp(app: &Application) -> Option<String> {
    app.data
        .get("operation")
        .and_then(keys::stamped_operation_id)
        .map(str::to_string)
}

/// Waits until `api`'s `beta` shows its operation in `phase`, `what`.
async fn wait_phase(api: &Api<Application>, want: &str, what: &str) {
    wait::until(what, TIMEOUT, || async {
        let a = api.get("beta").await.map_err(|e| e.to_string())?;
        match phase(&a) {
            Some(p) if p == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_sync_leaves_the_hub_copy_only_with_the_status_that_shows_it_ran() {
    let (env, hub, spoke) = delivered("alpha").await;
    let history = History::watch(&env, "alpha", |app| Seen {
        operation: app.data.get("operation").filter(|o| !o.is_null()).cloned(),
        started_at: app
            .data
            .pointer("/status/operationState/startedAt")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
    .await;
    let appset_operation = json!({
        "sync": {}, "initiatedBy": { "username": "applicationset-controller", "automated": true },
        "info": [{ "name": "Reason", "value": "ApplicationSet RollingSync triggered a sync" }],
    });
    let set_on_hub = || async {
        // A merge patch replaces `info`: the stamp goes, as with the ApplicationSet.
        merge(&hub, "alpha", json!({ "operation": appset_operation })).await;
    };
    let spoke_carries = |other_than: Option<String>| {
        let spoke = spoke.clone();
        async move {
            wait::until("the spoke to carry a new sync", TIMEOUT, || async {
                let a = spoke.get("alpha").await.map_err(|e| e.to_string())?;
                match stamp(&a) {
                    Some(id) if Some(&id) != other_than.as_ref() => Ok(id),
                    other => Err(format!("{other:?}")),
                }
            })
            .await
        }
    };

    set_on_hub().await;
    let first = spoke_carries(None).await;
    // Set again while it runs on the spoke: the same sync, as Argo CD folds
    // an operation set while another runs into the running one. The hub
    // stamps it with the first one's id and sends nothing new.
    set_on_hub().await;
    wait::until(
        "the hub copy stamped with the running sync's id",
        TIMEOUT,
        || async {
            let a = hub.get("alpha").await.map_err(|e| e.to_string())?;
            match stamp(&a) {
                Some(id) if id == first => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let on_spoke = spoke.get("alpha").await.unwrap();
    assert_eq!(
        stamp(&on_spoke),
        Some(first.clone()),
        "the spoke was sent another sync"
    );
    // Argo CD finishes the sync and clears `.operation`, in one write.
    let running = spoke.get("alpha").await.unwrap();
    let op = running.data.get("operation").cloned().unwrap();
    merge(
        &spoke,
        "alpha",
        json!({
            "metadata": { "resourceVersion": running.metadata.resource_version },
            "operation": null,
            "status": {
                "health": { "status": "Healthy" }, "sync": { "status": "Synced" },
                "operationState": { "operation": op, "phase": "Succeeded",
                                    "startedAt": STARTED, "finishedAt": STARTED },
            },
        }),
    )
    .await;
    let last = wait::until(
        "the hub copy to show the sync ran and drop .operation",
        TIMEOUT,
        || async {
            let a = hub.get("alpha").await.map_err(|e| e.to_string())?;
            let started = a.data.pointer("/status/operationState/startedAt").cloned();
            match (a.data.get("operation").filter(|o| !o.is_null()), started) {
                (None, Some(s)) if s == json!(STARTED) => Ok(a.metadata.resource_version.unwrap()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let seen = history.until(&last).await;
    let set_at = seen
        .iter()
        .position(|(_, s)| s.operation.is_some())
        .expect("the watch saw the operation set");
    for (rv, s) in &seen[set_at..] {
        if s.operation.is_none() {
            assert_eq!(
                s.started_at.as_deref(),
                Some(STARTED),
                "version {rv} shows .operation gone before the status shows the sync: {seen:#?}"
            );
        }
    }
    // Nothing else was sent: the spoke carries no operation.
    let after = spoke.get("alpha").await.unwrap();
    assert_eq!(stamp(&after), None);
    let ids = after.metadata.annotations.unwrap_or_default()[keys::OPERATION_IDS].clone();
    assert_eq!(ids, first, "one sync set on the spoke, once");
}

/// `argocd app terminate-op` on the hub copy while its sync runs on the
/// spoke: the agent stops it there as Argo CD's API server would, the hub
/// copy shows `Terminating` from the user's write until the spoke's Argo
/// CD has acted on it (never `Running` again in between), then what it
/// made of it; the sync and its terminate each ran once on the spoke.
#[tokio::test]
async fn a_terminate_op_on_the_hub_copy_stops_the_sync_on_the_spoke() {
    let (env, hub, spoke) = delivered("beta").await;

    // A sync asked on the hub reaches the spoke, whose Argo CD starts it.
    merge(
        &hub,
        "beta",
        json!({ "operation": {
            "sync": {}, "initiatedBy": { "username": "admin" } } }),
    )
    .await;
    let sync = wait::until("the spoke to carry the sync", TIMEOUT, || async {
        let a = spoke.get("beta").await.map_err(|e| e.to_string())?;
        stamp(&a).ok_or("no sync".to_string())
    })
    .await;
    let op = spoke.get("beta").await.unwrap().data["operation"].clone();
    merge(
        &spoke,
        "beta",
        json!({ "status": { "operationState": {
                "operation": op, "phase": "Running", "startedAt": STARTED } } }),
    )
    .await;
    wait_phase(&hub, "Running", "the hub copy to show the sync running").await;

    let history = History::watch(&env, "beta", phase).await;

    // terminate-op, as Argo CD's API server does it: the Application
    // written back with its operation's phase `Terminating`.
    let mut a = hub.get("beta").await.unwrap();
    a.data["status"]["operationState"]["phase"] = json!("Terminating");
    let asked = hub
        .replace("beta", &PostParams::default(), &a)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    wait_phase(&spoke, "Terminating", "the spoke's sync to be terminating").await;

    // The spoke's Argo CD stops the sync and clears `.operation`, in one write.
    let terminating = spoke.get("beta").await.unwrap();
    merge(
        &spoke,
        "beta",
        json!({
            "metadata": { "resourceVersion": terminating.metadata.resource_version },
            "operation": null,
            "status": { "operationState": { "operation": op, "phase": "Failed",
                "message": "Operation terminated", "startedAt": STARTED, "finishedAt": STARTED } },
        }),
    )
    .await;
    let last = wait::until(
        "the hub copy to show the sync terminated and drop .operation",
        TIMEOUT,
        || async {
            let a = hub.get("beta").await.map_err(|e| e.to_string())?;
            match (a.data.get("operation").filter(|o| !o.is_null()), phase(&a)) {
                (None, Some(p)) if p == "Failed" => Ok(a.metadata.resource_version.unwrap()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let seen = history.until(&last).await;

    // From the user's write on, `Terminating` until the spoke's answer.
    let from = seen
        .iter()
        .position(|(rv, _)| *rv == asked)
        .expect("the watch saw the terminate-op");
    let phases: Vec<&str> = seen[from..]
        .iter()
        .map(|(_, p)| p.as_deref().unwrap_or("none"))
        .collect();
    let failed = phases.iter().position(|p| *p == "Failed").unwrap();
    assert!(
        phases[..failed].iter().all(|p| *p == "Terminating"),
        "the hub copy showed {phases:?} after the terminate-op"
    );
    // The sync and its terminate ran once each on the spoke.
    let after = spoke.get("beta").await.unwrap();
    let ids = after.metadata.annotations.unwrap_or_default()[keys::OPERATION_IDS].clone();
    assert_eq!(ids, format!("{sync},{sync}.terminate"));
}
