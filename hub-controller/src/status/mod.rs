//! What argocd-pull writes onto the dormant hub copy, for both transports:
//! its condition and refusal reasons ([`condition`]), the rule that shows a
//! finished sync as `Progressing` once ([`progress`]), the rule that keeps
//! a hub copy's `terminate-op` until the spoke acts on it
//! ([`terminating`]), the merge patch that
//! writes it ([`patch`]), and the one writer of hub Applications
//! ([`writer`]) that never decides from a cache older than its own writes.

pub mod condition;
pub mod feedback;
pub mod observed;
pub mod patch;
pub mod progress;
pub mod terminating;
pub mod writer;

pub use condition::{CONDITION, Reason};
pub use writer::AppWriter;
