//! The AppProjects and project-scoped credentials a gRPC cluster's agent
//! keeps (capability `projects`, managed mode): the projects of the
//! Applications in the cluster's desired set, each as the cluster's Argo CD
//! gets it ([`crate::render::project`], as over the ManifestWork
//! transport), with the credentials scoped to them, and nothing else; a
//! credential never reaches a cluster with no Application of its project.
//!
//! The replica serving the cluster's agent builds the set from its caches
//! and the desired set, which every replica computes alike, and sends it
//! whole ([`ProjectSet`]) after the Welcome, when it changes, and again at
//! each digest interval until the agent acknowledges its version.

use std::collections::BTreeSet;

use argocd_pull_proto::content;
use argocd_pull_proto::limits::MAX_MESSAGE_BYTES;
use argocd_pull_proto::v1::ProjectSet;
use tokio::sync::watch;

use super::{Hub, app_ref};
use crate::render::project::{credentials_by_project, delivered_project};
use crate::route::target::DEFAULT_APP_NAMESPACE;
use crate::transport::grpc::cluster::ClusterState;

/// Room left in a message for its framing.
const MARGIN: usize = 64 * 1024;

impl Hub {
    /// Told of every change of an AppProject or a credential Secret.
    pub fn projects_changed(&self) -> watch::Receiver<u64> {
        self.projects_epoch.subscribe()
    }

    pub(super) fn project_or_credential_changed(&self) {
        self.projects_epoch.send_modify(|n| *n += 1);
    }

    /// What `cs`'s agent must keep, or why it cannot be sent.
    pub fn project_set(&self, cs: &ClusterState) -> Result<ProjectSet, String> {
        let used: BTreeSet<String> = {
            let refs: Vec<_> = cs.lock().desired.values().map(|d| d.hub.clone()).collect();
            refs.iter()
                .filter_map(|r| self.caches.apps.get(&app_ref(r)))
                .map(|a| a.project().to_string())
                .collect()
        };
        let secrets = self.caches.credentials.state();
        let mut credentials =
            credentials_by_project(secrets.iter().map(|s| &**s), DEFAULT_APP_NAMESPACE);
        let mut objects = Vec::new();
        for name in &used {
            // A project that does not exist: its Applications are refused.
            let Some(project) = self.caches.project_object(name) else {
                continue;
            };
            objects.push(delivered_project(&project, &cs.name, DEFAULT_APP_NAMESPACE));
            objects.extend(credentials.remove(name).unwrap_or_default());
        }
        let objects_json: Vec<Vec<u8>> = objects
            .iter()
            .map(|o| serde_json::to_vec(o).expect("JSON values serialise"))
            .collect();
        let size: usize = objects_json.iter().map(Vec::len).sum();
        if size + MARGIN > MAX_MESSAGE_BYTES {
            return Err(format!(
                "the AppProjects and credentials of cluster {} take {size} bytes, over what one message carries ({MAX_MESSAGE_BYTES} bytes)",
                cs.name
            ));
        }
        let version = content::hash_bytes(&objects_json.concat());
        Ok(ProjectSet {
            version,
            objects_json,
        })
    }
}
