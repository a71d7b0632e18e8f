//! Pure: where a hub Application goes and by which transport. The target
//! cluster and spoke namespace from its annotations ([`target`]), whether
//! its namespace may deploy there ([`authz`]), and the transport
//! ([`transport`]). No client, no I/O.

pub mod assign;
pub mod authz;
pub mod target;
pub mod transport;
