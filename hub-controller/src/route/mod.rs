//! Pure: where a hub Application goes and by which transport, decided once
//! for both ([`decide`]): the target cluster and spoke namespace from its
//! annotations ([`target`]), the transport ([`transport`]), whether its
//! namespace may deploy there ([`authz`]); and what that means for the gRPC
//! transport's index ([`assign`]). No client, no I/O.

pub mod assign;
pub mod authz;
pub mod decide;
pub mod target;
pub mod transport;
