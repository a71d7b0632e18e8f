//! The I/O side of the ManifestWork transport: a kube-runtime controller
//! over pull-model Applications, and the sweep of orphaned ManifestWorks.
//! Every decision is made by the pure functions in [`crate::route`],
//! [`crate::render`] and [`crate::status`].

pub mod application;
pub mod cluster_secrets;
pub mod controller;
pub mod sweep;

use std::sync::{Arc, Mutex};

use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork, placement_decision_resource};
use kube::Client;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::store::Writer;

use crate::hub::cached::CachedApp;
use crate::hub::caches::{Caches, Queue, Written};

use crate::metrics::Metrics;
use crate::render::work::WorkOptions;
use crate::route::authz::Authorization;
use crate::status::AppWriter;

/// Field manager of the ManifestWorks.
pub const WORK_MANAGER: &str = "argocd-pull-hub";

/// Shared state of the reconcilers.
pub struct Context {
    pub client: Client,
    /// The one writer of hub Applications, shared with the gRPC transport.
    pub writer: Arc<AppWriter>,
    pub options: WorkOptions,
    pub authorization: Authorization,
    pub metrics: Metrics,
    pub caches: Caches,
    pub queue: Queue,
    /// The gRPC transport, when this hub serves it: Applications it
    /// delivers are left to it (see [`crate::route::transport`]).
    pub grpc: Option<Arc<crate::transport::grpc::Hub>>,
    /// The write sides of the caches, taken once by the controller's run.
    writers: Mutex<Option<Writers>>,
}

/// Write sides of the watch-fed caches.
pub struct Writers {
    pub apps: Writer<CachedApp>,
    pub clusters: Writer<PartialObjectMeta<ManagedCluster>>,
    pub decisions: Writer<DynamicObject>,
    pub works: Writer<ManifestWork>,
}

impl Context {
    pub fn new(
        client: Client,
        options: WorkOptions,
        authorization: Authorization,
        metrics: Metrics,
    ) -> Arc<Self> {
        Self::with_grpc(client, options, authorization, metrics, None)
    }

    /// A context whose controller shares the clusters with the gRPC transport.
    pub fn with_grpc(
        client: Client,
        options: WorkOptions,
        authorization: Authorization,
        metrics: Metrics,
        grpc: Option<Arc<crate::transport::grpc::Hub>>,
    ) -> Arc<Self> {
        let writer = grpc
            .as_ref()
            .map(|g| g.writer.clone())
            .unwrap_or_else(|| AppWriter::new(client.clone()));
        let writers = Writers {
            apps: Writer::new(application_resource()),
            clusters: Writer::default(),
            decisions: Writer::new(placement_decision_resource()),
            works: Writer::default(),
        };
        let caches = Caches {
            clusters: writers.clusters.as_reader(),
            decisions: writers.decisions.as_reader(),
            works: writers.works.as_reader(),
            written: Written::default(),
            synced: Default::default(),
        };
        Arc::new(Self {
            writer,
            client,
            options,
            authorization,
            queue: Queue::new(metrics.queue_depth.clone()),
            metrics,
            caches,
            grpc,
            writers: Mutex::new(Some(writers)),
        })
    }

    /// The caches' write sides; `None` after the first call.
    pub fn take_writers(&self) -> Option<Writers> {
        self.writers.lock().expect("lock").take()
    }

    pub fn reconcile_count(&self) -> u64 {
        self.metrics.reconciles.get()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}
