//! Pure: where a hub Application goes and by which transport, decided once
//! for both ([`decide`]): the target cluster and spoke namespace from its
//! annotations ([`target`]), the transport ([`transport`]), whether its
//! namespace may deploy there ([`authz`]), whether its AppProject allows
//! it ([`project`], with Argo CD's [`glob`]s); and what that means for the
//! gRPC transport's index ([`assign`]). No client, no I/O.

pub mod assign;
pub mod authz;
pub mod decide;
pub mod glob;
pub mod project;
pub mod target;
pub mod transport;
