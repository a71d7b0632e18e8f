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

/// A project allowing namespace `team` and any destination, with
/// `spec.sourceRepos` `repos`.
fn repos(repos: &[&str]) -> ProjectSpec {
    ProjectSpec {
        source_repos: repos.iter().map(|s| s.to_string()).collect(),
        ..spec(&["team"], "*")
    }
}

#[test]
fn a_grant_records_every_source_of_the_delivered_copy() {
    let a = |spec: serde_json::Value| {
        let a = app(json!({ "spec": spec }));
        grant(&a, &target(), Transport::Grpc, ProjectVersion::default()).sources
    };
    let one = json!({ "source": { "repoURL": "https://git.example/a.git" } });
    let several = json!({ "sources": [
        { "repoURL": "https://git.example/a.git" },
        { "repoURL": "git@git.example:b/values.git", "ref": "values" },
    ] });
    let hydrated = json!({
        "source": { "repoURL": "https://git.example/ignored.git" },
        "sourceHydrator": { "drySource": { "repoURL": "https://git.example/dry.git" } },
    });
    assert_eq!(a(one), Some(vec!["https://git.example/a.git".to_string()]));
    assert_eq!(
        a(several),
        Some(vec![
            "https://git.example/a.git".to_string(),
            "git@git.example:b/values.git".to_string()
        ])
    );
    assert_eq!(
        a(hydrated),
        Some(vec!["https://git.example/dry.git".to_string()])
    );
}

#[test]
fn a_project_edit_that_no_longer_allows_a_recorded_source_withdraws_the_credentials() {
    let with = |sources: &[&str]| Grant {
        sources: Some(sources.iter().map(|s| s.to_string()).collect()),
        ..granted("bbb", Transport::Grpc)
    };
    let a = "https://git.example/team/a.git";
    let b = "https://git.example/team/b.git";
    // (recorded sources, the project's sourceRepos now, stands)
    let cases: &[(&[&str], &[&str], bool)] = &[
        (&[a], &["*"], true),
        (&[a], &[a], true),
        // Argo CD compares normalized URLs: case and `.git` do not matter.
        (&[a], &["HTTPS://git.example/team/a"], true),
        (&[a], &["https://git.example/team/*"], true),
        (&[a], &[], false),
        // The repository removed from sourceRepos.
        (&[a], &[b], false),
        // A `!` entry denying it, whatever else allows.
        (&[a], &["*", "!https://git.example/team/a.git"], false),
        (&[a], &["!https://git.example/team/b.git"], true),
        // A multi-source Application: every source must still be allowed.
        (&[a, b], &[a, b], true),
        (&[a, b], &[a], false),
        (
            &[a, b],
            &["https://git.example/team/*", "!https://git.example/team/b"],
            false,
        ),
        // SCP-like SSH, as Argo CD normalizes it.
        (
            &["git@git.example:team/a.git"],
            &["git@git.example:team/*"],
            true,
        ),
        (
            &["git@git.example:team/a.git"],
            &["git@git.example:other/*"],
            false,
        ),
    ];
    for (sources, source_repos, want) in cases {
        assert_eq!(
            stands(&with(sources), &repos(source_repos), Some("argocd")),
            *want,
            "{sources:?} under {source_repos:?}"
        );
    }
    // Projects not enforced: it stands whatever the project says.
    assert!(stands(&with(&[a]), &repos(&[]), None));
    // What a cluster gets: the project, without its credentials.
    let grants = [with(&[a])];
    assert_eq!(
        projects(
            &grants,
            Transport::Grpc,
            |_| Some(repos(&[b])),
            Some("argocd")
        ),
        BTreeMap::from([("bbb".to_string(), false)])
    );
}

#[test]
fn a_grant_stored_before_sources_were_recorded_reads_back_and_stands_no_more() {
    // As an earlier release wrote it: no `src`.
    let stored = r#"{"argocd/a":{"owner":"u-1","ns":"team","project":"bbb","dest":{"name":"c1","namespace":"gb"},"transport":"grpc","checked":{"rv":"4","gen":1}}}"#;
    let record = decode(stored);
    let g = &record[&key("a")];
    assert_eq!(g.sources, None);
    // Unknown sources are not taken as allowed: the project goes, its
    // credentials wait for the copy's next authorized delivery.
    assert!(!stands(g, &repos(&["*"]), Some("argocd")));
    assert!(stands(g, &repos(&["*"]), None));
    // A grant with its sources recorded writes them.
    let (json, _) = encode(&ClusterRecord::from([(
        key("a"),
        granted("bbb", Transport::Grpc),
    )]));
    assert!(json.contains(r#""src":[""#), "{json}");
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
