//! What each command shows, from what was read ([`Snapshot`], the hub
//! Applications, the CA Secrets): rows for `-o json`, tables for people,
//! and `explain`'s sentences. Pure: `now` is passed in.

use std::collections::BTreeMap;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_core::report::{AgentReport, Certificate};
use argocd_pull_core::route::decide::Route;
use argocd_pull_core::status::condition::condition_of;
use serde::Serialize;
use serde_json::Value;

use crate::facts::Snapshot;

/// Columns and rows, printed aligned.
pub struct Table {
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

/// `s` safe to print on a terminal: text that came from agents and
/// clusters (a message, a name, a certificate's subject) may carry escape
/// sequences that would move the cursor, rewrite what was printed before
/// or set the window title. Every C0 and C1 control character, DEL and the
/// Unicode bidirectional overrides are shown escaped (`\x1b`, `\u{9b}`,
/// `\u{202e}`); everything else is printed as it is.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\u{0}'..='\u{1f}' | '\u{7f}' => out.push_str(&format!("\\x{:02x}", c as u32)),
            '\u{80}'..='\u{9f}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}' => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

impl Table {
    /// The table as text, every cell [`escape`]d.
    pub fn render(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(|c| escape(c)).collect())
            .collect();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let mut out = String::new();
            for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    out.push_str(cell);
                } else {
                    out.push_str(&format!("{cell:<w$}   "));
                }
            }
            out.trim_end().to_string() + "\n"
        };
        let mut out = line(self.header.clone());
        for row in &rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

/// A duration in seconds as `kubectl` shows ages: `45s`, `3m12s`, `5h2m`, `12d`.
pub fn span(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d", s / 86400),
    }
}

/// When `t` comes, seen from `now`: `in 89d`, or `expired 2h3m ago`.
pub fn until(now: i64, t: i64) -> String {
    if t > now {
        format!("in {}", span(t - now))
    } else {
        format!("{} ago", span(now - t))
    }
}

fn or_dash(s: Option<String>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into())
}

/// One cluster with the addon, and its agent if one is connected.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRow {
    pub cluster: String,
    /// OCM's view: the addon's `Available` condition.
    pub addon_available: Option<bool>,
    /// The replica it is connected to, if any answered for it.
    pub replica: Option<String>,
    pub agent: Option<AgentReport>,
}

/// `status`: every cluster with the addon enabled, and every agent a
/// replica reports (an agent of a cluster without the addon included).
pub fn agent_rows(snapshot: &Snapshot) -> Vec<AgentRow> {
    let mut rows: BTreeMap<String, AgentRow> = snapshot
        .addons
        .iter()
        .map(|(cluster, addon)| {
            let row = AgentRow {
                cluster: cluster.clone(),
                addon_available: addon.available,
                replica: None,
                agent: None,
            };
            (cluster.clone(), row)
        })
        .collect();
    for report in &snapshot.reports {
        for agent in &report.agents {
            let row = rows
                .entry(agent.cluster.clone())
                .or_insert_with(|| AgentRow {
                    cluster: agent.cluster.clone(),
                    addon_available: None,
                    replica: None,
                    agent: None,
                });
            row.replica = Some(report.replica.clone());
            row.agent = Some(agent.clone());
        }
    }
    rows.into_values().collect()
}

pub fn agent_table(rows: &[AgentRow], now: i64) -> Table {
    let yes_no = |b: Option<bool>| match b {
        Some(true) => "True".to_string(),
        Some(false) => "False".to_string(),
        None => "Unknown".to_string(),
    };
    Table {
        header: vec![
            "CLUSTER",
            "ADDON AVAILABLE",
            "REPLICA",
            "MODE",
            "VERSION",
            "CONNECTED",
            "LAST SEEN",
            "LAG",
            "CERTIFICATE EXPIRES",
        ],
        rows: rows
            .iter()
            .map(|r| match &r.agent {
                Some(a) => vec![
                    r.cluster.clone(),
                    yes_no(r.addon_available),
                    or_dash(r.replica.clone()),
                    a.mode.clone(),
                    or_dash(Some(a.version.clone())),
                    format!("{} ago", span(now - a.connected_since)),
                    a.last_seen
                        .map_or("-".into(), |t| format!("{} ago", span(now - t as i64))),
                    format!("{:.1}s", a.lag_seconds),
                    until(now, a.certificate_not_after),
                ],
                None => vec![
                    r.cluster.clone(),
                    yes_no(r.addon_available),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "not connected".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ],
            })
            .collect(),
    }
}

/// The certificate fingerprints `cluster`'s agent is connected with, over
/// the replicas that answered (one, unless two replicas disagree).
pub fn connected_certificates(snapshot: &Snapshot, cluster: &str) -> Vec<String> {
    let mut out: Vec<String> = snapshot
        .reports
        .iter()
        .flat_map(|r| &r.agents)
        .filter(|a| a.cluster == cluster && !a.certificate_fingerprint.is_empty())
        .map(|a| a.certificate_fingerprint.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// One pulled hub Application.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppRow {
    pub namespace: String,
    pub name: String,
    pub cluster: Option<String>,
    /// The transport that delivers it (or reports why it cannot).
    pub transport: Option<String>,
    /// Whether the hub's rule delivers it now.
    pub routed: bool,
    /// The revision the cluster's Argo CD last synced, from the hub copy.
    pub revision: Option<String>,
    pub sync: Option<String>,
    pub health: Option<String>,
    /// argocd-pull's condition on the hub copy (`Reason: message`), if any.
    pub condition: Option<String>,
}

fn status_str(app: &Application, pointer: &str) -> Option<String> {
    app.data
        .get("status")?
        .pointer(pointer)?
        .as_str()
        .map(String::from)
}

pub fn app_row(app: &Application, route: &Route) -> AppRow {
    let status = app.data.get("status").cloned().unwrap_or(Value::Null);
    AppRow {
        namespace: app.metadata.namespace.clone().unwrap_or_default(),
        name: app.metadata.name.clone().unwrap_or_default(),
        cluster: route.target().map(|t| t.cluster.clone()).or_else(|| {
            app.metadata
                .annotations
                .as_ref()?
                .get(keys::MANAGED_CLUSTER)
                .cloned()
        }),
        transport: route.transport().map(|t| t.name().to_string()),
        routed: matches!(route, Route::Deliver { .. }),
        revision: status_str(app, "/sync/revision"),
        sync: status_str(app, "/sync/status"),
        health: status_str(app, "/health/status"),
        condition: condition_of(&status).map(String::from),
    }
}

pub fn app_table(rows: &[AppRow]) -> Table {
    Table {
        header: vec![
            "NAMESPACE",
            "NAME",
            "CLUSTER",
            "TRANSPORT",
            "REVISION",
            "SYNC",
            "HEALTH",
            "CONDITION",
        ],
        rows: rows
            .iter()
            .map(|r| {
                vec![
                    r.namespace.clone(),
                    r.name.clone(),
                    or_dash(r.cluster.clone()),
                    or_dash(r.transport.clone()),
                    or_dash(r.revision.as_ref().map(|s| s.chars().take(12).collect())),
                    or_dash(r.sync.clone()),
                    or_dash(r.health.clone()),
                    // The reason is enough in a table; `explain` has the rest.
                    or_dash(
                        r.condition
                            .as_ref()
                            .map(|c| c.split(':').next().unwrap_or(c).to_string()),
                    ),
                ]
            })
            .collect(),
    }
}

/// One certificate `certs` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertRow {
    pub name: String,
    /// Where it was read.
    pub source: String,
    pub certificate: Option<Certificate>,
}

pub fn cert_table(rows: &[CertRow], now: i64) -> Table {
    Table {
        header: vec!["CERTIFICATE", "SOURCE", "EXPIRES", "NEXT ROTATION"],
        rows: rows
            .iter()
            .map(|r| match &r.certificate {
                Some(c) => vec![
                    r.name.clone(),
                    r.source.clone(),
                    until(now, c.not_after),
                    if c.renew_at > now {
                        until(now, c.renew_at)
                    } else {
                        "due now".into()
                    },
                ],
                None => vec![
                    r.name.clone(),
                    r.source.clone(),
                    "missing or unreadable".into(),
                    "-".into(),
                ],
            })
            .collect(),
    }
}

mod explain;
pub use explain::explain;

#[cfg(test)]
mod tests;
