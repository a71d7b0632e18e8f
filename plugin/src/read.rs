//! Everything the plugin reads: the hub API (Applications, OCM's clusters,
//! addons, PlacementDecisions and ManifestWorks, the CA Secrets) and each
//! hub-controller replica's report (`/status` on its admin port, through
//! the API server's pod proxy, or at the `--admin` URLs given).

use anyhow::Context as _;
use argocd_pull_apis::argocd::{
    Application, ProjectSpec, application_resource, appproject_resource,
};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{
    ManagedCluster, ManagedClusterAddOn, ManifestWork, decided_clusters,
    placement_decision_resource, placement_of,
};
use argocd_pull_core::report::{self, Certificate, Report};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::facts::{Addon, Snapshot, Work};
use crate::view::CertRow;

/// The hub-controller's pods carry this label (deploy/hub, the chart).
pub const POD_SELECTOR: &str = "app.kubernetes.io/name=argocd-pull-hub-controller";

pub struct Hub {
    pub client: kube::Client,
    /// Namespace of the hub-controller (and of the CA Secrets).
    pub namespace: String,
    /// Admin URLs to read reports from instead of the pod proxy.
    pub admin: Vec<String>,
}

/// A condition of an object in JSON: whether its status is `True`, and its
/// message.
fn condition(object: &Value, type_: &str) -> Option<(bool, String)> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        .map(|c| {
            (
                c.get("status").and_then(Value::as_str) == Some("True"),
                c.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            )
        })
}

impl Hub {
    /// Everything `status` and `explain` need, read once.
    pub async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let mut s = Snapshot::default();
        let clusters: Api<ManagedCluster> = Api::all(self.client.clone());
        for c in clusters
            .list(&ListParams::default())
            .await
            .context("cannot list ManagedClusters (is this the OCM hub?)")?
        {
            let json = serde_json::to_value(&c)?;
            let available = condition(&json, "ManagedClusterConditionAvailable").map(|c| c.0);
            s.clusters
                .insert(c.metadata.name.unwrap_or_default(), available);
        }
        let addons: Api<ManagedClusterAddOn> = Api::all(self.client.clone());
        for a in addons.list(&ListParams::default()).await? {
            if a.metadata.name.as_deref() != Some(keys::ADDON_NAME) {
                continue;
            }
            let json = serde_json::to_value(&a)?;
            s.addons.insert(
                a.metadata.namespace.unwrap_or_default(),
                Addon {
                    available: condition(&json, "Available").map(|c| c.0),
                },
            );
        }
        let decisions: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &placement_decision_resource());
        for d in decisions.list(&ListParams::default()).await? {
            if placement_of(&d).is_none() {
                continue;
            }
            s.decided
                .entry(d.metadata.namespace.clone().unwrap_or_default())
                .or_default()
                .extend(decided_clusters(&d));
        }
        let (reports, unreachable) = self.reports().await;
        s.reports = reports;
        s.unreachable = unreachable;
        if let Some(ns) = s.authorization().and_then(|a| a.projects) {
            // The hub checks AppProjects: `explain` checks them the same way.
            let projects: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &ns, &appproject_resource());
            match projects.list(&ListParams::default()).await {
                Ok(list) => {
                    for p in list {
                        s.projects.insert(
                            p.metadata.name.clone().unwrap_or_default(),
                            ProjectSpec::of(&p),
                        );
                    }
                }
                Err(e) => s.unreachable.push((
                    format!("appprojects in {ns}"),
                    format!("cannot list AppProjects, so projects show as missing: {e}"),
                )),
            }
        }
        Ok(s)
    }

    /// Every replica's report; the ones that could not be read, with why.
    pub async fn reports(&self) -> (Vec<Report>, Vec<(String, String)>) {
        let mut reports = Vec::new();
        let mut failed = Vec::new();
        if !self.admin.is_empty() {
            for url in &self.admin {
                match http_get(url, report::PATH).await.and_then(|body| {
                    serde_json::from_str::<Report>(&body).map_err(anyhow::Error::from)
                }) {
                    Ok(r) => reports.push(r),
                    Err(e) => failed.push((url.clone(), format!("{e:#}"))),
                }
            }
            return (reports, failed);
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = match pods.list(&ListParams::default().labels(POD_SELECTOR)).await {
            Ok(l) => l,
            Err(e) => {
                failed.push((
                    format!("pods in {}", self.namespace),
                    format!("cannot list the hub-controller's pods: {e}"),
                ));
                return (reports, failed);
            }
        };
        for pod in list {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let port = pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some("admin"))
                .map_or(8080, |p| p.container_port);
            let path = format!(
                "/api/v1/namespaces/{}/pods/{name}:{port}/proxy{}",
                self.namespace,
                report::PATH
            );
            let request = http_request(&path);
            match self.client.request_text(request).await.map_err(|e| {
                anyhow::anyhow!(
                    "through the API server's pod proxy ({e}); it needs `get` on pods/proxy in {ns}, and the API server must reach the pod: else run `kubectl -n {ns} port-forward pod/{name} {port}` and pass --admin http://127.0.0.1:{port}",
                    ns = self.namespace
                )
            }).and_then(|body| serde_json::from_str::<Report>(&body).map_err(anyhow::Error::from)) {
                Ok(r) => reports.push(r),
                Err(e) => failed.push((name, format!("{e:#}"))),
            }
        }
        (reports, failed)
    }

    /// The pull-model Applications (those with the pull label, whatever its
    /// value) in `namespace`, or in every namespace.
    pub async fn applications(&self, namespace: Option<&str>) -> anyhow::Result<Vec<Application>> {
        let api: Api<Application> = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &application_resource()),
            None => Api::all_with(self.client.clone(), &application_resource()),
        };
        let mut apps = api
            .list(&ListParams::default().labels(keys::PULL_LABEL))
            .await
            .context("cannot list Argo CD Applications on the hub")?
            .items;
        apps.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        Ok(apps)
    }

    pub async fn application(&self, ns: &str, name: &str) -> anyhow::Result<Option<Application>> {
        let api: Api<Application> =
            Api::namespaced_with(self.client.clone(), ns, &application_resource());
        Ok(api.get_opt(name).await?)
    }

    pub async fn work(&self, cluster: &str, name: &str) -> anyhow::Result<Option<Work>> {
        let api: Api<ManifestWork> = Api::namespaced(self.client.clone(), cluster);
        let Some(work) = api.get_opt(name).await? else {
            return Ok(None);
        };
        let json = serde_json::to_value(&work)?;
        let applied = condition(&json, "Applied");
        Ok(Some(Work {
            applied: applied.as_ref().map(|c| c.0),
            message: applied.map(|c| c.1).unwrap_or_default(),
        }))
    }

    /// Adds `fingerprints` to the deny list ConfigMap `name` (created if
    /// missing), each with `note`.
    pub async fn deny(
        &self,
        name: &str,
        fingerprints: &[String],
        note: &str,
    ) -> anyhow::Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let data: std::collections::BTreeMap<String, String> = fingerprints
            .iter()
            .map(|f| (f.clone(), note.to_string()))
            .collect();
        let context = || {
            format!(
                "cannot write the deny list ConfigMap {}/{name}",
                self.namespace
            )
        };
        if api.get_opt(name).await.with_context(context)?.is_none() {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm)
                .await
                .with_context(context)?;
        } else {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "data": data })),
            )
            .await
            .with_context(context)?;
        }
        Ok(())
    }

    /// The CAs from their Secrets (the signing CA's bundle too: the previous
    /// CA stays trusted until it expires) and each replica's serving
    /// certificate.
    pub async fn certificates(&self, reports: &[Report]) -> Vec<CertRow> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut rows = Vec::new();
        let cas = [
            (
                "agents' signing CA",
                argocd_pull_addon::SIGNING_CA_SECRET,
                "tls.crt",
            ),
            (
                "serving CA",
                argocd_pull_apis::keys::SERVING_CA_SECRET,
                "tls.crt",
            ),
        ];
        for (what, name, key) in cas {
            let source = format!("Secret {}/{name}", self.namespace);
            let secret = secrets.get_opt(name).await.ok().flatten();
            let text = |key: &str| {
                secret
                    .as_ref()
                    .and_then(|s| s.data.as_ref()?.get(key))
                    .map(|b| String::from_utf8_lossy(&b.0).to_string())
            };
            rows.push(CertRow {
                name: what.into(),
                source: source.clone(),
                certificate: text(key).and_then(|pem| Certificate::of_pem(&pem)),
            });
            // Older CAs still trusted, after the current one.
            if let Some(bundle) = text("ca-bundle.crt") {
                for (i, pem) in split_pem(&bundle).into_iter().enumerate().skip(1) {
                    rows.push(CertRow {
                        name: format!("{what} (previous, still trusted) #{i}"),
                        source: format!("{source} ca-bundle.crt"),
                        certificate: Certificate::of_pem(&pem),
                    });
                }
            }
        }
        for r in reports.iter().filter(|r| r.grpc) {
            rows.push(CertRow {
                name: "gRPC serving certificate".into(),
                source: format!("replica {}", r.replica),
                certificate: r.serving_certificate.clone(),
            });
        }
        rows
    }
}

/// The PEM blocks of a bundle, each with its armour.
fn split_pem(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .filter(|b| b.contains("BEGIN CERTIFICATE"))
        .map(|b| b.trim().to_string())
        .collect()
}

fn http_request(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path)
        .body(Vec::new())
        .expect("a GET with a path is a valid request")
}

/// `GET <base><path>` over plain HTTP (an admin port, or a
/// `kubectl port-forward` of one); the body of a 200.
async fn http_get(base: &str, path: &str) -> anyhow::Result<String> {
    let authority = base
        .strip_prefix("http://")
        .ok_or_else(|| {
            anyhow::anyhow!("--admin {base:?}: give an http:// URL such as http://127.0.0.1:8080")
        })?
        .trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(authority)
        .await
        .with_context(|| format!("cannot connect to {authority}"))?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("{base}{path}: not an HTTP response"))?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        anyhow::bail!("{base}{path} answered {status}: {}", body.trim());
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_are_read_from_any_kind() {
        let object = json!({ "status": { "conditions": [
            { "type": "Applied", "status": "True", "message": "applied" },
            { "type": "Available", "status": "False" },
        ] } });
        assert_eq!(
            condition(&object, "Applied"),
            Some((true, "applied".into()))
        );
        assert_eq!(
            condition(&object, "Available"),
            Some((false, String::new()))
        );
        assert_eq!(condition(&object, "Degraded"), None);
        assert_eq!(condition(&json!({}), "Applied"), None);
    }

    #[test]
    fn a_bundle_splits_into_its_certificates() {
        let one = "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----";
        let two = "-----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----";
        assert_eq!(split_pem(&format!("{one}\n{two}\n")), [one, two]);
        assert!(split_pem("").is_empty());
    }
}
