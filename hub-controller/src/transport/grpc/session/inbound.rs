//! What the hub does with each message an agent sends after its Hello:
//! acknowledgements, status reports (checked against what the hub sent
//! this agent), command answers, digests and resync requests, heartbeats.
//! A message that breaks the contract is an error that ends the stream.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use argocd_pull_proto::digest::{SetDigest, repairs_for};
use argocd_pull_proto::limits;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, Digest, DigestSet, HubMessage, ObjectAck, ObjectKey,
    ObservedApplication, OperationAck, ProjectSetAck, ResourceTreeReport, ResyncRequest,
    StatusReport, agent_message, hub_message, status_report,
};
use kube::runtime::reflector::ObjectRef;
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
    let session = Inbound { hub, cs, mode };
    match m.kind.expect("validated") {
        Kind::Hello(_) => unreachable!("validated"),
        Kind::Heartbeat(_) => {}
        Kind::ProjectSetAck(ack) => session.project_set_ack(ack),
        Kind::Status(report) => session.report(report),
        Kind::ObjectAck(ack) => session.object_ack(ack),
        Kind::OperationAck(ack) => session.operation_ack(ack),
        Kind::Digest(d) => session.digest(&d)?,
        Kind::ResyncRequest(r) => session.resync_request(r)?,
        Kind::Tree(t) => session.tree(t),
        Kind::LiveResponse(r) => cs.live_answer(r),
        k @ (Kind::TerminalOpened(_)
        | Kind::TerminalData(_)
        | Kind::TerminalCredit(_)
        | Kind::TerminalClose(_)) => cs.terminal_message(k),
    }
    Ok(())
}

/// Why a status report was refused: the reason counted in the metrics
/// and the message the agent reads in its rejection.
type Refused = (&'static str, String);

/// What handling one session's messages needs: the hub, the state of the
/// agent's cluster and the mode the agent runs in. Copied into each
/// handler, so grouping them costs nothing per message.
#[derive(Clone, Copy)]
struct Inbound<'a> {
    hub: &'a Arc<Hub>,
    cs: &'a Arc<ClusterState>,
    mode: AgentMode,
}

impl Inbound<'_> {
    /// The agent's answer to a ProjectSet, kept so that the sender sends
    /// the set again at a digest interval unless it was applied.
    fn project_set_ack(self, ack: ProjectSetAck) {
        let cs = self.cs;
        let outcome = AckOutcome::try_from(ack.outcome).unwrap_or(AckOutcome::Retry);
        if outcome != AckOutcome::Applied {
            tracing::warn!(cluster = %cs.name, version = %ack.version, ?outcome, message = %ack.message, "the agent did not apply every AppProject or credential");
        }
        cs.lock().projects_acked = Some((ack.version, outcome));
    }

    /// Accepts or refuses one status report, and acknowledges it either
    /// way through the control queue (which is what holds back an agent
    /// that sends without reading).
    fn report(self, report: StatusReport) {
        let (hub, cs) = (self.hub, self.cs);
        let key = report.key.clone().expect("validated");
        let seq = report.seq;
        let (outcome, message) = match self.on_report(report) {
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

    /// The agent's answer to an upsert or delete: a retry is scheduled,
    /// anything else settles the message and lets the Application's
    /// owner be reconciled again.
    fn object_ack(self, ack: ObjectAck) {
        let (hub, cs) = (self.hub, self.cs);
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
            return;
        }
        if outcome == AckOutcome::Rejected {
            tracing::warn!(cluster = %cs.name, namespace = %key.namespace, name = %key.name, message = %ack.message, "the agent refused an Application");
        }
        if let Some(item) = cs.object_acked(&key, ack.seq, outcome, &ack.message) {
            let winner = hub.winner(&cs.name, &key);
            match winner {
                Some(r) => hub.enqueue(Work::App(r)),
                // A delete the agent had already reported gone is done.
                None if matches!(item, Item::Delete { .. }) => cs.forget_if_idle(&key),
                None => {}
            }
        }
    }

    /// The agent's answer to an operation command: its owner is
    /// reconciled again when the answer settles something.
    fn operation_ack(self, ack: OperationAck) {
        let outcome = AckOutcome::try_from(ack.outcome).unwrap_or(AckOutcome::Retry);
        let settled = ack.settled.then_some(ack.settled_started_at.as_str());
        let answered =
            (self.cs.lock().ops).answered(&ack.operation_id, outcome, &ack.message, settled);
        if let Some(owner) = answered {
            self.hub.enqueue(owner);
        }
    }

    /// The digest of the agent's observed set: the buckets that differ
    /// from the hub's copy are asked for again.
    fn digest(self, d: &Digest) -> Result<(), Status> {
        let (hub, cs) = (self.hub, self.cs);
        let (set, theirs) = SetDigest::from_proto(d).map_err(Status::from)?;
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
        Ok(())
    }

    /// The agent's entries in the buckets where its copy of the desired set
    /// differs from the hub's: answered with the repairs (what is missing
    /// or stale sent again, what should not be there removed). Only a
    /// managed agent holds a copy of what the hub delivers.
    fn resync_request(self, r: ResyncRequest) -> Result<(), Status> {
        let (hub, cs) = (self.hub, self.cs);
        if self.mode != AgentMode::Managed {
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
        Ok(())
    }

    /// A resource tree the agent reports (capability `trees`): kept for the
    /// hub copy its Application was delivered for, as its status is. One
    /// of an Application the hub does not deliver to this agent, or not
    /// for the current hub copy, is dropped and counted as refused (nothing
    /// is acknowledged: the next report replaces it).
    fn tree(self, t: ResourceTreeReport) {
        let (hub, cs) = (self.hub, self.cs);
        let Some(trees) = hub.trees() else { return };
        let key = t.key.expect("validated");
        let outcome = match (self.mode, hub.winner(&cs.name, &key)) {
            // Only a key whose grant was made for the hub copy it names:
            // a tree's uids open live views of this cluster.
            (AgentMode::Managed, Some(_))
                if !hub.granted_to(&cs.name, &key, Some(t.hub_uid.as_str())) =>
            {
                Err((
                    "tree-refused",
                    format!(
                        "the hub's record grants {}/{} on cluster {} to no hub Application of uid {:?}",
                        key.namespace, key.name, cs.name, t.hub_uid
                    ),
                ))
            }
            (AgentMode::Managed, Some(owner)) => trees
                .reported(
                    &cs.name,
                    &key,
                    ObjectRef::new(&owner.name).within(&owner.namespace),
                    &t.hub_uid,
                    &t.tree_json,
                    &t.managed_resources_json,
                )
                .map_err(|why| ("tree-refused", why)),
            (AgentMode::Managed, None) => Err((
                "not-this-agents",
                format!("the hub does not deliver it to cluster {}", cs.name),
            )),
            _ => Err(("tree-refused", "trees are for managed mode".to_string())),
        };
        if let Err((reason, why)) = outcome {
            let n = cs.refused_reports.fetch_add(1, Ordering::Relaxed) + 1;
            if n <= 10 || n.is_multiple_of(1000) {
                tracing::warn!(cluster = %cs.name, namespace = %key.namespace, name = %key.name, reason, %why, refused_so_far = n, "refused a resource tree");
            }
            hub.metrics.refuse(&cs.name, reason);
        }
    }

    /// Accepts or refuses one status report (refused: reason and message).
    fn on_report(self, report: StatusReport) -> Result<(), Refused> {
        let key = report.key.expect("validated");
        match report.state.expect("validated") {
            status_report::State::Gone(_) => {
                self.gone(key);
                Ok(())
            }
            status_report::State::Observed(o) => self.observed(key, o, &report.trace_parent),
        }
    }

    /// The agent reports the Application gone from its cluster.
    fn gone(self, key: ObjectKey) {
        let (hub, cs) = (self.hub, self.cs);
        let completes = cs.observe(&key, Observation::Gone);
        if self.mode == AgentMode::Autonomous {
            hub.enqueue(Work::Mirror {
                cluster: cs.name.clone(),
                key,
            });
        } else if completes {
            let winner = hub.winner(&cs.name, &key);
            match winner {
                Some(r) => hub.enqueue(Work::App(r)),
                None => cs.forget_if_idle(&key),
            }
        } else if !cs.resend_desired(&key) {
            cs.forget_if_idle(&key);
        } else {
            // Deleted on the spoke behind the hub's back: the hub owns it.
            tracing::info!(cluster = %cs.name, namespace = %key.namespace, name = %key.name, "Application deleted on the spoke; delivering it again");
        }
    }

    /// The agent reports the Application as it observed it: checked, kept
    /// as the cluster's observation, and handed on to the reconciler of
    /// its hub Application (managed) or of its mirror (autonomous).
    fn observed(
        self,
        key: ObjectKey,
        o: ObservedApplication,
        trace_parent: &str,
    ) -> Result<(), Refused> {
        let (hub, cs) = (self.hub, self.cs);
        // Named only in a refusal: nothing is formatted per accepted report.
        let what = || format!("Application {}/{}", key.namespace, key.name);
        // Whose it is before anything costs: a report of an Application
        // the hub never sent this agent is refused unread (a flooding
        // agent's reports cost no JSON parse).
        let winner = match self.mode {
            AgentMode::Autonomous => None,
            _ => {
                let winner = hub.winner(&cs.name, &key);
                if winner.is_none() && !cs.knows(&key) {
                    return Err((
                        "not-this-agents",
                        format!(
                            "{} is not an Application the hub delivers to cluster {}",
                            what(),
                            cs.name
                        ),
                    ));
                }
                winner
            }
        };
        let size = o.status_json.len();
        if size > limits::MAX_OBJECT_JSON_BYTES {
            let e = limits::check_object_json(&format!("the status of {}", what()), size)
                .expect_err("over the limit");
            return Err(("too-large", e.to_string()));
        }
        // Checked, not built: a whole value tree per report only to drop it.
        serde_json::from_slice::<serde::de::IgnoredAny>(&o.status_json).map_err(|e| {
            (
                "bad-json",
                format!("status_json of {} is not JSON: {e}", what()),
            )
        })?;
        let version = o
            .meta
            .as_ref()
            .map(|m| m.version.clone())
            .unwrap_or_default();
        if self.mode == AgentMode::Autonomous {
            let what = what();
            return self.mirrored(key, &o, version, &what);
        }
        cs.observe(
            &key,
            Observation::Observed {
                version,
                report: Arc::new(Report::of(&o)),
            },
        );
        if winner.is_some() {
            cs.report_trace(&key, trace_parent);
        }
        if let Some(r) = winner {
            hub.enqueue(Work::App(r));
        }
        Ok(())
    }

    /// An autonomous agent's report, whose status was checked already:
    /// the whole Application must be in it, fit the limits and not take
    /// the name of another cluster Application's mirror.
    fn mirrored(
        self,
        key: ObjectKey,
        o: &ObservedApplication,
        version: String,
        what: &str,
    ) -> Result<(), Refused> {
        let (hub, cs) = (self.hub, self.cs);
        if o.application_json.is_empty() {
            return Err((
                "malformed",
                format!("{what}: an autonomous agent reports the whole Application"),
            ));
        }
        limits::check_object_json(what, o.application_json.len())
            .map_err(|e| ("too-large", e.to_string()))?;
        serde_json::from_slice::<serde_json::Value>(&o.application_json).map_err(|e| {
            (
                "bad-json",
                format!("application_json of {what} is not JSON: {e}"),
            )
        })?;
        let taken = self.mirror_taken(&key);
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
                report: Arc::new(Report::of(o)),
            },
        );
        hub.enqueue(Work::Mirror {
            cluster: cs.name.clone(),
            key,
        });
        Ok(())
    }

    /// Whether the hub's mirror of that name, in the cluster's namespace,
    /// mirrors an Application of another namespace on the spoke.
    fn mirror_taken(self, key: &ObjectKey) -> bool {
        self.hub.mirror_taken(&self.cs.name, key)
    }
}
