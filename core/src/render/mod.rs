//! Pure: what is sent to a managed cluster, built from the hub
//! Application: the delivered copy ([`delivered`]), the ManifestWork that
//! carries it ([`work`]) with the sync operation it hands over
//! ([`operation`]), the Argo CD cluster Secret of a ManagedCluster
//! ([`cluster_secret`]), and the AppProjects and project-scoped repository
//! credentials a cluster receives ([`project`]). No client, no I/O.

pub mod cluster_secret;
pub mod delivered;
pub mod operation;
pub mod project;
pub mod work;

pub use delivered::delivered_copy;
