//! The sender: what the cluster state has for the agent, in batches, with
//! heartbeats while there is nothing, digests at their interval and the
//! cluster's AppProjects when the agent takes them.

use super::*;

/// Messages per batch the sender takes from the cluster state.
const BATCH: usize = 64;

pub(super) async fn send_loop(
    hub: Arc<Hub>,
    cs: Arc<ClusterState>,
    id: u64,
    (mode, heartbeat): (AgentMode, Duration),
    out: Out,
    mut projects: Option<Projects>,
) {
    let mut digest = tokio::time::interval(hub.config.digest_interval);
    digest.tick().await;
    let mut last_sent = tokio::time::Instant::now();
    let label = hub.metrics.cluster(&cs.name);
    loop {
        let notified = cs.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let batch = cs.next_messages(id, BATCH);
        if let Some(p) = projects.as_mut() {
            p.note(&batch);
        }
        if batch.is_empty() {
            if let Some(m) = projects.as_mut().and_then(|p| p.message(&hub, &cs)) {
                if !send(&hub, &cs, &out, m).await {
                    return;
                }
                last_sent = tokio::time::Instant::now();
                continue;
            }
            record_lag(&hub, &cs, &label);
            tokio::select! {
                _ = &mut notified => {}
                _ = digest.tick() => {
                    if mode == AgentMode::Managed {
                        cs.send_digest();
                    }
                    if let Some(p) = projects.as_mut() {
                        p.resend_unless_acked(&cs);
                    }
                }
                _ = async { projects.as_mut().expect("guarded").changed.changed().await }, if projects.is_some() => {
                    if let Some(p) = projects.as_mut() {
                        p.due = true;
                    }
                }
                _ = tokio::time::sleep_until(last_sent + heartbeat) => {
                    if out.send(Box::new(Ok(heartbeat_message()))).await.is_err() {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
                // Commands waiting out a retry pause.
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            continue;
        }
        for m in batch {
            if !send(&hub, &cs, &out, m).await {
                return;
            }
        }
        last_sent = tokio::time::Instant::now();
    }
}

/// Sends `m` to the agent, counted; false when the stream is gone.
async fn send(hub: &Hub, cs: &ClusterState, out: &Out, m: HubMessage) -> bool {
    hub.metrics.message(&cs.name, "out", m.kind_name());
    out.send(Box::new(Ok(m))).await.is_ok()
}

/// With nothing to send: how far behind the cluster's agent is, as gauges.
fn record_lag(hub: &Hub, cs: &ClusterState, label: &ClusterLabel) {
    let (lag, pending) = cs.lag();
    hub.metrics.agents.lag.get_or_create(label).set(lag);
    hub.metrics
        .agents
        .pending
        .get_or_create(label)
        .set(pending as i64);
}

/// A heartbeat stamped with the time it is sent.
fn heartbeat_message() -> HubMessage {
    HubMessage {
        kind: Some(hub_message::Kind::Heartbeat(Heartbeat {
            sent_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as i64,
        })),
    }
}

/// Capability `projects`: what the sender knows of the cluster's
/// ProjectSet ([`Hub::project_set`]).
pub(super) struct Projects {
    /// Ticks with every change of an AppProject or credential.
    changed: watch::Receiver<u64>,
    /// The set may have changed since it was last built.
    due: bool,
    /// The version last sent on this stream.
    sent: Option<String>,
}

impl Projects {
    pub(super) fn new(changed: watch::Receiver<u64>) -> Self {
        Self {
            changed,
            due: true,
            sent: None,
        }
    }

    /// A batch about to be sent: an upsert or delete may change which
    /// projects are used.
    fn note(&mut self, batch: &[HubMessage]) {
        if batch.iter().any(|m| {
            matches!(
                m.kind,
                Some(hub_message::Kind::Upsert(_) | hub_message::Kind::Delete(_))
            )
        }) {
            self.due = true;
        }
    }

    /// The ProjectSet to send, when it is due and differs from the last.
    fn message(&mut self, hub: &Hub, cs: &ClusterState) -> Option<HubMessage> {
        if !std::mem::take(&mut self.due) {
            return None;
        }
        let set = match hub.project_set(cs) {
            Ok(set) => set,
            Err(why) => {
                tracing::warn!(cluster = %cs.name, %why, "AppProjects not sent; the agent keeps the ones it has");
                return None;
            }
        };
        if self.sent.as_deref() == Some(set.version.as_str()) {
            return None;
        }
        tracing::debug!(cluster = %cs.name, version = %set.version, objects = set.objects_json.len(), "sending the cluster's AppProjects");
        self.sent = Some(set.version.clone());
        Some(HubMessage {
            kind: Some(hub_message::Kind::ProjectSet(set)),
        })
    }

    /// At a digest interval: the last set again, unless the agent applied
    /// it (an answer lost with a broken stream, or the cluster's API
    /// server failing).
    fn resend_unless_acked(&mut self, cs: &ClusterState) {
        let acked = cs.lock().projects_acked.clone();
        let applied = matches!(
            (&acked, &self.sent),
            (Some((v, AckOutcome::Applied | AckOutcome::Rejected)), Some(s)) if v == s
        );
        if !applied {
            self.sent = None;
            self.due = true;
        }
    }
}
