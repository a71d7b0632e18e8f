//! What the server and the hub are built with: the settings taken from
//! the flags, and the state every holder of them shares (the deny list in
//! force, the record of issued certificates).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::identity::IdentityMap;
use super::revoke::DenyList;
use super::{cluster, issued, tls};
use crate::route::authz::Authorization;

#[derive(Clone, Debug)]
pub struct GrpcConfig {
    pub addr: SocketAddr,
    pub tls: tls::TlsFiles,
    pub identities: IdentityMap,
    pub heartbeat: Duration,
    pub heartbeat_min: Duration,
    pub digest_interval: Duration,
    pub workers: usize,
    pub authorization: Authorization,
    pub limits: Limits,
    /// Shared by every holder of the configuration: the deny list in force,
    /// kept by [`super::hub::run_deny_list`].
    pub deny_list: Arc<DenyList>,
    /// Shared likewise: the certificates issued on each cluster's own
    /// request, kept by [`super::issued::run`] and [`super::issued::lead`].
    pub issued: Arc<issued::Issued>,
    /// Connections by wire; registered by the binary (unregistered,
    /// they count unseen).
    pub wires: tls::WireMetrics,
}

/// The limits, as the server uses them.
#[derive(Clone, Debug)]
pub struct Limits {
    pub handshakes: tls::HandshakeLimits,
    pub max_streams_per_connection: u32,
    pub max_connection_age: Duration,
    pub max_connection_age_grace: Duration,
    pub max_header_list_bytes: u32,
    pub control_queue: usize,
    pub mirrors: cluster::held::MirrorLimits,
}
