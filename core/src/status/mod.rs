//! What argocd-pull writes onto the dormant hub copy, for both transports,
//! as far as it is pure: its condition and refusal reasons
//! ([`condition`]), work feedback turned into status ([`feedback`]), the
//! status observed on the spoke ([`observed`]), the rule that
//! keeps a hub copy's `terminate-op` until the spoke acts on it
//! ([`terminating`]), and the resource tree argocd-server reads from its
//! Redis, built from the status ([`tree`]). The hub-controller's `status`
//! module adds the merge patch, the one writer of hub Applications and the
//! writer of the trees.

pub mod condition;
pub mod feedback;
pub mod observed;
pub mod terminating;
pub mod tree;

pub use condition::{CONDITION, Reason};
