//! What the hub-controller knows about the hub, shared by both transports:
//! the watch caches and what they trigger ([`caches`]), Applications as
//! the caches keep them ([`cached`]), and the writes they do not show yet
//! ([`written`]).

pub mod cached;
pub mod caches;
pub mod written;

pub use written::Written;
