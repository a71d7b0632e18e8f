//! Pure: `argocd app terminate-op` on a hub copy delivered over gRPC.
//!
//! Argo CD's API server answers it by writing
//! `status.operationState.phase: Terminating` onto the Application, and its
//! application controller, seeing that, stops the sync. On the dormant hub
//! copy no controller looks, so the hub sends the agent a terminate for the
//! sync the copy carries (`transport::grpc::commands`), and the agent does
//! on the spoke what Argo CD's API server would have done. Until the spoke
//! reports the sync in another phase than `Running`, the hub copy keeps
//! showing `Terminating`: a report from before the terminate reached the
//! spoke would otherwise write `Running` over the user's request, and the
//! hub would forget to send it.

use serde_json::{Value, json};

const TERMINATING: &str = "Terminating";

/// When the sync a status shows started, if it shows one.
fn started(status: &Value) -> Option<&str> {
    status
        .pointer("/operationState/startedAt")
        .and_then(Value::as_str)
}

fn phase(status: &Value) -> Option<&str> {
    status
        .pointer("/operationState/phase")
        .and_then(Value::as_str)
}

/// Whether the hub copy's status asks for its sync to be terminated.
pub fn requested(status: &Value) -> bool {
    phase(status) == Some(TERMINATING)
}

/// Keeps a `Terminating` the hub copy shows (`current`) in the status
/// about to be written (`wanted`, from the spoke's report) while the spoke
/// still reports the same sync `Running`.
pub fn keep_requested(current: &Value, wanted: &mut Value) {
    if requested(current) && phase(wanted) == Some("Running") && started(wanted) == started(current)
    {
        wanted["operationState"]["phase"] = json!(TERMINATING);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(phase: &str, started: &str) -> Value {
        json!({ "operationState": { "phase": phase, "startedAt": started } })
    }

    #[test]
    fn a_requested_terminate_stands_until_the_spoke_reports_the_sync_past_running() {
        let hub = state("Terminating", "T1");
        assert!(requested(&hub));
        // The spoke has not seen it yet: it stands.
        let mut w = state("Running", "T1");
        keep_requested(&hub, &mut w);
        assert_eq!(w, state("Terminating", "T1"));
        // The spoke terminated it, or it ended anyway: the spoke's word.
        for phase in ["Terminating", "Failed", "Error", "Succeeded"] {
            let mut w = state(phase, "T1");
            keep_requested(&hub, &mut w);
            assert_eq!(w, state(phase, "T1"), "{phase}");
        }
        // Another sync runs now: not the one that was asked to stop.
        let mut w = state("Running", "T2");
        keep_requested(&hub, &mut w);
        assert_eq!(w, state("Running", "T2"));
        // Nothing asked.
        let mut w = state("Running", "T1");
        keep_requested(&state("Running", "T1"), &mut w);
        assert_eq!(w, state("Running", "T1"));
        assert!(!requested(&json!({})));
    }
}
