use super::*;
use crate::facts::{Addon, Work};
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
