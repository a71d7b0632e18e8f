//! What argocd-pull writes onto the dormant hub copy, for both transports,
//! as far as it is pure: its condition and refusal reasons
//! ([`condition`]), work feedback turned into status ([`feedback`]), the
//! status observed on the spoke ([`observed`]), the rule that shows a
//! finished sync as `Progressing` once ([`progress`]) and the rule that
//! keeps a hub copy's `terminate-op` until the spoke acts on it
//! ([`terminating`]). The hub-controller's `status` module adds the merge
//! patch and the one writer of hub Applications.

pub mod condition;
pub mod feedback;
pub mod observed;
pub mod progress;
pub mod terminating;

pub use condition::{CONDITION, Reason};
