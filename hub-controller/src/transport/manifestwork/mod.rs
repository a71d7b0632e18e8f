//! The I/O side of the ManifestWork transport: a kube-runtime controller
//! over pull-model Applications, and the sweep of orphaned ManifestWorks.
//! Every decision is made by the pure functions in [`crate::route`],
//! [`crate::render`] and [`crate::status`].

pub mod application;
pub mod cluster_secrets;
pub mod controller;
mod handover;
pub mod projects;
pub mod sweep;
pub mod triggers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::watch::cached::CachedApp;
use crate::watch::caches::{Caches, Queue};

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
    /// The hub's one set of caches, shared with the gRPC transport.
    pub caches: Caches,
    pub queue: Queue,
    /// The gRPC transport, when this hub serves it: Applications it
    /// delivers are left to it (see [`crate::route::transport`]).
    pub grpc: Option<Arc<crate::transport::grpc::Hub>>,
    /// Applications the watches' events concern, to reconcile (see
    /// [`triggers`]), sent to the controller of the current term
    /// ([`triggers::Gate`]); none between terms.
    triggers: Mutex<Option<mpsc::UnboundedSender<ObjectRef<CachedApp>>>>,
    /// The last generation seen of each ManagedCluster: only a new one
    /// (a cluster joining or its spec changing) re-reconciles its
    /// Applications, not every status heartbeat.
    cluster_generations: Mutex<HashMap<String, Option<i64>>>,
    /// Works whose current version the work agent has not reported applied
    /// yet, with when this process first saw them so (see
    /// [`crate::status::feedback::not_applied`]).
    pub(crate) unapplied: Mutex<HashMap<(String, String), std::time::Instant>>,
    /// What the AppProject works' passes must look at ([`projects`]).
    pub projects: projects::Changes,
    /// Where the leader keeps the record of what the hub authorized
    /// ([`crate::authorized`]); without it the record lives in the passes'
    /// memory only.
    pub authorized: std::sync::OnceLock<Arc<crate::authorized::Records>>,
}

impl Context {
    /// A context reading `caches` (fed by [`crate::watch::watches`], with
    /// this context among the consumers); `grpc` when the hub also serves
    /// the gRPC transport.
    pub fn new(
        client: Client,
        options: WorkOptions,
        authorization: Authorization,
        metrics: Metrics,
        caches: Caches,
        grpc: Option<Arc<crate::transport::grpc::Hub>>,
    ) -> Arc<Self> {
        let writer = grpc
            .as_ref()
            .map(|g| g.writer.clone())
            .unwrap_or_else(|| AppWriter::new(client.clone()));
        Arc::new(Self {
            writer,
            client,
            options,
            authorization,
            queue: Queue::new(metrics.queue_depth.clone()),
            metrics,
            caches,
            grpc,
            triggers: Mutex::default(),
            cluster_generations: Mutex::default(),
            unapplied: Mutex::default(),
            projects: projects::Changes::default(),
            authorized: std::sync::OnceLock::new(),
        })
    }

    /// Starts a term of the controller: the Applications to reconcile
    /// come on the receiver until [`Context::end_term`] or the next term.
    /// Cluster generations seen before are forgotten: events between
    /// terms were not heard.
    fn start_term(&self) -> mpsc::UnboundedReceiver<ObjectRef<CachedApp>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.cluster_generations.lock().expect("lock").clear();
        *self.triggers.lock().expect("lock") = Some(tx);
        rx
    }

    /// Ends the term: triggers are dropped until the next one.
    fn end_term(&self) {
        *self.triggers.lock().expect("lock") = None;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}
