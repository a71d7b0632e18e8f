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

/// A gRPC grant of project `project` for hub Application uid `owner`.
pub fn grant(owner: &str, project: &str) -> std::sync::Arc<crate::authorized::Grant> {
    std::sync::Arc::new(crate::authorized::Grant {
        owner: owner.into(),
        source_namespace: "team".into(),
        project: project.into(),
        destination: Default::default(),
        transport: crate::route::transport::Transport::Grpc,
        checked: Default::default(),
        sources: Some(vec!["https://git.example/team/app.git".into()]),
    })
}
