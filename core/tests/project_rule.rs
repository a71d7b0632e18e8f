//! The hub's AppProject rule (`route::project::check`) answers as Argo CD's
//! own code does, on every case of `fixtures/project_rule.json`.
//!
//! Argo CD's answers come from `$ARGOCD_PULL_CACHE/bin/projectrule`
//! (test/tools/projectrule, built by `make tools` from the pinned Argo CD
//! module), never from this file. For each case it is asked twice:
//!
//! - **on the cluster**: the cluster's Argo CD, with what it gets: the
//!   delivered copy (`render::delivered`), the project as delivered there
//!   (`render::project`), and its clusters (its in-cluster and the case's
//!   `spokeClusters`); the namespace rule with the hub Application's
//!   namespace and the hub's Argo CD namespace, as the hub checks it;
//! - **as written**: Argo CD with the hub's project as written, for the
//!   ManagedCluster itself (a cluster named after it, at the in-cluster
//!   server): what the project means. Asked only where our rule takes the
//!   destination for the cluster itself.
//!
//! Ours must equal both; where both refuse, Argo CD's message must begin
//! ours. The table is printed either way.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use argocd_pull_apis::argocd::{AppProject, Application, ProjectSpec};
use argocd_pull_core::render::delivered::delivered_copy;
use argocd_pull_core::render::project::delivered_project;
use argocd_pull_core::route::project::{IN_CLUSTER_SERVER, Refusal, check};
use argocd_pull_core::route::target::Target;
use serde::Deserialize;
use serde_json::{Value, json};

const CONTROL_PLANE: &str = "argocd";

#[derive(Deserialize)]
struct Fixture {
    projects: BTreeMap<String, Value>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    case: String,
    project: String,
    #[serde(default = "cluster1")]
    cluster: String,
    #[serde(default = "control_plane")]
    namespace: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default = "guestbook")]
    destination_namespace: String,
    #[serde(default = "app_repo")]
    repos: Vec<String>,
    #[serde(default)]
    spoke_clusters: Vec<Value>,
}

fn cluster1() -> String {
    "cluster1".into()
}
fn control_plane() -> String {
    CONTROL_PLANE.into()
}
fn guestbook() -> String {
    "guestbook".into()
}
fn app_repo() -> Vec<String> {
    vec!["https://git.example/app".into()]
}

#[derive(Deserialize)]
struct Answer {
    id: String,
    allowed: bool,
    #[serde(default)]
    message: String,
}

/// The hub Application of `case`. Its own `spec.destination.server` is
/// one the projects do not list: the delivered copy replaces it.
fn hub_application(case: &Case) -> Application {
    let source =
        |url: &String| json!({ "repoURL": url, "path": "guestbook", "targetRevision": "HEAD" });
    let mut spec = json!({
        "project": case.project,
        "destination": { "server": "https://written-on-the-hub", "namespace": case.destination_namespace },
    });
    match case.repos.as_slice() {
        [one] => spec["source"] = source(one),
        many => spec["sources"] = many.iter().map(source).collect(),
    }
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": "app", "namespace": case.namespace, "annotations": case.annotations },
        "spec": spec,
    }))
    .expect("a hub Application")
}

fn project(name: &str, spec: &Value) -> AppProject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": { "name": name, "namespace": CONTROL_PLANE },
        "spec": spec,
    }))
    .expect("an AppProject")
}

/// Argo CD's queries for `case` (see the top of the file): on the
/// cluster, and as written when `as_written`.
fn queries(i: usize, case: &Case, spec: &Value, app: &Application, as_written: bool) -> Vec<Value> {
    let target = Target {
        cluster: case.cluster.clone(),
        app_namespace: CONTROL_PLANE.into(),
    };
    let delivered = delivered_copy(app, &target);
    let on_cluster = delivered_project(&project(&case.project, spec), &case.cluster, CONTROL_PLANE);
    let application =
        |spec: &Value| json!({ "name": "app", "namespace": case.namespace, "spec": spec });
    let mut out = vec![json!({
        "id": format!("{i}/cluster"),
        "project": { "name": case.project, "spec": on_cluster["spec"] },
        "application": application(&delivered["spec"]),
        "controlPlane": CONTROL_PLANE,
        "clusters": case.spoke_clusters,
    })];
    if as_written {
        let mut itself = delivered["spec"].clone();
        itself["destination"] =
            json!({ "name": case.cluster, "namespace": case.destination_namespace });
        out.push(json!({
            "id": format!("{i}/written"),
            "project": { "name": case.project, "spec": spec },
            "application": application(&itself),
            "controlPlane": CONTROL_PLANE,
            "clusters": [{ "name": case.cluster, "server": IN_CLUSTER_SERVER }],
        }));
    }
    out
}

fn oracle() -> PathBuf {
    let cache = std::env::var_os("ARGOCD_PULL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache"));
    let bin = cache.join("bin/projectrule");
    assert!(
        bin.is_file(),
        "{} is missing: this test compares the hub's project rule with Argo CD's own, built by `make tools` \
         (test/tools/build.sh projectrule); set ARGOCD_PULL_CACHE to the cache that holds it",
        bin.display()
    );
    bin
}

fn ask_argo_cd(queries: &[Value]) -> BTreeMap<String, Answer> {
    let mut child = Command::new(oracle())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the oracle");
    let input = serde_json::to_vec(queries).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().expect("the oracle's answers");
    assert!(out.status.success(), "the oracle failed: {}", out.status);
    let answers: Vec<Answer> = serde_json::from_slice(&out.stdout).expect("the oracle's JSON");
    answers.into_iter().map(|a| (a.id.clone(), a)).collect()
}

fn word(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "refused" }
}

/// One row: whether it agrees, and the row.
fn row(
    i: usize,
    case: &Case,
    ours: &Result<(), Refusal>,
    argo: &BTreeMap<String, Answer>,
) -> (bool, String) {
    let cluster = &argo[&format!("{i}/cluster")];
    let written = argo.get(&format!("{i}/written"));
    let ours_allowed = ours.is_ok();
    let mut agrees =
        cluster.allowed == ours_allowed && written.is_none_or(|w| w.allowed == ours_allowed);
    // Argo CD's words begin ours, where ours are Argo CD's.
    if let Err(r) = ours
        && !matches!(r, Refusal::Elsewhere { .. })
        && !cluster.allowed
    {
        agrees &= r.to_string().starts_with(&cluster.message);
    }
    let ours_text = match ours {
        Ok(()) => "allowed".to_string(),
        Err(r) => format!("refused: {r}"),
    };
    let argo_text = |a: &Answer| match a.allowed {
        true => "allowed".to_string(),
        false => format!("refused: {}", a.message),
    };
    let line = format!(
        "{mark} {i:>2} | {case} | {cluster_answer} | {written_answer} | {ours_text}",
        mark = if agrees { " " } else { "X" },
        case = case.case,
        cluster_answer = argo_text(cluster),
        written_answer = written.map_or("-", |w| word(w.allowed)),
    );
    (agrees, line)
}

#[test]
fn the_hubs_project_rule_answers_as_argo_cd_does() {
    let fixture: Fixture =
        serde_json::from_str(include_str!("fixtures/project_rule.json")).unwrap();
    assert!(fixture.cases.len() >= 30);
    let mut asked = Vec::new();
    let mut ours = Vec::new();
    for (i, case) in fixture.cases.iter().enumerate() {
        let spec = &fixture.projects[&case.project];
        let app = hub_application(case);
        let target = Target {
            cluster: case.cluster.clone(),
            app_namespace: CONTROL_PLANE.into(),
        };
        let parsed = ProjectSpec::of(&project(&case.project, spec));
        let answer = check(&app, &target, &case.project, Some(&parsed), CONTROL_PLANE);
        let itself = !matches!(answer, Err(Refusal::Elsewhere { .. }));
        asked.extend(queries(i, case, spec, &app, itself));
        ours.push(answer);
    }
    let argo = ask_argo_cd(&asked);
    let mut disagreements = 0;
    println!(
        "  #  | case | Argo CD on the cluster | Argo CD on the project as written, for the ManagedCluster | ours"
    );
    for (i, case) in fixture.cases.iter().enumerate() {
        let (agrees, line) = row(i, case, &ours[i], &argo);
        disagreements += usize::from(!agrees);
        println!("{line}");
    }
    assert_eq!(
        disagreements, 0,
        "the hub's project rule disagrees with Argo CD's on the rows marked X above"
    );
}
