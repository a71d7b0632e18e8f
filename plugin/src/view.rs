//! What each command shows, from what was read ([`Snapshot`], the hub
//! Applications, the CA Secrets): rows for `-o json`, tables for people,
//! and `explain`'s sentences. Pure: `now` is passed in.

use std::collections::BTreeMap;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_core::render::work::work_name;
use argocd_pull_core::report::{AgentReport, Certificate};
use argocd_pull_core::route::decide::Route;
use argocd_pull_core::route::transport::Transport;
use argocd_pull_core::status::condition::condition_of;
use serde::Serialize;
use serde_json::Value;

use crate::facts::{Snapshot, Work};

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

/// `explain`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub application: String,
    /// Whether the hub's rule delivers it and nothing reported stops it.
    pub delivered: bool,
    /// Why, step by step, in words.
    pub reasons: Vec<String>,
}

/// Why `app` is or is not delivered, given its `route` (decided with the
/// hub's rule on `snapshot`), its ManifestWork if that transport carries
/// it, and whether the authorization is the hub's own (`false`: no serving
/// replica answered, the default was assumed).
pub fn explain(
    app: &Application,
    route: &Route,
    snapshot: &Snapshot,
    work: Option<&Work>,
    authorization_known: bool,
) -> Explanation {
    let ns = app.metadata.namespace.clone().unwrap_or_default();
    let name = app.metadata.name.clone().unwrap_or_default();
    let mut reasons = Vec::new();
    let mut delivered = false;
    if !authorization_known {
        reasons.push(
            "no serving hub-controller replica could be read: the default authorization \
             (a Placement in the Application's namespace must select the cluster) and the \
             gRPC transport's absence are assumed"
                .to_string(),
        );
    }
    if app.metadata.deletion_timestamp.is_some() {
        reasons.push(
            "it is being deleted: argocd-pull removes it from the cluster, then lets the hub copy go"
                .into(),
        );
    }
    match route {
        Route::NotPulled => reasons.push(not_pulled(app)),
        Route::Refused {
            reason, message, ..
        } => reasons.push(format!("it cannot be delivered: {reason}: {message}")),
        Route::Deliver { transport, target } => {
            reasons.push(format!(
                "it goes to cluster {:?} as Application {}/{name} there, by the {} transport; \
                 namespace {ns:?} may deploy there",
                target.cluster,
                target.app_namespace,
                transport.name()
            ));
            let (reached, reason) = match transport {
                Transport::ManifestWork => {
                    let work_ref = format!("{}/{}", target.cluster, work_name(&ns, &name));
                    work_applied(&work_ref, work, snapshot, &target.cluster)
                }
                Transport::Grpc => agent_connected(snapshot, &target.cluster),
            };
            delivered = reached;
            reasons.push(reason);
        }
    }
    if let Some(reason) = reported_condition(app, route) {
        delivered = false;
        reasons.push(reason);
    }
    if !matches!(route, Route::NotPulled) {
        reasons.push(cluster_status(app));
    }
    Explanation {
        application: format!("{ns}/{name}"),
        delivered,
        reasons,
    }
}

/// Why an Application the hub's rule does not pull is not delivered: a
/// mirror of an autonomous cluster's Application, or one not labelled.
fn not_pulled(app: &Application) -> String {
    let mirror_of = app
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(keys::MIRROR_OF));
    match mirror_of {
        Some(cluster) => format!(
            "it is a read-only mirror of an Application an autonomous agent manages on cluster {cluster:?}: \
             change it on that cluster, not here"
        ),
        None => format!(
            "it is not labelled for the pull model: add label {}=true (and annotation {}=<cluster>)",
            keys::PULL_LABEL,
            keys::MANAGED_CLUSTER
        ),
    }
}

/// Whether the ManifestWork `work_ref` carrying the Application to
/// `cluster` is applied there, and why in words: delivered only once the
/// cluster's work agent has applied it.
fn work_applied(
    work_ref: &str,
    work: Option<&Work>,
    snapshot: &Snapshot,
    cluster: &str,
) -> (bool, String) {
    match work {
        None => (
            false,
            format!(
                "ManifestWork {work_ref} does not exist yet: the hub-controller has not \
                 written it (is it running and the Lease holder?)"
            ),
        ),
        Some(Work {
            applied: Some(true),
            ..
        }) => (
            true,
            format!("ManifestWork {work_ref} is applied by the cluster's work agent"),
        ),
        Some(w) => {
            let available = snapshot.clusters.get(cluster).copied().flatten();
            (
                false,
                format!(
                    "ManifestWork {work_ref} is not applied yet{}; the cluster's work agent \
                     applies it (ManagedCluster Available: {})",
                    if w.message.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", w.message)
                    },
                    available.map_or("Unknown".into(), |a| a.to_string())
                ),
            )
        }
    }
}

/// Whether an agent in managed mode on `cluster` is connected to a replica
/// that answered, and why in words: the gRPC transport delivers only to
/// such an agent.
fn agent_connected(snapshot: &Snapshot, cluster: &str) -> (bool, String) {
    let agent = snapshot.reports.iter().find_map(|r| {
        r.agents
            .iter()
            .find(|a| a.cluster == cluster)
            .map(|a| (r.replica.as_str(), a))
    });
    match agent {
        Some((replica, a)) if a.mode == "autonomous" => (
            false,
            format!(
                "the cluster's agent (on replica {replica}) runs in autonomous mode: the \
                 hub delivers nothing there; set the addon's AGENT_MODE to managed, or \
                 manage the Application on the cluster"
            ),
        ),
        Some((replica, a)) => (
            true,
            format!(
                "the cluster's agent is connected to replica {replica} (managed mode, version {})",
                if a.version.is_empty() {
                    "unknown"
                } else {
                    &a.version
                }
            ),
        ),
        None => {
            let addon = snapshot.addons.get(cluster);
            (
                false,
                format!(
                    "waiting for the cluster's agent: no replica that answered has it connected \
                     (OCM addon Available: {}); it is delivered when the agent connects",
                    addon
                        .and_then(|a| a.available)
                        .map_or("Unknown".into(), |a| a.to_string())
                ),
            )
        }
    }
}

/// The condition argocd-pull set on the Application, which stops its
/// delivery, unless it is the refusal the route explains already.
fn reported_condition(app: &Application, route: &Route) -> Option<String> {
    let status = app.data.get("status").cloned().unwrap_or(Value::Null);
    let condition = condition_of(&status)?;
    let same = matches!(route, Route::Refused { message, reason, .. }
        if condition == format!("{reason}: {message}"));
    (!same).then(|| format!("the hub reports on the Application: {condition}"))
}

/// The sync and health the cluster last reported, in words.
fn cluster_status(app: &Application) -> String {
    match (
        status_str(app, "/sync/status"),
        status_str(app, "/health/status"),
    ) {
        (None, None) => "no status from the cluster yet".into(),
        (sync, health) => format!(
            "on the cluster: sync {}, health {}{}",
            or_dash(sync),
            or_dash(health),
            status_str(app, "/sync/revision")
                .map(|r| format!(", revision {r}"))
                .unwrap_or_default()
        ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Addon;
    use argocd_pull_core::report::Report;
    use argocd_pull_core::route::authz::Authorization;
    use argocd_pull_core::route::decide::{Facts, decide};
    use serde_json::json;

    fn app(value: Value) -> Application {
        serde_json::from_value(value).unwrap()
    }

    fn pulled(cluster: &str) -> Application {
        app(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {
                "name": "guestbook", "namespace": "team-a",
                "labels": { keys::PULL_LABEL: "true" },
                "annotations": { keys::MANAGED_CLUSTER: cluster },
            },
            "spec": {},
        }))
    }

    fn world() -> Snapshot {
        let mut s = Snapshot::default();
        s.clusters.insert("c1".into(), Some(true));
        s.addons.insert(
            "c1".into(),
            Addon {
                available: Some(true),
            },
        );
        s.decided
            .insert("team-a".into(), ["c1".to_string()].into_iter().collect());
        // The hub enforces AppProjects: an open `default`, as the harness has.
        s.projects.insert(
            "default".into(),
            argocd_pull_apis::argocd::ProjectSpec {
                source_namespaces: vec!["*".into()],
                destinations: vec![argocd_pull_apis::argocd::ProjectDestination {
                    server: "*".into(),
                    name: "*".into(),
                    namespace: "*".into(),
                }],
                source_repos: vec!["*".into()],
            },
        );
        s.reports.push(Report {
            replica: "hub-0".into(),
            serving: true,
            grpc: true,
            agents: vec![AgentReport {
                cluster: "c1".into(),
                mode: "managed".into(),
                version: "0.1.0".into(),
                ..AgentReport::default()
            }],
            ..Report::default()
        });
        s
    }

    fn route(a: &Application, s: &Snapshot) -> Route {
        decide(
            a,
            &Facts {
                grpc_served: s.grpc_served(),
                authorization: &Authorization::default(),
                world: s,
            },
        )
    }

    #[test]
    fn spans_read_like_kubectl_ages() {
        assert_eq!(span(45), "45s");
        assert_eq!(span(192), "3m12s");
        assert_eq!(span(5 * 3600 + 120), "5h2m");
        assert_eq!(span(12 * 86400 + 5), "12d");
        assert_eq!(until(100, 100 + 89 * 86400), "in 89d");
        assert_eq!(until(100 + 7380, 100), "2h3m ago");
    }

    #[test]
    fn tables_align_their_columns() {
        let t = Table {
            header: vec!["A", "LONG HEADER", "C"],
            rows: vec![vec!["wide cell".into(), "x".into(), "last".into()]],
        };
        assert_eq!(
            t.render(),
            "A           LONG HEADER   C\nwide cell   x             last\n"
        );
    }

    #[test]
    fn text_from_agents_and_clusters_is_printed_with_controls_escaped() {
        // An agent's message that would clear the screen, retitle the
        // window, return the cursor and overprint, and hide text with a
        // C1 CSI and a right-to-left override.
        let hostile = "ok\x1b[2J\x1b]0;pwned\x07\rdone\x00\x7f\u{9b}31m\u{202e}txt\ttab\nline";
        let escaped = escape(hostile);
        assert_eq!(
            escaped,
            "ok\\x1b[2J\\x1b]0;pwned\\x07\\x0ddone\\x00\\x7f\\u{9b}31m\\u{202e}txt\\x09tab\\x0aline"
        );
        assert!(
            !escaped
                .chars()
                .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "{escaped:?}"
        );
        // Plain text, accents and CJK pass as they are.
        assert_eq!(escape("café 集群 a-b/c_d"), "café 集群 a-b/c_d");
        // Every cell of a table, and the columns still line up.
        let t = Table {
            header: vec!["A", "B"],
            rows: vec![
                vec![hostile.into(), "x".into()],
                vec!["short".into(), "y".into()],
            ],
        };
        let text = t.render();
        assert!(!text.contains('\x1b') && !text.contains('\r'), "{text:?}");
        assert_eq!(text.lines().count(), 3, "{text:?}");
        let lines: Vec<&str> = text.lines().collect();
        let last_column = |l: &str| l.chars().count() - 1;
        assert_eq!(last_column(lines[1]), last_column(lines[2]), "{text}");
    }

    #[test]
    fn status_lists_addon_clusters_and_connected_agents() {
        let mut s = world();
        s.addons.insert(
            "c2".into(),
            Addon {
                available: Some(false),
            },
        );
        let rows = agent_rows(&s);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].replica.as_deref(), Some("hub-0"));
        assert!(rows[1].agent.is_none());
        let text = agent_table(&rows, 1000).render();
        assert!(text.contains("not connected"), "{text}");
        assert!(text.lines().nth(1).unwrap().contains("managed"), "{text}");
    }

    #[test]
    fn revoke_denies_the_certificates_the_cluster_is_connected_with() {
        let mut s = world();
        s.reports[0].agents[0].certificate_fingerprint = "ab".repeat(32);
        assert_eq!(connected_certificates(&s, "c1"), ["ab".repeat(32)]);
        assert!(connected_certificates(&s, "c2").is_empty());
        s.reports.push(s.reports[0].clone());
        assert_eq!(connected_certificates(&s, "c1").len(), 1, "deduplicated");
    }

    #[test]
    fn explain_says_each_reason_in_words() {
        let s = world();
        let explained = |a: &Application, work: Option<&Work>| {
            let r = route(a, &s);
            explain(a, &r, &s, work, true)
        };
        let e = explained(&pulled("c1"), None);
        assert!(e.delivered, "{e:?}");
        assert!(e.reasons[0].contains("by the grpc transport"), "{e:?}");
        assert!(e.reasons[1].contains("connected to replica hub-0"), "{e:?}");
        assert_eq!(e.reasons[2], "no status from the cluster yet");

        let mut unlabelled = pulled("c1");
        unlabelled.metadata.labels = None;
        let e = explained(&unlabelled, None);
        assert!(
            !e.delivered && e.reasons[0].contains("not labelled"),
            "{e:?}"
        );

        let e = explained(&pulled("nowhere"), None);
        assert!(!e.delivered, "{e:?}");
        assert!(e.reasons[0].contains("UnknownCluster"), "{e:?}");

        let mut other_team = pulled("c1");
        other_team.metadata.namespace = Some("team-b".into());
        let e = explained(&other_team, None);
        assert!(e.reasons[0].contains("NotAuthorized"), "{e:?}");

        let mut by_work = pulled("c1");
        by_work
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(keys::TRANSPORT.into(), "manifestwork".into());
        let e = explained(&by_work, None);
        assert!(
            !e.delivered && e.reasons[1].contains("does not exist yet"),
            "{e:?}"
        );
        let applied = Work {
            applied: Some(true),
            message: String::new(),
        };
        let e = explained(&by_work, Some(&applied));
        assert!(
            e.delivered && e.reasons[1].contains("c1/team-a.guestbook is applied"),
            "{e:?}"
        );

        let mut conflicting = pulled("c1");
        conflicting.data["status"] = json!({
            "conditions": [{ "type": "PullDeliveryError", "message": "SpokeConflict: team-b/guestbook holds it" }],
            "sync": { "status": "Synced", "revision": "abc" }, "health": { "status": "Healthy" },
        });
        let e = explained(&conflicting, None);
        assert!(!e.delivered, "{e:?}");
        assert!(
            e.reasons.iter().any(|r| r.contains("SpokeConflict")),
            "{e:?}"
        );
        assert!(
            e.reasons
                .last()
                .unwrap()
                .contains("sync Synced, health Healthy, revision abc")
        );

        let mut waiting = world();
        waiting.reports[0].agents.clear();
        let r = route(&pulled("c1"), &waiting);
        let e = explain(&pulled("c1"), &r, &waiting, None, false);
        assert!(!e.delivered, "{e:?}");
        assert!(e.reasons[0].contains("default authorization"), "{e:?}");
        assert!(
            e.reasons[2].contains("waiting for the cluster's agent"),
            "{e:?}"
        );
    }

    #[test]
    fn certificates_show_expiry_and_next_rotation() {
        let rows = [
            CertRow {
                name: "signing CA".into(),
                source: "Secret argocd-pull/argocd-pull-signing-ca".into(),
                certificate: Some(Certificate {
                    not_before: 0,
                    not_after: 300 * 86400,
                    renew_at: 200 * 86400,
                }),
            },
            CertRow {
                name: "serving".into(),
                source: "replica hub-0".into(),
                certificate: None,
            },
        ];
        let text = cert_table(&rows, 100 * 86400).render();
        let first = text.lines().nth(1).unwrap();
        assert!(
            first.contains("in 200d") && first.ends_with("in 100d"),
            "{text}"
        );
        assert!(text.contains("missing or unreadable"), "{text}");
    }
}
