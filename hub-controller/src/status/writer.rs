//! The one writer of hub Applications, for both transports: status and
//! condition, the commands taken off once handed over, finalizers, and the
//! Events that explain a refusal. Each kind of write has its own field
//! manager, so `managedFields` says who wrote what.
//!
//! Every write is remembered (see [`crate::watch::Written`]) until the watch
//! cache shows it: callers ask [`AppWriter::behind`] before deciding, and
//! decide again when the write's echo arrives. That is what keeps a slow
//! watch from turning into repeated writes.

use std::sync::Arc;

use argocd_pull_apis::argocd::{Application, application_resource};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::patch::status_patch;
use crate::watch::Written;

/// Field manager of the status written onto hub Applications.
pub const STATUS_MANAGER: &str = "argocd-pull-status";
/// Field manager of the commands (sync, refresh) taken off the hub copy
/// once handed over, and of their id stamps.
pub const COMMAND_MANAGER: &str = "argocd-pull-commands";
/// Field manager of the finalizer release.
pub const FINALIZER_MANAGER: &str = "argocd-pull-finalizers";

pub struct AppWriter {
    client: Client,
    recorder: Recorder,
    written: Written,
}

impl AppWriter {
    pub fn new(client: Client) -> Arc<Self> {
        let reporter = Reporter {
            controller: "argocd-pull-hub-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            written: Written::default(),
        })
    }

    /// Whether the cached object is older than our last write of it: then
    /// nothing is decided from it, the echo of the write brings it back.
    pub fn behind(&self, cached: &ObjectMeta) -> bool {
        self.written.behind(cached)
    }

    /// The writes whose echo has not arrived yet.
    pub fn written(&self) -> &Written {
        &self.written
    }

    fn api(&self, app: &Application) -> Api<Application> {
        Api::namespaced_with(
            self.client.clone(),
            &app.namespace().unwrap_or_default(),
            &application_resource(),
        )
    }

    /// Merge-patches `app` as `manager`, and returns it as written; `None`
    /// when it is gone or was changed meanwhile (a patch carrying a
    /// resourceVersion), to be decided again from its next version.
    pub async fn patch(
        &self,
        app: &Application,
        manager: &str,
        patch: &Value,
    ) -> Result<Option<Application>, kube::Error> {
        let params = PatchParams {
            field_manager: Some(manager.into()),
            ..Default::default()
        };
        match self
            .api(app)
            .patch(&app.name_any(), &params, &Patch::Merge(patch))
            .await
        {
            Ok(written) => {
                self.written.record(&written.metadata);
                Ok(Some(written))
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `wanted` into the status of `app` over `keys` (`None`: every
    /// key of either), unless the Application already shows exactly that.
    /// Returns the Application as written, if a write was needed.
    pub async fn write_status(
        &self,
        app: &Application,
        wanted: &Value,
        keys: Option<&[&str]>,
    ) -> Result<Option<Application>, kube::Error> {
        let current = app.data.get("status").unwrap_or(&Value::Null);
        let Some(patch) = status_patch(current, wanted, keys) else {
            return Ok(None);
        };
        tracing::debug!(namespace = %app.namespace().unwrap_or_default(), name = %app.name_any(), from = %current, to = %wanted, "writing status");
        self.patch(app, STATUS_MANAGER, &patch).await
    }

    /// Releases Argo CD's finalizers of a deleting hub copy (the hub's Argo
    /// CD skips the dormant copy, so only argocd-pull can, once the spoke
    /// has deleted its copy). Finalizers of others stay; the
    /// resourceVersion makes the patch fail rather than drop one added
    /// meanwhile.
    pub async fn release_finalizers(&self, app: &Application) -> Result<(), kube::Error> {
        let remaining: Vec<&String> = app
            .finalizers()
            .iter()
            .filter(|f| !is_argocd_finalizer(f))
            .collect();
        let patch = json!({ "metadata": {
            "finalizers": remaining,
            "resourceVersion": app.resource_version(),
        }});
        if self.patch(app, FINALIZER_MANAGER, &patch).await?.is_some() {
            tracing::info!(namespace = %app.namespace().unwrap_or_default(), name = %app.name_any(), "spoke copy deleted; finalizers released");
        }
        Ok(())
    }

    /// Publishes an Event on `app` (best effort: a failure is logged).
    pub async fn event(&self, app: &Application, type_: EventType, reason: &str, note: &str) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Deliver".into(),
            secondary: None,
        };
        let reference = app.object_ref(&application_resource());
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(error = %e, "could not publish event");
        }
    }
}

/// Argo CD's finalizers (`*.argocd.argoproj.io`, with or without a path).
pub fn is_argocd_finalizer(f: &str) -> bool {
    f.split('/')
        .next()
        .is_some_and(|domain| domain.ends_with("argocd.argoproj.io"))
}

/// Whether `app` is held by one of Argo CD's finalizers.
pub fn holds_argocd_finalizer(app: &Application) -> bool {
    app.finalizers().iter().any(|f| is_argocd_finalizer(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_every_argocd_finalizer() {
        for f in [
            "resources-finalizer.argocd.argoproj.io",
            "resources-finalizer.argocd.argoproj.io/background",
            "resources-finalizer.argocd.argoproj.io/foreground",
            "post-delete-finalizer.argocd.argoproj.io",
            "post-delete-finalizer.argocd.argoproj.io/cleanup",
        ] {
            assert!(is_argocd_finalizer(f), "{f}");
        }
        for f in [
            "example.com/keep",
            "kubernetes",
            "argocd.argoproj.io.evil.com/x",
        ] {
            assert!(!is_argocd_finalizer(f), "{f}");
        }
    }
}
