//! What the hub does with each message an agent sends after its Hello:
//! acknowledgements, status reports (checked against what the hub sent
//! this agent), command answers, digests and resync requests, heartbeats.
//! A message that breaks the contract is an error that ends the stream.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use argocd_pull_proto::digest::{SetDigest, repairs_for};
use argocd_pull_proto::limits;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, DigestSet, HubMessage, ObjectAck, ObjectKey, StatusReport,
    agent_message, hub_message, status_report,
};
use tonic::Status;

use super::super::cluster::{ClusterState, Item, Observation, Report, Work, held};
use super::super::hub::Hub;
use super::*;

pub(super) fn handle(
    hub: &Arc<Hub>,
    cs: &Arc<ClusterState>,
    mode: AgentMode,
    m: AgentMessage,
) -> Result<(), Status> {
    use agent_message::Kind;
    match m.kind.expect("validated") {
        Kind::Hello(_) => unreachable!("validated"),
        Kind::Heartbeat(_) => {}
        Kind::ProjectSetAck(ack) => {
            let outcome = AckOutcome::try_from(ack.outcome).unwrap_or(AckOutcome::Retry);
            if outcome != AckOutcome::Applied {
                tracing::warn!(cluster = %cs.name, version = %ack.version, ?outcome, message = %ack.message, "the agent did not apply every AppProject or credential");
            }
            cs.lock().projects_acked = Some((ack.version, outcome));
        }
        Kind::Status(report) => {
            let key = report.key.clone().expect("validated");
            let seq = report.seq;
            let (outcome, message) = match on_report(hub, cs, mode, report) {
                Ok(()) => (AckOutcome::Applied, String::new()),
                Err((reason, message)) => {
                    // The first few, then one in a thousand: a flooding
                    // agent must not turn into a flood of log lines.
                    let n = cs.refused_reports.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= 10 || n.is_multiple_of(1000) {
                        tracing::warn!(cluster = %cs.name, namespace = %key.namespace, name = %key.name, reason, %message, refused_so_far = n, "refused a status report");
                    }
                    hub.metrics.refuse(&cs.name, reason);
                    (AckOutcome::Rejected, message)
                }
            };
            cs.control(HubMessage {
                kind: Some(hub_message::Kind::ObjectAck(ObjectAck {
                    key: Some(key),
                    seq,
                    outcome: outcome as i32,
                    message,
                })),
            });
        }
        Kind::ObjectAck(ack) => {
            let key = ack.key.expect("validated");
            let outcome = AckOutcome::try_from(ack.outcome).unwrap_or(AckOutcome::Retry);
            if outcome == AckOutcome::Retry {
                // One timer per message in flight, however often it is asked.
                if cs.schedule_retry(&key, ack.seq) {
                    let (cs, key, seq) = (cs.clone(), key.clone(), ack.seq);
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        cs.retry(&key, seq);
                    });
                }
                return Ok(());
            }
            if outcome == AckOutcome::Rejected {
                tracing::warn!(cluster = %cs.name, namespace = %key.namespace, name = %key.name, message = %ack.message, "the agent refused an Application");
            }
            if let Some(item) = cs.object_acked(&key, ack.seq, outcome, &ack.message) {
                let winner = hub.winner(&cs.name, &key);
                match winner {
                    Some(r) => hub.queue.add(Work::App(r)),
                    // A delete the agent had already reported gone is done.
                    None if matches!(item, Item::Delete { .. }) => cs.forget_if_idle(&key),
                    None => {}
                }
            }
        }
        Kind::OperationAck(ack) => {
            let outcome = AckOutcome::try_from(ack.outcome).unwrap_or(AckOutcome::Retry);
            let settled = ack.settled.then_some(ack.settled_started_at.as_str());
            if let Some(owner) = cs.op_answered(&ack.operation_id, outcome, &ack.message, settled) {
                hub.queue.add(owner);
            }
        }
        Kind::Digest(d) => {
            let (set, theirs) = SetDigest::from_proto(&d).map_err(Status::from)?;
            if set != DigestSet::Observed {
                return Err(Status::invalid_argument(
                    "malformed Digest: an agent only sends the digest of the observed set",
                ));
            }
            let ours = cs.observed_entries();
            let buckets = SetDigest::of(&ours).differing_buckets(&theirs);
            if !buckets.is_empty() {
                tracing::info!(cluster = %cs.name, buckets = buckets.len(), "observed set differs; asking the agent to repair");
                hub.metrics.resync(&cs.name);
                // Sent with the replica as it is then; a digest arriving
                // before they are sent adds nothing.
                cs.request_resyncs(&buckets);
            }
        }
        Kind::ResyncRequest(r) => {
            if mode != AgentMode::Managed {
                return Ok(());
            }
            let repairs = repairs_for(&cs.desired_entries(), &r).map_err(Status::from)?;
            if !repairs.is_empty() {
                tracing::info!(cluster = %cs.name, repairs = repairs.len(), "the agent's copy differs; repairing");
                hub.metrics.resync(&cs.name);
            }
            let versions: std::collections::HashMap<ObjectKey, String> = r
                .entries
                .into_iter()
                .filter_map(|e| Some((e.key?, e.version)))
                .collect();
            let deferred = cs.repair(repairs, |key| {
                hub.removal(
                    &cs.name,
                    key,
                    versions.get(key).map(String::as_str).unwrap_or(""),
                )
            });
            if deferred > 0 {
                tracing::warn!(cluster = %cs.name, deferred, limit = crate::transport::grpc::cluster::MAX_REPAIR_REMOVALS,
                    "the agent lists more Applications the hub does not know than it removes at a time; the rest wait for a later digest");
            }
        }
    }
    Ok(())
}

/// Accepts or refuses one status report (refused: reason and message).
fn on_report(
    hub: &Arc<Hub>,
    cs: &Arc<ClusterState>,
    mode: AgentMode,
    report: StatusReport,
) -> Result<(), (&'static str, String)> {
    let key = report.key.expect("validated");
    let trace_parent = report.trace_parent;
    let what = format!("Application {}/{}", key.namespace, key.name);
    match report.state.expect("validated") {
        status_report::State::Gone(_) => {
            let completes = cs.observe(&key, Observation::Gone);
            if mode == AgentMode::Autonomous {
                hub.queue.add(Work::Mirror {
                    cluster: cs.name.clone(),
                    key,
                });
            } else if completes {
                let winner = hub.winner(&cs.name, &key);
                match winner {
                    Some(r) => hub.queue.add(Work::App(r)),
                    None => cs.forget_if_idle(&key),
                }
            } else if !cs.resend_desired(&key) {
                cs.forget_if_idle(&key);
            } else {
                // Deleted on the spoke behind the hub's back: the hub owns it.
                tracing::info!(cluster = %cs.name, namespace = %key.namespace, name = %key.name, "Application deleted on the spoke; delivering it again");
            }
            Ok(())
        }
        status_report::State::Observed(o) => {
            // Whose it is before anything costs: a report of an Application
            // the hub never sent this agent is refused unread (a flooding
            // agent's reports cost no JSON parse).
            let winner = match mode {
                AgentMode::Autonomous => None,
                _ => {
                    let winner = hub.winner(&cs.name, &key);
                    if winner.is_none() && !cs.knows(&key) {
                        return Err((
                            "not-this-agents",
                            format!(
                                "{what} is not an Application the hub delivers to cluster {}",
                                cs.name
                            ),
                        ));
                    }
                    winner
                }
            };
            limits::check_object_json(&format!("the status of {what}"), o.status_json.len())
                .map_err(|e| ("too-large", e.to_string()))?;
            serde_json::from_slice::<serde_json::Value>(&o.status_json).map_err(|e| {
                (
                    "bad-json",
                    format!("status_json of {what} is not JSON: {e}"),
                )
            })?;
            let version = o
                .meta
                .as_ref()
                .map(|m| m.version.clone())
                .unwrap_or_default();
            match mode {
                AgentMode::Autonomous => {
                    if o.application_json.is_empty() {
                        return Err((
                            "malformed",
                            format!("{what}: an autonomous agent reports the whole Application"),
                        ));
                    }
                    limits::check_object_json(&what, o.application_json.len())
                        .map_err(|e| ("too-large", e.to_string()))?;
                    serde_json::from_slice::<serde_json::Value>(&o.application_json).map_err(
                        |e| {
                            (
                                "bad-json",
                                format!("application_json of {what} is not JSON: {e}"),
                            )
                        },
                    )?;
                    let taken = hub
                        .caches
                        .mirrors
                        .get(&kube::runtime::reflector::ObjectRef::new(&key.name).within(&cs.name))
                        .is_some_and(|m| {
                            m.annotations().get(argocd_pull_apis::keys::MIRROR_SOURCE)
                                != Some(format!("{}/{}", key.namespace, key.name).as_str())
                        });
                    let bytes = o.application_json.len() + o.status_json.len();
                    held::check(
                        &cs.name,
                        cs.held_besides(&key),
                        bytes,
                        hub.config.limits.mirrors,
                    )
                    .map_err(|e| ("over-limit", e))?;
                    if taken {
                        return Err((
                            "name-taken",
                            format!(
                                "the hub already mirrors another Application named {} from cluster {}: rename one of them",
                                key.name, cs.name
                            ),
                        ));
                    }
                    cs.observe(
                        &key,
                        Observation::Observed {
                            version,
                            report: Arc::new(Report::of(&o)),
                        },
                    );
                    hub.queue.add(Work::Mirror {
                        cluster: cs.name.clone(),
                        key,
                    });
                }
                _ => {
                    cs.observe(
                        &key,
                        Observation::Observed {
                            version,
                            report: Arc::new(Report::of(&o)),
                        },
                    );
                    if winner.is_some() {
                        cs.report_trace(&key, &trace_parent);
                    }
                    if let Some(r) = winner {
                        hub.queue.add(Work::App(r));
                    }
                }
            }
            Ok(())
        }
    }
}
