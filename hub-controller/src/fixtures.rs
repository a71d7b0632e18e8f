//! Test fixtures of the hub-controller's unit tests: the core's
//! ([`argocd_pull_core::fixtures`]) and the wire contract's keys.

pub use argocd_pull_core::fixtures::*;
use argocd_pull_proto::v1::ObjectKey;

pub fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey {
        namespace: ns.into(),
        name: name.into(),
    }
}
