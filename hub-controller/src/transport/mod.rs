//! The two ways a hub Application reaches its cluster, each reading the
//! decisions of [`crate::route`] and the objects of [`crate::render`], and
//! writing back through [`crate::status`]: [`manifestwork`] (the OCM work
//! agent applies a ManifestWork) and [`grpc`] (our spoke-agent dials in).

pub mod grpc;
pub mod manifestwork;
