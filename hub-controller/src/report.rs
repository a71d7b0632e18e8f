//! `/status` on the admin port: what this replica serves, as JSON, for
//! `kubectl argocd-pull status` and `certs` (docs/operations.md). Read-only:
//! it holds the agents' sessions and the serving certificate's file, never
//! anything the hub API has (the plugin reads that there).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use argocd_pull_proto::version::mode_name;
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::route::authz::Authorization;
use crate::transport::grpc::Hub;

pub use argocd_pull_core::report::*;

/// What the report is made from; filled in as the replica starts serving.
#[derive(Clone, Default)]
pub struct StatusPage(Arc<Mutex<Sources>>);

#[derive(Default)]
struct Sources {
    serving: bool,
    leader: bool,
    authorization: Option<AuthorizationReport>,
    grpc: Option<(Arc<Hub>, PathBuf)>,
}

impl StatusPage {
    /// This replica serves (or no longer does).
    pub fn set_serving(&self, serving: bool) {
        self.0.lock().expect("never poisoned").serving = serving;
    }

    /// This replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.0.lock().expect("never poisoned").leader = leader;
    }

    /// It authorizes targets with `authorization`.
    pub fn set_authorization(&self, authorization: &Authorization) {
        self.0.lock().expect("never poisoned").authorization = Some(authorization.into());
    }

    /// It serves the gRPC transport of `hub`, presenting the certificate in
    /// file `cert`.
    pub fn set_grpc(&self, hub: Arc<Hub>, cert: PathBuf) {
        self.0.lock().expect("never poisoned").grpc = Some((hub, cert));
    }

    /// The report now.
    pub fn report(&self) -> Report {
        let (serving, leader, authorization, grpc) = {
            let s = self.0.lock().expect("never poisoned");
            (s.serving, s.leader, s.authorization.clone(), s.grpc.clone())
        };
        let mut report = Report {
            replica: argocd_pull_runtime::lease::pod_name(),
            version: env!("CARGO_PKG_VERSION").into(),
            serving,
            leader,
            authorization: authorization.filter(|_| serving),
            grpc: grpc.is_some(),
            ..Report::default()
        };
        if let Some((hub, cert)) = grpc {
            report.serving_certificate = std::fs::read_to_string(&cert)
                .ok()
                .and_then(|pem| Certificate::of_pem(&pem));
            for cs in hub.clusters() {
                let Some((mode, agent)) = cs.agent() else {
                    continue;
                };
                let last_seen = cs.last_seen();
                let lag_seconds = cs.lag().0;
                report.agents.push(AgentReport {
                    cluster: cs.name.clone(),
                    mode: mode_name(mode).into(),
                    version: agent.version,
                    connected_since: agent.since,
                    last_seen: last_seen.filter(|s| *s > 0.0),
                    lag_seconds,
                    certificate_not_after: agent.certificate_not_after,
                    certificate_fingerprint: agent.fingerprint,
                });
            }
            report.agents.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        }
        report
    }

    /// `GET /status`.
    pub fn routes(&self) -> Router {
        let page = self.clone();
        Router::new().route(
            PATH,
            get(move || {
                let page = page.clone();
                async move {
                    match serde_json::to_string_pretty(&page.report()) {
                        Ok(body) => (
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, "application/json")],
                            body,
                        )
                            .into_response(),
                        Err(e) => {
                            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
                        }
                    }
                }
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::pki;
    use std::time::SystemTime;

    #[test]
    fn a_certificate_is_due_a_third_before_it_expires() {
        let now = SystemTime::now();
        let lifetime = std::time::Duration::from_secs(90 * 86400);
        let ca = pki::new_ca("test CA", pki::KeyKind::EcdsaP256, now, lifetime).unwrap();
        let c = Certificate::of_pem(&ca.cert_pem).unwrap();
        assert_eq!(c.not_after - c.renew_at, (c.not_after - c.not_before) / 3);
        assert!(Certificate::of_pem("not a certificate").is_none());
    }

    #[test]
    fn a_report_round_trips_as_the_plugin_reads_it() {
        let page = StatusPage::default();
        page.set_serving(true);
        let report = page.report();
        assert!(report.serving && !report.grpc && report.agents.is_empty());
        assert_eq!(report.authorization, None, "not set yet");
        let auth = Authorization {
            require_placement: true,
            allow: vec!["team-a=c1".parse().unwrap()],
            projects: Some("argocd".into()),
        };
        page.set_authorization(&auth);
        let report = page.report();
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(report.authorization.as_ref().unwrap().authorization(), auth);
        assert!(json.contains("\"servingCertificate\":null"), "{json}");
        assert!(json.contains("\"appProjects\":\"argocd\""), "{json}");
        assert_eq!(serde_json::from_str::<Report>(&json).unwrap(), report);
    }
}
