//! A raw gRPC client of the hub, for tests that play an agent saying what
//! a well-behaved spoke-agent never would: another cluster's keys, forged
//! reports, expired or foreign certificates.

use std::time::Duration;

use argocd_pull_proto::v1::transport_client::TransportClient;
use argocd_pull_proto::v1::{
    AgentMessage, AgentMode, Hello, HubMessage, ObjectKey, ObjectMeta, ObservedApplication,
    StatusReport, agent_message, hub_message, status_report,
};
use argocd_pull_proto::version;
use testenv::pki::CertKey;
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Status, Streaming};

/// An open stream: what to send on, what the hub sends.
pub type Opened = (
    mpsc::Sender<AgentMessage>,
    Streaming<HubMessage>,
    HubMessage,
);

/// A raw stream to the hub at `address` (trusting `ca_pem` for its serving
/// certificate) with `identity`, opened with `first`; the hub's first
/// answer, or how the hub refused.
pub async fn open(
    address: &str,
    ca_pem: &str,
    identity: &CertKey,
    first: AgentMessage,
) -> Result<Opened, Status> {
    open_on(channel(address, ca_pem, identity, None).await?, first).await
}

/// One connection to the hub, for opening several streams on it.
/// `window`: the HTTP/2 receive window (bytes) of the connection and of
/// each stream, to play a client that reads slowly; `None` for tonic's.
pub async fn channel(
    address: &str,
    ca_pem: &str,
    identity: &CertKey,
    window: Option<u32>,
) -> Result<Channel, Status> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
    Endpoint::from_shared(address.to_string())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("{e:?}")))
}

/// A stream on `channel`, opened with `first`; see [`open`].
pub async fn open_on(channel: Channel, first: AgentMessage) -> Result<Opened, Status> {
    let mut client = TransportClient::new(channel)
        .max_encoding_message_size(64 << 20)
        .max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel(16);
    tx.send(first).await.unwrap();
    let mut inbound = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let reply = tokio::time::timeout(Duration::from_secs(30), inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no answer"))??
        .ok_or_else(|| Status::cancelled("closed"))?;
    Ok((tx, inbound, reply))
}

/// A managed agent's Hello speaking protocol versions `min..=max`.
pub fn hello(min: u32, max: u32) -> AgentMessage {
    let mut h: Hello = version::hello(AgentMode::Managed, "test");
    h.min_protocol_version = min;
    h.max_protocol_version = max;
    AgentMessage {
        kind: Some(agent_message::Kind::Hello(h)),
    }
}

/// A status report of the Application `key` (the managed cluster's
/// namespace and name).
pub fn report(key: ObjectKey, seq: u64, status_json: Vec<u8>) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::Status(StatusReport {
            key: Some(key),
            seq,
            state: Some(status_report::State::Observed(ObservedApplication {
                meta: Some(ObjectMeta {
                    version: "v1".into(),
                    ..Default::default()
                }),
                status_json,
                ..Default::default()
            })),
            trace_parent: String::new(),
        })),
    }
}

/// The next message, digests and heartbeats included, or the error.
pub async fn any_next(inbound: &mut Streaming<HubMessage>) -> Result<HubMessage, Status> {
    tokio::time::timeout(Duration::from_secs(30), inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no answer"))??
        .ok_or_else(|| Status::cancelled("closed"))
}

/// The next message that is not a digest, heartbeat or project set (what
/// the hub sends on its own, not in answer), or the error.
pub async fn next(inbound: &mut Streaming<HubMessage>) -> Result<HubMessage, Status> {
    loop {
        let m = any_next(inbound).await?;
        if !matches!(
            m.kind,
            Some(
                hub_message::Kind::Digest(_)
                    | hub_message::Kind::Heartbeat(_)
                    | hub_message::Kind::ProjectSet(_)
            )
        ) {
            return Ok(m);
        }
    }
}

/// How the hub refused; fails the test if it accepted.
pub fn refused(result: Result<impl std::fmt::Debug, Status>) -> Status {
    match result {
        Ok(v) => panic!("accepted: {v:?}"),
        Err(s) => s,
    }
}

/// That the hub refused with `code` and a message saying `says`; fails the
/// test otherwise.
pub fn refused_with(
    result: Result<impl std::fmt::Debug, Status>,
    code: tonic::Code,
    says: &str,
) -> Status {
    let status = refused(result);
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(says), "{status:?}");
    status
}
