//! The wire contract between the hub-controller and the spoke-agents.
//!
//! Empty until the gRPC transport lands: the `.proto` files and the code
//! generated from them will live here, so that the hub and the agent can
//! only disagree on the protocol through an explicit version negotiation.

#![forbid(unsafe_code)]
