//! What the hub-controller knows about the hub, shared by both transports.

pub mod written;

pub use written::Written;
