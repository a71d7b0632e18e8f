//! The I/O side of the ManifestWork transport: a kube-runtime controller
//! over pull-model Applications, and the sweep of orphaned ManifestWorks.
//! Every decision is made by the pure functions in [`crate::delivery`].

pub mod application;
pub mod clusters;
pub mod sweep;

use std::sync::Arc;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::delivery::authz::Authorization;
use crate::delivery::work::WorkOptions;
use crate::metrics::Metrics;

/// Field manager of the ManifestWorks.
pub const WORK_MANAGER: &str = "argocd-pull-hub";
/// Field manager of the status written onto hub Applications.
pub const STATUS_MANAGER: &str = "argocd-pull-status";
/// Condition type on the hub Application when it cannot be delivered or
/// applied. Argo CD's UI shows `...Error` conditions as errors.
pub const CONDITION: &str = "PullDeliveryError";

/// Shared state of the reconcilers.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub options: WorkOptions,
    pub authorization: Authorization,
    pub metrics: Metrics,
}

impl Context {
    pub fn new(
        client: Client,
        options: WorkOptions,
        authorization: Authorization,
        metrics: Metrics,
    ) -> Arc<Self> {
        let reporter = Reporter {
            controller: "argocd-pull-hub-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            options,
            authorization,
            metrics,
        })
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
