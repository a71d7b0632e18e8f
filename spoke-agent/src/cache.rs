//! This cluster's Applications as the agent's watch shows them (the watch
//! that fills it is started by [`crate::run_agent`]). The workers read here
//! what they act on, and the agent's replica of the hub's desired set is
//! computed from it.

use std::sync::Arc;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_proto::digest::Entries;
use argocd_pull_proto::v1::ObjectKey;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::apply;

/// The watch's store of Applications, read by key or as a whole.
#[derive(Clone)]
pub struct Cache {
    store: Store<Application>,
}

impl Cache {
    pub fn new(store: Store<Application>) -> Self {
        Self { store }
    }

    /// The Application at `key`, if the watch shows one.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Application>> {
        self.store
            .get(&ObjectRef::new_with(&key.name, application_resource()).within(&key.namespace))
    }

    /// Every Application the watch shows.
    pub fn all(&self) -> Vec<Arc<Application>> {
        self.store.state()
    }

    /// The agent's replica of the hub's desired set: the version it applied
    /// of each Application it manages ([`apply::replica_version`]).
    pub fn desired_replica(&self) -> Entries {
        self.all()
            .iter()
            .filter_map(|a| Some((apply::key_of(a), apply::replica_version(a)?)))
            .collect()
    }
}
