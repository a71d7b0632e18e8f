//! Pure: the commands (sync, refresh, terminate) a hub Application or
//! mirror carries for its agent: stamped with an id so each runs exactly
//! once, sent, and taken off the hub copy once the agent has it.
//!
//! A terminate is what `argocd app terminate-op` leaves on the hub copy:
//! `status.operationState.phase: Terminating` while the copy carries a
//! sync. It is sent for that sync (its id is the sync's id and
//! `.terminate`), and nothing is taken off the hub copy for it: the spoke's
//! status, once its Argo CD has stopped the sync, replaces the phase (see
//! `status::terminating`), and the sync's completion ends it.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::v1::RefreshKind;
use kube::ResourceExt;
use serde_json::{Map, Value, json};

/// A command the hub Application carries, ready to send once stamped.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Sync(Value),
    Refresh(RefreshKind),
    Terminate,
}

/// The id of the terminate of the sync `sync_id`.
pub fn terminate_id(sync_id: &str) -> String {
    format!("{sync_id}.terminate")
}

pub use argocd_pull_apis::keys::OPERATION_ID_INFO;

/// What the hub Application needs for its commands.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommandPlan {
    /// A merge patch to write before anything is sent: the sync's id into
    /// its operation (so that a restarted hub sends the same id and the
    /// agent runs it only once), or a leftover stamp of an older release
    /// out of the annotations.
    pub stamp: Option<Value>,
    /// Commands ready to send, by operation id.
    pub ready: Vec<(String, Command)>,
}

fn annotation<'a>(app: &'a Application, key: &str) -> Option<&'a str> {
    app.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The operation without our id entry, and that entry's value.
fn split_operation(op: &Value) -> (Value, Option<String>) {
    let mut bare = op.clone();
    let mut stamp = None;
    if let Some(info) = bare.get_mut("info").and_then(Value::as_array_mut) {
        info.retain(|i| {
            let ours = i.get("name").and_then(Value::as_str) == Some(OPERATION_ID_INFO);
            if ours {
                stamp = i.get("value").and_then(Value::as_str).map(str::to_string);
            }
            !ours
        });
        if info.is_empty() {
            bare.as_object_mut().map(|m| m.remove("info"));
        }
    }
    (bare, stamp)
}

/// The commands already in flight for one Application (sent, not yet
/// taken off the hub copy).
#[derive(Clone, Copy, Debug, Default)]
pub struct InFlight<'a> {
    pub sync: Option<&'a str>,
    pub refresh: Option<&'a str>,
}

/// Reads the commands of `app`. A sync's id is `<uid>.sync.<resourceVersion>`
/// of the version it was first seen in: unique, never reused, kept in the
/// operation. An operation set again while a sync is in flight (an
/// ApplicationSet's RollingSync does so on every pass, dropping our stamp)
/// is that same sync: it is stamped with its id, as Argo CD folds an
/// operation set while another runs into the running one. A refresh is
/// idempotent and carries no stamp: its id is the one in flight or a new
/// `<uid>.refresh.<resourceVersion>`; a restarted hub may refresh once more.
pub fn commands(app: &Application, in_flight: InFlight<'_>) -> CommandPlan {
    let refresh_id = in_flight.refresh;
    let mut plan = CommandPlan::default();
    let uid = app.metadata.uid.clone().unwrap_or_default();
    let rv = app.resource_version().unwrap_or_default();

    if let Some(op) = app.data.get("operation").filter(|o| !o.is_null()) {
        let (bare, stamp) = split_operation(op);
        let hash = content::hash(&bare);
        match stamp.as_deref().and_then(|s| s.split_once(' ')) {
            Some((id, h)) if h == hash => {
                plan.ready.push((id.to_string(), Command::Sync(op.clone())));
                let status = app.data.get("status").unwrap_or(&Value::Null);
                if crate::status::terminating::requested(status) {
                    plan.ready.push((terminate_id(id), Command::Terminate));
                }
            }
            _ => {
                let mut info: Vec<Value> = bare
                    .get("info")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let id = in_flight
                    .sync
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{uid}.sync.{rv}"));
                info.push(json!({
                    "name": OPERATION_ID_INFO,
                    "value": format!("{id} {hash}"),
                }));
                plan.stamp = Some(json!({
                    "metadata": { "resourceVersion": rv },
                    "operation": { "info": info },
                }));
                return plan;
            }
        }
    }
    let legacy: Vec<&str> = [keys::SYNC_REQUEST, keys::REFRESH_REQUEST]
        .into_iter()
        .filter(|k| annotation(app, k).is_some())
        .collect();
    if !legacy.is_empty() {
        let annotations: Map<String, Value> = legacy
            .iter()
            .map(|k| (k.to_string(), Value::Null))
            .collect();
        plan.stamp = Some(json!({ "metadata": {
            "resourceVersion": rv, "annotations": annotations } }));
        plan.ready.clear();
        return plan;
    }

    if let Some(value) = annotation(app, keys::REFRESH) {
        let kind = match value {
            "hard" => RefreshKind::Hard,
            _ => RefreshKind::Normal,
        };
        let id = refresh_id
            .map(str::to_string)
            .unwrap_or_else(|| format!("{uid}.refresh.{rv}"));
        plan.ready.push((id, Command::Refresh(kind)));
    }
    plan
}

pub fn refresh_name(kind: RefreshKind) -> &'static str {
    match kind {
        RefreshKind::Hard => "hard",
        _ => "normal",
    }
}

/// The merge patch that removes a delivered command from the hub
/// Application. It carries the resourceVersion the command was read from,
/// so it fails (and is decided again) rather than remove a newer command
/// someone set meanwhile. `None` when the Application no longer carries
/// this command.
pub fn completion_patch(app: &Application, id: &str, command: &Command) -> Option<Value> {
    let rv = app.resource_version()?;
    match command {
        Command::Sync(_) => {
            let op = app.data.get("operation").filter(|o| !o.is_null())?;
            let (_, stamp) = split_operation(op);
            if stamp
                .as_deref()
                .and_then(|s| s.split_once(' '))
                .map(|(i, _)| i)
                != Some(id)
            {
                return None;
            }
            Some(json!({ "metadata": { "resourceVersion": rv }, "operation": null }))
        }
        // Nothing on the hub copy is the terminate's own: see the module
        // documentation.
        Command::Terminate => None,
        Command::Refresh(_) => {
            annotation(app, keys::REFRESH)?;
            Some(json!({ "metadata": { "resourceVersion": rv,
                                       "annotations": { keys::REFRESH: null } } }))
        }
    }
}

/// Whether the status on `app` shows a sync started no earlier than
/// `started_at` (the spoke's `operationState.startedAt` when the agent
/// answered that the sync settled; empty: there is nothing to wait for).
/// Both come from the same Argo CD, always written as RFC 3339 in UTC
/// seconds (`2006-01-02T15:04:05Z`), so they compare as strings.
pub fn status_shows_start(app: &Application, started_at: &str) -> bool {
    if started_at.is_empty() {
        return true;
    }
    app.data
        .pointer("/status/operationState/startedAt")
        .and_then(Value::as_str)
        .is_some_and(|shown| shown.len() == started_at.len() && shown >= started_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;

    #[test]
    fn a_sync_is_stamped_in_its_operation_then_sent_then_removed() {
        let op =
            json!({ "sync": { "revision": "abc" }, "info": [{ "name": "why", "value": "test" }] });
        let fresh = app(json!({ "operation": op }));
        let plan = commands(&fresh, InFlight::default());
        assert!(plan.ready.is_empty());
        let stamp = plan.stamp.unwrap();
        assert_eq!(stamp["metadata"]["resourceVersion"], "7");
        let info = stamp["operation"]["info"].as_array().unwrap();
        assert_eq!(
            info[0],
            json!({ "name": "why", "value": "test" }),
            "others' info stays"
        );
        assert_eq!(info[1]["name"], OPERATION_ID_INFO);
        let value = info[1]["value"].as_str().unwrap();
        assert!(value.starts_with("u-1.sync.7 "), "{value}");

        // What the API server shows after the stamp: ready, same id later
        // (a restarted hub, or an ApplicationSet rewriting annotations).
        let mut stamped_op = op.clone();
        stamped_op["info"] = json!(info);
        let stamped = app(json!({ "operation": stamped_op,
            "metadata": { "resourceVersion": "8", "annotations": { "rewritten": "by-appset" } } }));
        let plan = commands(&stamped, InFlight::default());
        assert_eq!(plan.stamp, None);
        assert_eq!(
            plan.ready,
            vec![("u-1.sync.7".to_string(), Command::Sync(stamped_op.clone()))]
        );
        let patch =
            completion_patch(&stamped, "u-1.sync.7", &Command::Sync(stamped_op.clone())).unwrap();
        assert_eq!(
            patch,
            json!({ "metadata": { "resourceVersion": "8" }, "operation": null })
        );
        assert!(
            completion_patch(&stamped, "other-id", &Command::Sync(stamped_op.clone())).is_none()
        );

        // The operation changed under the stamp: stamped anew.
        let mut changed = stamped_op.clone();
        changed["sync"]["revision"] = json!("def");
        let plan = commands(&app(json!({ "operation": changed })), InFlight::default());
        assert!(plan.ready.is_empty());
        let info = plan.stamp.unwrap()["operation"]["info"].clone();
        assert_eq!(
            info.as_array().unwrap().len(),
            2,
            "the old stamp replaced, not added: {info}"
        );

        // Set again while that sync is in flight, without our stamp (an
        // ApplicationSet's pass): the same sync, stamped with its id.
        let rewritten = app(json!({ "operation": op, "metadata": { "resourceVersion": "9" } }));
        let in_flight = InFlight {
            sync: Some("u-1.sync.7"),
            ..Default::default()
        };
        let plan = commands(&rewritten, in_flight);
        let info = plan.stamp.unwrap()["operation"]["info"].clone();
        assert!(
            info[1]["value"]
                .as_str()
                .unwrap()
                .starts_with("u-1.sync.7 "),
            "{info}"
        );
        // Nothing in flight: a new sync, with a new id.
        let plan = commands(&rewritten, InFlight::default());
        let info = plan.stamp.unwrap()["operation"]["info"].clone();
        assert!(
            info[1]["value"]
                .as_str()
                .unwrap()
                .starts_with("u-1.sync.9 "),
            "{info}"
        );

        // A stamp of an older release (an annotation) is cleaned up first.
        let leftover = app(json!({ "metadata": { "annotations": { keys::SYNC_REQUEST: "x y" } } }));
        assert_eq!(
            commands(&leftover, InFlight::default()).stamp,
            Some(json!({ "metadata": { "resourceVersion": "7",
                "annotations": { keys::SYNC_REQUEST: null } } }))
        );
    }

    #[test]
    fn a_terminate_op_on_the_hub_copy_is_sent_for_the_sync_it_carries() {
        let op = json!({ "sync": {} });
        let (bare, _) = split_operation(&op);
        let mut stamped_op = op.clone();
        stamped_op["info"] = json!([{ "name": OPERATION_ID_INFO,
            "value": format!("u-1.sync.7 {}", content::hash(&bare)) }]);
        let at = |phase: &str| {
            app(json!({ "operation": stamped_op,
                "status": { "operationState": { "phase": phase, "startedAt": "T1" } } }))
        };
        let plan = commands(&at("Terminating"), InFlight::default());
        assert_eq!(
            plan.ready,
            vec![
                ("u-1.sync.7".to_string(), Command::Sync(stamped_op.clone())),
                ("u-1.sync.7.terminate".to_string(), Command::Terminate),
            ]
        );
        // Nothing to take off the hub copy for it.
        assert_eq!(
            completion_patch(
                &at("Terminating"),
                "u-1.sync.7.terminate",
                &Command::Terminate
            ),
            None
        );
        // A running sync, or a terminate-op without a sync: nothing to send.
        assert_eq!(commands(&at("Running"), InFlight::default()).ready.len(), 1);
        let bare_app = app(json!({ "status": { "operationState": { "phase": "Terminating" } } }));
        assert!(commands(&bare_app, InFlight::default()).ready.is_empty());
        // Not yet stamped: the stamp comes first, the terminate on the next pass.
        let unstamped = app(json!({ "operation": op,
            "status": { "operationState": { "phase": "Terminating" } } }));
        let plan = commands(&unstamped, InFlight::default());
        assert!(plan.stamp.is_some() && plan.ready.is_empty());
    }

    #[test]
    fn a_settled_sync_waits_for_the_status_that_shows_its_start() {
        let at = |t: &str| app(json!({ "status": { "operationState": { "startedAt": t } } }));
        assert!(
            status_shows_start(&app(json!({})), ""),
            "nothing to wait for"
        );
        assert!(!status_shows_start(&app(json!({})), "2026-11-24T01:00:00Z"));
        assert!(!status_shows_start(
            &at("2026-11-24T00:59:59Z"),
            "2026-11-24T01:00:00Z"
        ));
        assert!(status_shows_start(
            &at("2026-11-24T01:00:00Z"),
            "2026-11-24T01:00:00Z"
        ));
        assert!(
            status_shows_start(&at("2026-11-24T01:00:07Z"), "2026-11-24T01:00:00Z"),
            "a later sync's status shows it too"
        );
    }

    #[test]
    fn a_refresh_keeps_the_id_in_flight_and_is_removed_when_done() {
        let a = app(json!({ "metadata": { "annotations": { keys::REFRESH: "hard" } } }));
        let plan = commands(&a, InFlight::default());
        assert_eq!(plan.stamp, None);
        assert_eq!(
            plan.ready,
            vec![(
                "u-1.refresh.7".to_string(),
                Command::Refresh(RefreshKind::Hard)
            )]
        );
        let later = commands(
            &a,
            InFlight {
                refresh: Some("u-1.refresh.3"),
                ..Default::default()
            },
        );
        assert_eq!(later.ready[0].0, "u-1.refresh.3");
        assert_eq!(
            completion_patch(&a, "u-1.refresh.3", &Command::Refresh(RefreshKind::Hard)),
            Some(json!({ "metadata": { "resourceVersion": "7",
                "annotations": { keys::REFRESH: null } } }))
        );
        assert!(
            commands(&app(json!({})), InFlight::default())
                .ready
                .is_empty()
        );
    }
}
