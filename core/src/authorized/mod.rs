//! Pure: the hub's record of what it authorized and delivered, and what a
//! cluster receives because of it.
//!
//! For every (cluster, spoke Application) the record holds one [`Grant`]:
//! the hub Application it was delivered for (its uid), the project and
//! destination the hub checked, the transport, and the version of the
//! project it was checked against. A grant is written when the hub
//! authorizes a delivery, and only then; a refused change never writes one
//! (the copy kept on the cluster keeps the grant it was delivered with),
//! and a key that no hub Application delivers or keeps any more loses its
//! grant ([`next`]).
//!
//! What a cluster gets of AppProjects and project-scoped credentials
//! follows from its grants alone ([`projects`]), never from what a tenant
//! writes on the hub copy now (its `spec.project`) nor from what a cluster
//! writes (its works, its reports). A grant whose project no longer allows
//! what it recorded (the namespace, the source repositories, the
//! destination), or whose project is gone, *stands no more*: its project still reaches the cluster with the
//! hub's current content, which is what makes the cluster's Argo CD refuse
//! the kept copy as the hub does, but its credentials do not.

use std::collections::BTreeMap;

use argocd_pull_apis::argocd::{Application, ProjectSpec};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::route::project;
use crate::route::target::Target;
use crate::route::transport::Transport;

/// A spoke Application: (namespace, name) on its cluster.
pub type SpokeKey = (String, String);

/// One cluster's grants, by spoke Application.
pub type ClusterRecord = BTreeMap<SpokeKey, Grant>;

/// The version of an AppProject a delivery was checked against.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectVersion {
    #[serde(rename = "rv", default)]
    pub resource_version: String,
    #[serde(rename = "gen", default)]
    pub generation: i64,
}

/// What the hub authorized and delivered under one spoke key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The uid of the hub Application it was delivered for.
    #[serde(rename = "owner")]
    pub owner: String,
    /// The hub Application's namespace (what `sourceNamespaces` allowed).
    #[serde(rename = "ns")]
    pub source_namespace: String,
    pub project: String,
    /// Where it deploys, as the project check saw it.
    #[serde(rename = "dest")]
    pub destination: GrantedDestination,
    #[serde(with = "transport_name")]
    pub transport: Transport,
    /// The project's version the check was made against.
    #[serde(rename = "checked", default)]
    pub checked: ProjectVersion,
    /// The source repositories of the delivered copy (`repoURL` of its
    /// source, of each of its sources, or of its hydrator's dry source), as
    /// the check saw them. `None` in a grant stored before they were
    /// recorded: what such a grant was checked for is unknown, so it
    /// [`stands`] no more (its credentials wait for the copy's next
    /// authorized delivery, which records them).
    #[serde(rename = "src", default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<String>>,
}

/// The destination as authorized: the hub allows only the cluster itself
/// ([`project::check`]), so what is recorded is that cluster and the
/// namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantedDestination {
    /// The ManagedCluster.
    #[serde(default)]
    pub name: String,
    /// The server the delivered copy names (the in-cluster server), `None`
    /// when it names its cluster `in-cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    #[serde(default)]
    pub namespace: String,
}

mod transport_name {
    use super::Transport;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Transport, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(t.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Transport, D::Error> {
        match String::deserialize(d)?.as_str() {
            "grpc" => Ok(Transport::Grpc),
            "manifestwork" => Ok(Transport::ManifestWork),
            other => Err(serde::de::Error::custom(format!("no transport {other:?}"))),
        }
    }
}

/// The grant of `app`, delivered to `target` by `transport` after its
/// project (at `checked`) allowed it.
pub fn grant(
    app: &Application,
    target: &Target,
    transport: Transport,
    checked: ProjectVersion,
) -> Grant {
    let d = project::destination(app);
    Grant {
        owner: app.metadata.uid.clone().unwrap_or_default(),
        source_namespace: app.namespace().unwrap_or_default(),
        project: argocd_pull_apis::argocd::project_of(app).to_string(),
        destination: GrantedDestination {
            name: target.cluster.clone(),
            server: d.server,
            namespace: d.namespace,
        },
        transport,
        checked,
        sources: Some(
            argocd_pull_apis::argocd::source_repos(app)
                .into_iter()
                .map(str::to_string)
                .collect(),
        ),
    }
}

/// What the hub decides now for one spoke key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Now {
    /// A delivery authorized now: its grant replaces what was recorded.
    Authorized(Grant),
    /// Refused now, and the copy delivered before stays on the cluster:
    /// the recorded grant stays when it was made for one of `owners` (the
    /// refused hub Applications that name the key).
    Kept { owners: Vec<String> },
    /// Nothing is delivered or kept there for the hub (deleted, moved,
    /// handed to the other transport).
    Nothing,
}

/// The record of one cluster after `now`: a key `now` does not name, or
/// names with [`Now::Nothing`], has no grant; an authorized delivery has
/// its own; a kept copy keeps the grant it was delivered with, and only
/// that one. When several decisions name one key, an authorized one wins.
pub fn next(
    recorded: &ClusterRecord,
    now: impl IntoIterator<Item = (SpokeKey, Now)>,
) -> ClusterRecord {
    let mut out = ClusterRecord::new();
    let mut authorized = std::collections::BTreeSet::new();
    for (key, decision) in now {
        match decision {
            Now::Authorized(g) => {
                authorized.insert(key.clone());
                out.insert(key, g);
            }
            Now::Kept { owners } if !authorized.contains(&key) => {
                if let Some(g) = recorded.get(&key).filter(|g| owners.contains(&g.owner)) {
                    out.insert(key, g.clone());
                }
            }
            Now::Kept { .. } | Now::Nothing => {}
        }
    }
    out
}

/// Whether `project` (as it is now) still allows what `grant` recorded:
/// its namespace, every one of its source repositories and its
/// destination, by the rules the check used. A grant that recorded no
/// sources (stored before they were) does not. Always, when projects are
/// not enforced (`control_plane` is `None`).
pub fn stands(grant: &Grant, project: &ProjectSpec, control_plane: Option<&str>) -> bool {
    let Some(control_plane) = control_plane else {
        return true;
    };
    let d = &grant.destination;
    let sources_permitted = grant.sources.as_ref().is_some_and(|repos| {
        repos
            .iter()
            .all(|repo| project::source_permitted(project, repo))
    });
    project::namespace_permitted(project, &grant.source_namespace, control_plane)
        && sources_permitted
        && project::cluster_itself_permitted(project, &d.name, &d.namespace)
}

/// The projects a cluster receives from `grants` (those of `transport`),
/// each with whether its project-scoped credentials go with it: a project
/// that exists goes when a grant names it; its credentials only when one
/// of those grants still [`stands`]. `project` gives a project's spec now.
pub fn projects<'a>(
    grants: impl IntoIterator<Item = &'a Grant>,
    transport: Transport,
    project: impl Fn(&str) -> Option<ProjectSpec>,
    control_plane: Option<&str>,
) -> BTreeMap<String, bool> {
    let mut specs: BTreeMap<&str, Option<ProjectSpec>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for g in grants.into_iter().filter(|g| g.transport == transport) {
        let spec = specs
            .entry(g.project.as_str())
            .or_insert_with(|| project(&g.project));
        let Some(spec) = spec else { continue };
        let credentials = stands(g, spec, control_plane);
        let entry = out.entry(g.project.clone()).or_insert(false);
        *entry |= credentials;
    }
    out
}

/// The record's size at most, in bytes of JSON: annotations of one object
/// may take 256 KiB in all; a grant takes 200 to 400 bytes with one
/// source, so this holds about six hundred spoke Applications per cluster
/// (fewer with several long source URLs).
pub const MAX_BYTES: usize = 200 * 1024;

/// `record` as JSON (`{"<namespace>/<name>": {grant}, ...}`, in key order:
/// the same record is always the same text), and how many grants did not
/// fit in [`MAX_BYTES`] (left out, in key order from the last).
pub fn encode(record: &ClusterRecord) -> (String, usize) {
    let mut map = serde_json::Map::new();
    let mut bytes = 2;
    let mut left_out = 0;
    for ((ns, name), g) in record {
        let value = serde_json::to_value(g).expect("a grant serialises");
        let key = format!("{ns}/{name}");
        let size = key.len() + value.to_string().len() + 4;
        if bytes + size > MAX_BYTES {
            left_out += 1;
            continue;
        }
        bytes += size;
        map.insert(key, value);
    }
    (serde_json::Value::Object(map).to_string(), left_out)
}

/// The record in `json`; an entry that is not a `namespace/name` key with
/// a grant is skipped (only the hub writes it, but a bad edit must not
/// stop a replica).
pub fn decode(json: &str) -> ClusterRecord {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(json) else {
        return ClusterRecord::new();
    };
    map.into_iter()
        .filter_map(|(k, v)| {
            let (ns, name) = k.split_once('/')?;
            let g: Grant = serde_json::from_value(v).ok()?;
            (!ns.is_empty() && !name.is_empty() && !g.owner.is_empty())
                .then(|| ((ns.to_string(), name.to_string()), g))
        })
        .collect()
}

#[cfg(test)]
mod tests;
