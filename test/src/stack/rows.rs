//! The status table of `make demo` and the end-to-end tests: each
//! pull-model Application's hub copy next to its copy on its cluster.

use argocd_pull_apis::keys;
use kube::api::{Api, DynamicObject};
use serde_json::Value;

use crate::Result;

/// One row per pull-model Application on the hub in `namespace`, with its
/// copy on its cluster (one of `clusters`: name and client).
pub async fn applications(
    hub: &kube::Client,
    clusters: &[(String, kube::Client)],
    namespace: &str,
) -> Result<Vec<AppRow>> {
    let resource = argocd_pull_apis::argocd::application_resource();
    let apps = Api::<DynamicObject>::namespaced_with(hub.clone(), namespace, &resource);
    let mut rows = Vec::new();
    for app in apps.list(&Default::default()).await?.items {
        let labels = app.metadata.labels.clone().unwrap_or_default();
        if !labels
            .get(keys::PULL_LABEL)
            .and_then(|v| keys::parse_bool(v))
            .unwrap_or(false)
        {
            continue;
        }
        let annotations = app.metadata.annotations.clone().unwrap_or_default();
        let name = app.metadata.name.clone().unwrap_or_default();
        let cluster = annotations
            .get(keys::MANAGED_CLUSTER)
            .cloned()
            .unwrap_or_default();
        let spoke_ns = annotations
            .get(keys::MANAGED_CLUSTER_APP_NAMESPACE)
            .cloned()
            .unwrap_or_else(|| namespace.to_string());
        let spoke = match clusters.iter().find(|(n, _)| *n == cluster) {
            Some((_, client)) => {
                Api::<DynamicObject>::namespaced_with(client.clone(), &spoke_ns, &resource)
                    .get_opt(&name)
                    .await?
                    .map(|a| (a.metadata.labels.unwrap_or_default(), a.data))
            }
            None => None,
        };
        let transport = match &spoke {
            Some((labels, _)) if labels.contains_key(keys::HUB_MANAGED) => "grpc",
            Some(_) => "manifestwork",
            None => "-",
        };
        rows.push(AppRow::new(
            &name,
            &cluster,
            transport,
            &app.data,
            spoke.as_ref().map(|(_, d)| d),
        ));
    }
    rows.sort_by(|a, b| (&a.cluster, &a.name).cmp(&(&b.cluster, &b.name)));
    Ok(rows)
}

/// One pull-model Application: its hub copy and its copy on the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppRow {
    pub name: String,
    pub cluster: String,
    /// `grpc`, `manifestwork`, or `-` while not delivered.
    pub transport: String,
    pub hub_sync: String,
    pub hub_health: String,
    pub hub_revision: String,
    pub spoke_sync: String,
    pub spoke_health: String,
}

impl AppRow {
    fn new(name: &str, cluster: &str, transport: &str, hub: &Value, spoke: Option<&Value>) -> Self {
        let field = |v: &Value, path: &[&str]| {
            let mut v = v;
            for p in path {
                v = &v[*p];
            }
            v.as_str().unwrap_or("-").to_string()
        };
        let short = |r: String| r.chars().take(7).collect::<String>();
        Self {
            name: name.to_string(),
            cluster: cluster.to_string(),
            transport: transport.to_string(),
            hub_sync: field(hub, &["status", "sync", "status"]),
            hub_health: field(hub, &["status", "health", "status"]),
            hub_revision: short(field(hub, &["status", "sync", "revision"])),
            spoke_sync: spoke.map_or("-".into(), |s| field(s, &["status", "sync", "status"])),
            spoke_health: spoke.map_or("-".into(), |s| field(s, &["status", "health", "status"])),
        }
    }

    /// Synced and Healthy on the hub copy (so, reported back).
    pub fn converged(&self) -> bool {
        self.hub_sync == "Synced" && self.hub_health == "Healthy"
    }
}

/// The rows as an aligned text table.
pub fn render_table(rows: &[AppRow]) -> String {
    let header = [
        "CLUSTER",
        "APPLICATION",
        "TRANSPORT",
        "SPOKE SYNC",
        "SPOKE HEALTH",
        "HUB SYNC",
        "HUB HEALTH",
        "REVISION",
    ];
    let cells: Vec<[&str; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.cluster.as_str(),
                r.name.as_str(),
                r.transport.as_str(),
                r.spoke_sync.as_str(),
                r.spoke_health.as_str(),
                r.hub_sync.as_str(),
                r.hub_health.as_str(),
                r.hub_revision.as_str(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |row: &[&str; 8]| {
        row.iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(&header);
    for row in &cells {
        out.push('\n');
        out.push_str(&line(row));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_read_both_copies_and_render_aligned() {
        let hub = json!({ "status": {
            "sync": { "status": "Synced", "revision": "0123456789abcdef" },
            "health": { "status": "Healthy" } } });
        let spoke = json!({ "status": { "sync": { "status": "OutOfSync" } } });
        let row = AppRow::new("guestbook-cluster1", "cluster1", "grpc", &hub, Some(&spoke));
        assert!(row.converged());
        assert_eq!(row.hub_revision, "0123456");
        assert_eq!(row.spoke_health, "-");
        let pending = AppRow::new("guestbook-cluster2", "cluster2", "-", &json!({}), None);
        assert!(!pending.converged());
        let table = render_table(&[row, pending]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("CLUSTER   APPLICATION         TRANSPORT"));
        assert!(lines[1].starts_with("cluster1  guestbook-cluster1  grpc"));
        assert!(lines[2].starts_with("cluster2  guestbook-cluster2  -"));
        assert_eq!(lines[1].find("Synced"), lines[0].find("HUB SYNC"));
    }
}
