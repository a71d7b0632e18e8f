//! The pure core of argocd-pull: where a hub Application goes and by
//! which transport ([`route`]), what is sent to the managed cluster
//! ([`render`]), and what is written back onto the dormant hub copy
//! ([`status`]). No Kubernetes client, no gRPC, no I/O: this crate depends
//! on neither `kube`'s client nor `tonic`, so the compiler keeps it pure.
//! The hub-controller runs it; `kubectl argocd-pull explain` decides with
//! the same [`route::decide`].

#![forbid(unsafe_code)]

pub mod authorized;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod live;
pub mod render;
pub mod report;
pub mod route;
pub mod status;
pub mod validity;
