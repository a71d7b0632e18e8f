//! The state the hub holds for each cluster's agent
//! ([`ClusterState`]), by cluster name, created on first use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::histogram::Histogram;

use super::super::cluster::ClusterState;

/// Every cluster's state, shared by the parts of the hub.
pub struct Clusters {
    by_name: Mutex<HashMap<String, Arc<ClusterState>>>,
    /// Where each cluster counts its delivery times.
    delivery: Histogram,
}

impl Clusters {
    pub fn new(delivery: Histogram) -> Self {
        Self {
            by_name: Mutex::default(),
            delivery,
        }
    }

    /// The state of `cluster`, created on first use.
    pub fn get(&self, cluster: &str) -> Arc<ClusterState> {
        self.by_name
            .lock()
            .expect("never poisoned")
            .entry(cluster.to_string())
            .or_insert_with(|| {
                Arc::new(ClusterState::counting_delivery(
                    cluster,
                    self.delivery.clone(),
                ))
            })
            .clone()
    }

    /// The state of `cluster` if this replica has one (never created).
    pub fn find(&self, cluster: &str) -> Option<Arc<ClusterState>> {
        self.by_name
            .lock()
            .expect("never poisoned")
            .get(cluster)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<ClusterState>> {
        self.by_name
            .lock()
            .expect("never poisoned")
            .values()
            .cloned()
            .collect()
    }
}
