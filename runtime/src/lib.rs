//! The runtime shared by argocd-pull's binaries, so that each `main.rs` only
//! wires its own parts: logging, the Kubernetes client, the admin port and
//! graceful shutdown behave the same in every component.

#![forbid(unsafe_code)]

pub mod admin;
pub mod args;
pub mod backoff;
pub mod client;
pub mod lease;
pub mod net;
pub mod redis;
pub mod shutdown;
pub mod task;
pub mod telemetry;
pub mod websocket;
pub mod workqueue;

pub use admin::{Admin, Readiness};
pub use args::{AdminArgs, ClientArgs, LeaderElectionArgs, LogArgs, parse_duration};
