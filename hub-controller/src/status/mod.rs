//! What argocd-pull writes onto the dormant hub copy, for both transports:
//! the pure rules of the core ([`argocd_pull_core::status`]: conditions and
//! the one Reason enum, work feedback, observed status, the
//! terminate-op rule, re-exported here), the merge
//! patch that writes it ([`patch`]), the one writer of hub Applications
//! ([`writer`]) that never decides from a cache older than its own writes,
//! and the resource trees written for the hub's argocd-server ([`trees`],
//! through [`argocd_pull_runtime::redis`]).

pub use argocd_pull_core::status::*;

pub mod patch;
pub mod trees;
pub mod writer;

pub use writer::AppWriter;
