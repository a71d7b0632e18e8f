//! What a hub-controller replica reports on `/status` (its admin port), as
//! JSON: the wire contract between the hub and `kubectl argocd-pull
//! status` and `certs` (docs/operations.md).

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::route::authz::Authorization;

/// The admin path of the report.
pub const PATH: &str = "/status";

/// What one replica reports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The pod (or host) name of the replica.
    pub replica: String,
    /// The hub-controller's version.
    pub version: String,
    /// Whether this replica serves (every replica does while it runs).
    pub serving: bool,
    /// Whether it leads: runs the ManifestWork transport and writes for the
    /// clusters no replica holds.
    #[serde(default)]
    pub leader: bool,
    /// Whether it serves the gRPC transport.
    pub grpc: bool,
    /// How it authorizes targets, while it serves.
    pub authorization: Option<AuthorizationReport>,
    /// The gRPC serving certificate it presents, once it has one.
    pub serving_certificate: Option<Certificate>,
    /// The agents connected to it, by cluster name.
    pub agents: Vec<AgentReport>,
}

/// `--authorization` and `--allowed-target`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationReport {
    pub require_placement: bool,
    /// `NAMESPACE=CLUSTER` rules.
    pub allowed_targets: Vec<String>,
    /// `--argocd-namespace` when AppProjects are enforced (`--app-projects`);
    /// absent from a hub that does not check them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_projects: Option<String>,
}

impl From<&Authorization> for AuthorizationReport {
    fn from(a: &Authorization) -> Self {
        Self {
            require_placement: a.require_placement,
            allowed_targets: a
                .allow
                .iter()
                .map(|r| format!("{}={}", r.namespace, r.cluster))
                .collect(),
            app_projects: a.projects.clone(),
        }
    }
}

impl AuthorizationReport {
    /// The authorization it stands for (rules that do not parse are left out).
    pub fn authorization(&self) -> Authorization {
        Authorization {
            require_placement: self.require_placement,
            allow: self
                .allowed_targets
                .iter()
                .filter_map(|r| r.parse().ok())
                .collect(),
            projects: self.app_projects.clone(),
        }
    }
}

/// A certificate's validity, in seconds since the Unix epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    pub not_before: i64,
    pub not_after: i64,
    /// When it is due for renewal (a third of its lifetime left).
    pub renew_at: i64,
}

impl Certificate {
    /// The first certificate of `pem`, if it parses.
    pub fn of_pem(pem: &str) -> Option<Self> {
        let v = crate::validity::validity(pem)?;
        Some(Self {
            not_before: secs(v.not_before),
            not_after: secs(v.not_after),
            renew_at: secs(v.renew_at()),
        })
    }
}

/// One connected agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    pub cluster: String,
    /// `managed` or `autonomous`.
    pub mode: String,
    /// The agent's version, from its `Hello`.
    pub version: String,
    /// When its session began.
    pub connected_since: i64,
    /// When the hub last heard from it (any message), if it did.
    pub last_seen: Option<f64>,
    /// Age of the oldest object message it has not acknowledged.
    pub lag_seconds: f64,
    /// Expiry of the client certificate it connected with.
    pub certificate_not_after: i64,
    /// SHA-256 of that certificate (what the deny list names).
    pub certificate_fingerprint: String,
}

/// Seconds since the Unix epoch.
pub fn secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64
}
