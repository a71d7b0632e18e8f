//! The one rule both transports follow when a spoke reports a finished
//! sync: the hub copy shows `Progressing` once before the real health.
//!
//! ApplicationSet RollingSync only sees the hub copy and waits for a
//! Progressing -> Healthy transition after it asks for a sync; a fast sync
//! on the spoke can finish between two reports, so the hub would go from
//! Healthy to Healthy and RollingSync would wait for ever. The real health
//! follows once the hub copy shows the `Progressing`: from the echo of
//! that write, never from a timer (see the hub-controller's `status::writer`).

use serde_json::{Value, json};

/// When the sync a status shows started, if it shows one.
pub(super) fn started(status: &Value) -> Option<&str> {
    status
        .pointer("/operationState/startedAt")
        .and_then(Value::as_str)
}

fn health(status: &Value) -> Option<&str> {
    status.pointer("/health/status").and_then(Value::as_str)
}

/// Whether `wanted` (built from the spoke's report) must be shown as
/// `Progressing` first, given what the hub copy shows now (`current`): a
/// sync the hub has not shown yet has started and already ended Healthy.
pub fn progressing_first(current: &Value, wanted: &Value) -> bool {
    let new_sync = started(wanted).is_some() && started(wanted) != started(current);
    new_sync && health(wanted) == Some("Healthy") && health(current) != Some("Progressing")
}

/// Applies the rule to `wanted`: its health becomes `Progressing` (without
/// the spoke's health message) when [`progressing_first`] says so.
pub fn show_progressing_first(current: &Value, wanted: &mut Value) -> bool {
    let first = progressing_first(current, wanted);
    if first {
        wanted["health"] = json!({ "status": "Progressing" });
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(health: &str, started: &str) -> Value {
        json!({ "health": { "status": health, "message": "m" },
                "operationState": { "phase": "Succeeded", "startedAt": started } })
    }

    #[test]
    fn a_new_sync_that_ended_healthy_shows_progressing_once() {
        let hub = status("Healthy", "T1");
        let mut wanted = status("Healthy", "T2");
        assert!(show_progressing_first(&hub, &mut wanted));
        assert_eq!(wanted["health"], json!({ "status": "Progressing" }));
        // Once the hub shows it, the real health follows.
        let mut real = status("Healthy", "T2");
        assert!(!show_progressing_first(&wanted, &mut real));
        assert_eq!(real["health"]["status"], "Healthy");
    }

    #[test]
    fn nothing_changes_without_a_new_sync_or_when_not_healthy() {
        let hub = status("Healthy", "T1");
        for wanted in [
            status("Healthy", "T1"),
            status("Degraded", "T2"),
            json!({ "health": { "status": "Healthy" } }),
        ] {
            assert!(!progressing_first(&hub, &wanted), "{wanted}");
        }
        // The first sync the hub ever sees counts as new.
        assert!(progressing_first(&json!({}), &status("Healthy", "T1")));
    }
}
