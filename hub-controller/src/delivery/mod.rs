//! Pure transforms of the ManifestWork transport: hub Application ->
//! target cluster -> delivered copy -> ManifestWork, and ManifestWork
//! feedback -> hub status. No client, no I/O: everything here is tested
//! with plain values.

pub mod authz;
pub mod cluster_secret;
pub mod delivered;
pub mod feedback;
pub mod operation;
pub mod target;
pub mod transport;
pub mod work;

pub use delivered::delivered_copy;
