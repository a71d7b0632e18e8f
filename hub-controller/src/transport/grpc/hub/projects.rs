//! The AppProjects and project-scoped credentials a gRPC cluster's agent
//! keeps (capability `projects`, managed mode): exactly the projects of the
//! hub's record of what it authorized and delivered there
//! ([`crate::authorized`]), each as the cluster's Argo CD gets it
//! ([`crate::render::project`], as over the ManifestWork transport), with
//! the credentials scoped to those whose grant still stands, and nothing
//! else. The project a tenant writes on a hub copy now never adds one: a
//! refused change leaves the kept copy's grant as it was delivered.
//!
//! The replica serving the cluster's agent builds the set from the record
//! (the leader's Leases, and the copies this replica delivered), the
//! decisions every replica makes alike, and its caches, and sends it whole
//! ([`ProjectSet`]) after the Welcome, when it changes, and again at each
//! digest interval until the agent acknowledges its version.

use argocd_pull_proto::content;
use argocd_pull_proto::limits::MAX_MESSAGE_BYTES;
use argocd_pull_proto::v1::ProjectSet;
use tokio::sync::watch;

use super::Hub;
use crate::authorized::{self, ClusterRecord};
use crate::render::project::{credentials_by_project, delivered_project};
use crate::route::target::DEFAULT_APP_NAMESPACE;
use crate::route::transport::Transport;
use crate::transport::grpc::cluster::ClusterState;

/// Room left in a message for its framing.
const MARGIN: usize = 64 * 1024;

impl Hub {
    /// Told of every change of an AppProject or a credential Secret.
    pub fn projects_changed(&self) -> watch::Receiver<u64> {
        self.offers.projects_epoch.subscribe()
    }

    pub(super) fn project_or_credential_changed(&self) {
        self.offers.projects_epoch.send_modify(|n| *n += 1);
    }

    /// `cluster`'s record as this replica has it now
    /// ([`super::granted::Granted::record`]).
    pub fn authorized_record(&self, cluster: &str) -> ClusterRecord {
        self.writing.granted.record(cluster)
    }

    /// What `cs`'s agent must keep, or why it cannot be sent.
    pub fn project_set(&self, cs: &ClusterState) -> Result<ProjectSet, String> {
        let record = self.authorized_record(&cs.name);
        let used = authorized::projects(
            record.values(),
            Transport::Grpc,
            |name| self.caches.project(name),
            self.config.authorization.projects.as_deref(),
        );
        let secrets = self.caches.projects.credentials.state();
        let mut credentials =
            credentials_by_project(secrets.iter().map(|s| &**s), DEFAULT_APP_NAMESPACE);
        let mut objects = Vec::new();
        for (name, with_credentials) in &used {
            let Some(project) = self.caches.project_object(name) else {
                continue;
            };
            objects.push(delivered_project(&project, &cs.name, DEFAULT_APP_NAMESPACE));
            let scoped = credentials.remove(name).unwrap_or_default();
            if *with_credentials {
                objects.extend(scoped);
            }
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
