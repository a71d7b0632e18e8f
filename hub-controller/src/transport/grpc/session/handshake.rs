//! The stream's opening: the agent's Hello read and negotiated, the
//! cluster admitted, the agent attached to its cluster's state, and the
//! hub's Welcome.

use super::*;

/// How long an agent has to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// The handshake up to the point where the agent may be attached: its
/// Hello read and negotiated, the hub's view synced, the cluster admitted
/// and the agent's mode the configured one. Returns what was negotiated
/// and the agent's version; `None` when the stream was refused (the
/// refusal already sent) or ended before its Hello.
pub(super) async fn handshake(
    hub: &Hub,
    peer: &Peer,
    inbound: &mut Streaming<AgentMessage>,
    out: &Out,
) -> Option<(Negotiated, String)> {
    let cluster = &peer.cluster;
    let hello = read_hello(hub, cluster, inbound, out).await?;
    let negotiated = validate::first_agent_message(&hello)
        .map_err(Status::from)
        .and_then(|h| version::negotiate(&hub.offer(), h).map_err(Status::from));
    let negotiated = match negotiated {
        Ok(n) => n,
        Err(status) => {
            let reason = if status.code() == tonic::Code::FailedPrecondition {
                "protocol-version"
            } else {
                "malformed"
            };
            refuse(hub, cluster, reason, out, status).await;
            return None;
        }
    };
    let agent_version = match &hello.kind {
        Some(agent_message::Kind::Hello(h)) => h.agent_version.clone(),
        _ => String::new(),
    };
    // Digests and decisions need the whole view of the hub, and nobody is
    // welcomed before the deny list is known.
    hub.wait_synced().await;
    hub.config.deny_list.wait_loaded().await;
    // Again: time passed, the deny list or the cluster may have changed.
    if let Err(r) = hub.admit(peer) {
        refuse(hub, cluster, r.reason, out, r.into()).await;
        return None;
    }
    if let Err(status) = configured_mode(hub, cluster, negotiated.mode) {
        refuse(hub, cluster, "mode", out, status).await;
        return None;
    }
    Some((negotiated, agent_version))
}

/// The stream's first message, which must come within [`HELLO_TIMEOUT`];
/// `None` when the stream was refused (the refusal already sent) or the
/// agent closed it without a word.
async fn read_hello(
    hub: &Hub,
    cluster: &str,
    inbound: &mut Streaming<AgentMessage>,
    out: &Out,
) -> Option<AgentMessage> {
    match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
        Err(_) => {
            refuse(
                hub,
                cluster,
                "handshake-timeout",
                out,
                Status::deadline_exceeded("no Hello within 30s"),
            )
            .await;
            None
        }
        Ok(Err(status)) => {
            let status = inbound_error(status);
            refuse(hub, cluster, "malformed", out, status).await;
            None
        }
        Ok(Ok(None)) => None,
        Ok(Ok(Some(m))) => Some(m),
    }
}

/// A session attached to its cluster's state.
pub(super) struct Attached {
    pub(super) cs: Arc<ClusterState>,
    pub(super) id: u64,
    /// Tells the session why it must end: replaced, revoked or denied.
    pub(super) stop: watch::Receiver<Option<Stop>>,
}

/// Makes the admitted agent its cluster's session, then this replica the
/// one that writes for the cluster. `None` when the stream was refused
/// (the refusal already sent): the cluster was revoked, or the
/// certificate denied, meanwhile.
pub(super) async fn attach(
    hub: &Arc<Hub>,
    peer: &Peer,
    negotiated: &Negotiated,
    agent_version: &str,
    out: &Out,
) -> Option<Attached> {
    let cluster = &peer.cluster;
    let cs = hub.cluster(cluster);
    let id = hub.session_id();
    let agent = Agent {
        fingerprint: peer.fingerprint.clone(),
        version: agent_version.to_owned(),
        certificate_not_after: peer.not_after,
        since: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64,
        capabilities: negotiated.capabilities.iter().cloned().collect(),
    };
    let stop = match cs.attach_as(id, negotiated.mode, agent) {
        Ok(stop) => stop,
        Err(why) => {
            let r = Refusal::revoked(cluster, &why);
            refuse(hub, cluster, r.reason, out, r.into()).await;
            return None;
        }
    };
    // Denied between the check and the attach: the deny list's sweep may
    // have missed this session.
    if let Some(note) = hub.config.deny_list.denied(&peer.fingerprint) {
        cs.detach(id);
        let r = Refusal::denied(&hub.config.deny_list, &peer.fingerprint, &note);
        refuse(hub, cluster, r.reason, out, r.into()).await;
        return None;
    }
    // With several replicas, this one now writes for the cluster (once
    // the one its agent was on before lets go).
    hub.claim_for(cluster, &cs, id);
    let metrics = &hub.metrics;
    cs.set_control_gauge(
        metrics
            .agents
            .control_queue
            .get_or_create(&metrics.cluster(cluster))
            .clone(),
    );
    Some(Attached { cs, id, stop })
}

/// The hub's answer to a Hello: what was negotiated, and the intervals
/// and the message size limit the agent must keep to.
pub(super) fn welcome(hub: &Hub, negotiated: &Negotiated) -> HubMessage {
    let welcome = Welcome {
        protocol_version: negotiated.version,
        capabilities: negotiated.capabilities.iter().cloned().collect(),
        hub_version: env!("CARGO_PKG_VERSION").into(),
        heartbeat_interval_seconds: negotiated.heartbeat.as_secs().max(1) as u32,
        digest_interval_seconds: hub.config.digest_interval.as_secs().max(1) as u32,
        max_message_bytes: MAX_MESSAGE_BYTES as u32,
    };
    HubMessage {
        kind: Some(hub_message::Kind::Welcome(welcome)),
    }
}

/// The hub, not the agent, decides the mode: the one the cluster's addon
/// configuration deploys the agent with (`watch::mode`).
fn configured_mode(hub: &Hub, cluster: &str, claimed: AgentMode) -> Result<(), Status> {
    let claimed = version::mode_name(claimed);
    match hub.configured_mode(cluster) {
        // Not enabled: `admit` refused it already, or it was disabled
        // since; the revocation ends it.
        None => Ok(()),
        Some(Err(why)) => Err(Status::failed_precondition(format!(
            "cluster {cluster}: cannot tell which mode its agent may run in: {why}"
        ))),
        Some(Ok(c)) if version::mode_name(c.mode) == claimed => Ok(()),
        Some(Ok(c)) => Err(Status::permission_denied(format!(
            "cluster {cluster} is configured for {} mode ({}), and this agent runs in {claimed} mode; set AGENT_MODE on the cluster's AddOnDeploymentConfig to change the mode",
            version::mode_name(c.mode),
            c.source
        ))),
    }
}
