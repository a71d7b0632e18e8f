//! What the hub-controller knows about the hub, shared by both transports:
//! the one set of watches ([`watches`]) feeding every transport, the caches
//! they fill and what they trigger ([`caches`]), Applications as the caches
//! keep them ([`cached`], compressed by [`crate::compact`], their labels
//! and annotations packed by [`pairs`]), which mode each agent must run in ([`mode`]), and the writes they do not show yet ([`written`]).

pub mod cached;
pub mod caches;
pub mod mode;
pub mod pairs;
pub mod slots;
pub mod watches;
pub mod written;

pub use written::Written;
