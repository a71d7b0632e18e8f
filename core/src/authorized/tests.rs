use super::*;
use crate::fixtures::app;
use argocd_pull_apis::argocd::ProjectDestination;
use serde_json::json;

fn target() -> Target {
    Target {
        cluster: "c1".into(),
        app_namespace: "argocd".into(),
    }
}

fn key(name: &str) -> SpokeKey {
    ("argocd".into(), name.into())
}

/// The grant of the fixture Application (`team/guestbook`, uid `u-1`)
/// with `project` and destination namespace `gb`.
fn granted(project: &str, transport: Transport) -> Grant {
    let a = app(json!({ "spec": { "project": project } }));
    grant(&a, &target(), transport, ProjectVersion::default())
}

fn spec(namespaces: &[&str], dest_namespace: &str) -> ProjectSpec {
    ProjectSpec {
        source_namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        destinations: vec![ProjectDestination {
            server: "*".into(),
            name: String::new(),
            namespace: dest_namespace.into(),
        }],
        source_repos: vec!["*".into()],
    }
}

#[test]
fn a_grant_records_what_the_check_saw() {
    let g = granted("bbb", Transport::Grpc);
    assert_eq!(
        (
            g.owner.as_str(),
            g.source_namespace.as_str(),
            g.project.as_str()
        ),
        ("u-1", "team", "bbb")
    );
    assert_eq!(
        g.destination,
        GrantedDestination {
            name: "c1".into(),
            server: Some("https://kubernetes.default.svc".into()),
            namespace: "gb".into(),
        }
    );
    // An empty spec.project is Argo CD's `default`.
    assert_eq!(granted("", Transport::Grpc).project, "default");
}

#[test]
fn a_refused_change_keeps_the_grant_it_was_delivered_with() {
    let bbb = granted("bbb", Transport::Grpc);
    let recorded = ClusterRecord::from([(key("a"), bbb.clone())]);
    // The tenant switched it to project ccc, which refused it: the copy
    // stays, and so does the grant of bbb. Nothing of ccc is recorded.
    let kept = next(
        &recorded,
        [(
            key("a"),
            Now::Kept {
                owners: vec!["u-1".into()],
            },
        )],
    );
    assert_eq!(kept, recorded);
    // A kept key with no grant gets none (a refusal never writes one).
    assert!(
        next(
            &ClusterRecord::new(),
            [(
                key("a"),
                Now::Kept {
                    owners: vec!["u-1".into()]
                }
            )]
        )
        .is_empty()
    );
    // Another hub Application refused on the same key does not inherit it.
    assert!(
        next(
            &recorded,
            [(
                key("a"),
                Now::Kept {
                    owners: vec!["u-other".into()]
                }
            )]
        )
        .is_empty()
    );
}

#[test]
fn an_authorized_delivery_replaces_and_nothing_withdraws() {
    let recorded = ClusterRecord::from([
        (key("a"), granted("bbb", Transport::Grpc)),
        (key("gone"), granted("bbb", Transport::Grpc)),
    ]);
    let ccc = granted("ccc", Transport::Grpc);
    let now = [
        (key("a"), Now::Authorized(ccc.clone())),
        (key("deleted"), Now::Nothing),
    ];
    // "gone" is named by nothing: its grant goes.
    assert_eq!(
        next(&recorded, now),
        ClusterRecord::from([(key("a"), ccc.clone())])
    );
    // An authorized decision wins over a kept one on the same key,
    // whichever comes first.
    let kept = Now::Kept {
        owners: vec!["u-1".into()],
    };
    for order in [
        vec![
            (key("a"), kept.clone()),
            (key("a"), Now::Authorized(ccc.clone())),
        ],
        vec![
            (key("a"), Now::Authorized(ccc.clone())),
            (key("a"), kept.clone()),
        ],
    ] {
        assert_eq!(next(&recorded, order)[&key("a")], ccc);
    }
}

#[test]
fn projects_follow_the_grants_and_credentials_only_standing_ones() {
    let team = |n: &str| {
        let mut g = granted("bbb", Transport::Grpc);
        g.destination.namespace = n.into();
        g
    };
    let by_work = granted("www", Transport::ManifestWork);
    let grants = [team("gb"), team("other"), by_work];
    let lookup = |allowed_dest: &'static str| {
        move |name: &str| match name {
            "bbb" => Some(spec(&["team"], allowed_dest)),
            "www" => Some(spec(&["team"], "*")),
            _ => None,
        }
    };
    // (project's allowed destination namespace) -> what the gRPC side gets
    let cases = [
        ("*", Some(true)),
        ("gb", Some(true)),
        // A project edit that allows neither recorded destination: the
        // project's content still goes (so the cluster's Argo CD refuses
        // the kept copies too), its credentials do not.
        ("nothing-*", Some(false)),
    ];
    for (dest, want) in cases {
        let got = projects(&grants, Transport::Grpc, lookup(dest), Some("argocd"));
        assert_eq!(got.get("bbb").copied(), want, "{dest}");
        assert!(!got.contains_key("www"), "the other transport's");
    }
    // A source namespace no longer listed withdraws the credentials too.
    let moved = |name: &str| (name == "bbb").then(|| spec(&["elsewhere"], "*"));
    assert_eq!(
        projects(&grants, Transport::Grpc, moved, Some("argocd")),
        BTreeMap::from([("bbb".to_string(), false)])
    );
    // A project that is gone: nothing to send.
    assert!(projects(&grants, Transport::Grpc, |_| None, Some("argocd")).is_empty());
    // Projects not enforced: every recorded project carries its credentials.
    assert_eq!(
        projects(&grants, Transport::Grpc, lookup("nothing-*"), None),
        BTreeMap::from([("bbb".to_string(), true)])
    );
}

#[test]
fn the_record_reads_back_as_written_and_bad_entries_are_skipped() {
    let mut g = granted("bbb", Transport::ManifestWork);
    g.checked = ProjectVersion {
        resource_version: "42".into(),
        generation: 3,
    };
    let record = ClusterRecord::from([(key("a"), g.clone()), (("apps".into(), "b.c".into()), g)]);
    let (json, left_out) = encode(&record);
    assert_eq!(left_out, 0);
    assert_eq!(decode(&json), record);
    let bad = r#"{"noslash":{},"argocd/x":{"owner":"u","ns":"t","project":"p","dest":{},"transport":"pigeon"},"argocd/y":3}"#;
    assert!(decode(bad).is_empty());
    assert!(decode("not json").is_empty());
}

#[test]
fn the_record_stops_at_its_bound() {
    let g = granted("bbb", Transport::Grpc);
    let record: ClusterRecord = (0..5000)
        .map(|i| {
            (
                ("argocd".to_string(), format!("{}-{i}", "x".repeat(40))),
                g.clone(),
            )
        })
        .collect();
    let (json, left_out) = encode(&record);
    assert!(json.len() <= MAX_BYTES, "{}", json.len());
    assert!(left_out > 0 && decode(&json).len() + left_out == record.len());
    // What a Lease holds of a cut record encodes as the same text: the
    // writer compares the two and does not write it again.
    assert_eq!(encode(&decode(&json)), (json, 0));
}
