//! The wire contract between the hub-controller and the spoke-agents.
//!
//! [`v1`] is generated from `proto/argocd_pull/v1/transport.proto` (read its
//! header for the protocol itself) and checked in; `proto/generate.sh --check`
//! fails when it drifts. The other modules are the protocol logic both sides
//! share, pure and without I/O, so that the hub and the agent cannot disagree
//! on it: version negotiation, size limits, message validation, the
//! coalescing outbox, content versions and the anti-entropy digests.

#![forbid(unsafe_code)]

pub mod coalesce;
pub mod codec;
pub mod content;
pub mod digest;
pub mod kind;
pub mod limits;
pub mod owner;
pub mod validate;
pub mod version;

/// Messages and the gRPC client and server of protocol package
/// `argocd_pull.v1`. Generated: never edit by hand.
#[path = "gen/argocd_pull.v1.rs"]
// Generated code is not edited to please a newer clippy.
#[allow(clippy::all)]
pub mod v1;
