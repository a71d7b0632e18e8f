//! Pure: where a hub Application goes and by which transport, decided once
//! for both ([`decide`]): the target cluster and spoke namespace from its
//! annotations ([`target`]), the transport ([`transport`]), whether its
//! namespace may deploy there ([`authz`]), whether its AppProject allows
//! it ([`project`], with Argo CD's [`glob`]s); and how both transports name
//! the hub copy they act for ([`HubRef`]). No client, no I/O.

pub mod authz;
pub mod decide;
pub mod glob;
mod hub_ref;
pub mod owner;
pub mod project;
pub mod target;
pub mod transport;

pub use hub_ref::HubRef;
