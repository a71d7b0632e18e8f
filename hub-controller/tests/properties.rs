//! Property tests of the hub's pure transforms, seeded like the wire
//! contract's (`proto/tests/properties.rs`, whose generator this shares):
//! every run makes the same cases; `PROPERTY_SEED=<u64>` explores others.
//!
//! What they hold, for arbitrary Applications the API server could hold
//! (valid names, any labels, annotations and spec, the routing annotations
//! with any value): routing never panics; what it delivers is rendered into
//! a delivered copy, a ManifestWork and a gRPC copy the API server would
//! accept (names, namespaces, label and annotation keys and values), with
//! a work name of at most 188 characters and no routing metadata in the
//! copy; an autonomous spoke's Application becomes an inert mirror; the
//! status merge never panics and yields an object; a status patch turns
//! what a hub copy shows into what it should, and is sent only when they
//! differ; the status written for a gRPC report carries exactly
//! argocd-pull's condition, whatever the spoke's status holds; a sync's
//! stamp settles in one write, whatever `.operation` holds, and the work
//! carries the hub's operation as it is.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_hub_controller::render::operation::carried_operation;
use argocd_pull_hub_controller::render::{delivered_copy, work};
use argocd_pull_hub_controller::route::authz::Authorization;
use argocd_pull_hub_controller::route::decide::{Facts, Route, World, decide};
use argocd_pull_hub_controller::status::condition::condition_of;
use argocd_pull_hub_controller::status::feedback::{Feedback, status_update};
use argocd_pull_hub_controller::status::observed::hub_status;
use argocd_pull_hub_controller::status::patch::status_patch;
use argocd_pull_hub_controller::transport::grpc::commands::{
    self, Command, InFlight, OPERATION_ID_INFO, completion_patch,
};
use argocd_pull_hub_controller::transport::grpc::render as grpc;
use argocd_pull_proto::v1::ObjectKey;
use serde_json::{Map, Value, json};

#[path = "../../proto/tests/support/property.rs"]
mod property;
use property::{Rng, apply_merge_patch, k8s_label, k8s_name, k8s_namespace};

const CASES: usize = 2_000;

/// A name the API server accepts (`max` characters at most).
fn valid_name(r: &mut Rng, max: usize, check: fn(&str) -> bool) -> String {
    for _ in 0..8 {
        let n = r.name(max);
        if check(&n) {
            return n;
        }
    }
    "a".into()
}

/// Any value, often one of the routing keys' meaningful ones.
fn value(r: &mut Rng) -> String {
    match r.below(4) {
        0 => r.name(70),
        1 => r
            .pick(&["true", "True", "1", "false", "grpc", "manifestwork", ""])
            .to_string(),
        _ => r.text(40),
    }
}

fn metadata_map(r: &mut Rng, routing: &[&str]) -> Map<String, Value> {
    let mut m = Map::new();
    for _ in 0..r.below(6) {
        let key = if r.chance(2) {
            r.pick(routing).to_string()
        } else {
            format!(
                "example.com/{}",
                valid_name(r, 63, |s| s.len() <= 63 && k8s_label(s))
            )
        };
        m.insert(key, Value::from(value(r)));
    }
    m
}

const ROUTING: &[&str] = &[
    keys::PULL_LABEL,
    keys::MANAGED_CLUSTER,
    keys::MANAGED_CLUSTER_APP_NAMESPACE,
    keys::SKIP_RECONCILE,
    keys::REFRESH,
    keys::MIRROR_OF,
    keys::MIRROR_SOURCE,
    keys::DESTINATION_NAME,
    keys::DESTINATION_SERVER,
    keys::TRANSPORT,
    "kubectl.kubernetes.io/last-applied-configuration",
];

fn application(r: &mut Rng) -> Value {
    let mut labels = metadata_map(r, ROUTING);
    // The API server holds only valid labels; the values above are not.
    labels.retain(|_, v| label_value(v.as_str().unwrap_or_default()));
    if r.chance(2) {
        labels.insert(keys::PULL_LABEL.into(), Value::from("true"));
    }
    let mut annotations = metadata_map(r, ROUTING);
    if r.chance(2) {
        annotations.insert(
            keys::MANAGED_CLUSTER.into(),
            Value::from(valid_name(r, 63, k8s_namespace)),
        );
    }
    let mut spec = r.json(3);
    if !spec.is_object() || r.chance(2) {
        spec = json!({ "project": "default", "source": { "repoURL": "https://git.example/a.git", "path": r.text(10) },
                       "destination": { "server": "https://kubernetes.default.svc", "namespace": r.text(10) } });
    }
    let mut app = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": valid_name(r, 253, k8s_name), "namespace": valid_name(r, 63, k8s_namespace),
                      "uid": format!("{:032x}", r.u64()), "labels": labels, "annotations": annotations },
        "spec": spec,
    });
    if r.chance(3) {
        app["status"] = r.json(3);
    }
    if r.chance(4) {
        app["operation"] = json!({ "sync": { "revision": r.text(10) } });
    }
    if r.chance(10) {
        app["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        app["metadata"]["finalizers"] = json!([keys::RESOURCES_FINALIZER]);
    }
    app
}

/// The API server's rule for a label value.
fn label_value(v: &str) -> bool {
    let ok = |c: u8| c.is_ascii_alphanumeric();
    v.len() <= 63
        && (v.is_empty()
            || (ok(v.as_bytes()[0])
                && ok(v.as_bytes()[v.len() - 1])
                && v.bytes().all(|c| ok(c) || b"-_.".contains(&c))))
}

/// The API server's rule for a label or annotation key.
fn qualified_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(k8s_name) && !name.is_empty() && label_value(name)
}

/// What the API server checks of an object's metadata, and that no
/// routing key leaks into a copy for a spoke.
fn check_metadata(what: &str, obj: &Value, routing_allowed: bool) {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    assert!(k8s_name(name), "{what}: name {name:?}");
    let ns = meta["namespace"].as_str().unwrap_or_default();
    assert!(k8s_namespace(ns), "{what}: namespace {ns:?}");
    for (k, v) in meta["labels"].as_object().into_iter().flatten() {
        assert!(qualified_key(k), "{what}: label key {k:?}");
        assert!(
            label_value(v.as_str().unwrap_or("\u{0}")),
            "{what}: label {k}={v}"
        );
        assert!(
            routing_allowed || k != keys::PULL_LABEL,
            "{what}: the pull label delivered"
        );
    }
    let mut total = 0;
    for (k, v) in meta["annotations"].as_object().into_iter().flatten() {
        assert!(qualified_key(k), "{what}: annotation key {k:?}");
        assert!(v.is_string(), "{what}: annotation {k} is not a string");
        total += k.len() + v.as_str().unwrap_or_default().len();
        if !routing_allowed {
            for key in [
                keys::MANAGED_CLUSTER,
                keys::MANAGED_CLUSTER_APP_NAMESPACE,
                keys::DESTINATION_NAME,
                keys::DESTINATION_SERVER,
                keys::SKIP_RECONCILE,
                "kubectl.kubernetes.io/last-applied-configuration",
            ] {
                assert_ne!(k, key, "{what}: {key} delivered");
            }
        }
    }
    assert!(total <= 256 << 10, "{what}: annotations over 256 KiB");
}

struct Stub(bool, bool, Vec<String>);

impl World for Stub {
    fn addon_enabled(&self, _: &str) -> bool {
        self.0
    }
    fn cluster_exists(&self, _: &str) -> bool {
        self.1
    }
    fn decided_in(&self, _: &str) -> Vec<String> {
        self.2.clone()
    }
    fn project(&self, _: &str) -> Option<argocd_pull_apis::argocd::ProjectSpec> {
        None
    }
}

#[test]
fn routing_and_rendering_never_panic_nor_produce_what_the_api_server_refuses() {
    let mut r = Rng::new();
    let mut delivered = 0;
    for case in 0..CASES {
        let value = application(&mut r);
        let app: Application = serde_json::from_value(value.clone()).expect("an Application");
        let cluster = value["metadata"]["annotations"][keys::MANAGED_CLUSTER]
            .as_str()
            .unwrap_or("c")
            .to_string();
        let world = Stub(
            r.chance(2),
            !r.chance(4),
            if r.chance(2) { vec![cluster] } else { vec![] },
        );
        let authorization = Authorization {
            require_placement: r.chance(2),
            allow: vec![],
            // Projects are the subject of route::project's own tests.
            projects: None,
        };
        let facts = Facts {
            grpc_served: r.chance(2),
            authorization: &authorization,
            world: &world,
        };
        let route = decide(&app, &facts);
        let Route::Deliver { target, .. } = route else {
            continue;
        };
        delivered += 1;
        assert!(
            k8s_namespace(&target.cluster),
            "case {case}: cluster {:?}",
            target.cluster
        );
        assert!(
            k8s_namespace(&target.app_namespace),
            "case {case}: {:?}",
            target.app_namespace
        );
        let copy = delivered_copy(&app, &target);
        check_metadata(&format!("case {case}: delivered copy"), &copy, false);
        assert!(
            copy.get("status").is_none(),
            "case {case}: status delivered"
        );
        check_metadata(
            &format!("case {case}: gRPC copy"),
            &grpc::grpc_copy(&app, &target),
            false,
        );
        match work::manifest_work(&app, &target, copy, &Default::default()) {
            Ok(w) => {
                let w = serde_json::to_value(&w).unwrap();
                check_metadata(&format!("case {case}: work"), &w, true);
                let name = w["metadata"]["name"].as_str().unwrap();
                assert!(
                    name.len() <= 188,
                    "case {case}: work name of {} characters",
                    name.len()
                );
                assert_eq!(w["metadata"]["namespace"], json!(target.cluster));
            }
            Err(e) => assert!(e.to_string().contains("large"), "case {case}: {e}"),
        }
    }
    // The generator reaches delivery often enough for this to mean something.
    assert!(
        delivered > CASES / 20,
        "only {delivered} of {CASES} cases delivered"
    );
}

#[test]
fn a_spoke_application_becomes_an_inert_valid_mirror() {
    let mut r = Rng::new();
    for case in 0..CASES {
        let spoke = application(&mut r);
        let cluster = valid_name(&mut r, 63, k8s_namespace);
        let key = ObjectKey {
            namespace: spoke["metadata"]["namespace"].as_str().unwrap().into(),
            name: spoke["metadata"]["name"].as_str().unwrap().into(),
        };
        let status = r.json(3);
        let mirror = grpc::mirror(&cluster, &key, &spoke, &status, &r.text(10));
        let what = format!("case {case}: mirror");
        check_metadata(&what, &mirror, true);
        assert_eq!(mirror["metadata"]["namespace"], json!(cluster), "{what}");
        let labels = mirror["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(
            !labels.contains_key(keys::PULL_LABEL),
            "{what}: pull label kept"
        );
        assert_eq!(labels.get(keys::MIRROR_OF), Some(&json!(cluster)), "{what}");
        let annotations = mirror["metadata"]["annotations"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for k in [
            keys::MANAGED_CLUSTER,
            keys::MANAGED_CLUSTER_APP_NAMESPACE,
            keys::TRANSPORT,
        ] {
            assert!(!annotations.contains_key(k), "{what}: {k} kept");
        }
    }
}

/// Whatever the current status and the feedback: the merge never panics,
/// says no more than the feedback does (only the fields it fed back), and
/// says it exactly.
#[test]
fn the_status_merge_never_panics_and_says_exactly_what_was_fed_back() {
    let mut r = Rng::new();
    let maybe = |r: &mut Rng| r.chance(2).then(|| r.text(20));
    for _ in 0..CASES {
        let fb = Feedback {
            health: maybe(&mut r),
            sync: maybe(&mut r),
            revision: maybe(&mut r),
            phase: maybe(&mut r),
            started_at: maybe(&mut r),
            conditions: r.chance(3).then(|| r.json(2)),
            resources: r.chance(3).then(|| r.json(2)),
            operation_message: maybe(&mut r),
            health_message: maybe(&mut r),
        };
        let out = status_update(&fb);
        let fields: Vec<&str> = out
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        for f in &fields {
            assert!(
                [
                    "health",
                    "sync",
                    "operationState",
                    "conditions",
                    "resources"
                ]
                .contains(f),
                "{f} in {out}"
            );
        }
        match &fb.sync {
            Some(s) => {
                assert_eq!(out["sync"]["status"], json!(s));
                assert_eq!(
                    out["sync"].get("revision"),
                    fb.revision.as_ref().map(|r| json!(r)).as_ref()
                );
            }
            None => assert!(out.get("sync").is_none(), "{out}"),
        }
        match &fb.health {
            Some(h) => assert_eq!(out["health"]["status"], json!(h), "{out}"),
            None => assert!(out.get("health").is_none(), "{out}"),
        }
        assert_eq!(
            out.get("operationState").is_some(),
            fb.phase.is_some() && fb.started_at.is_some(),
            "{out}"
        );
        if let (Some(phase), Some(started)) = (&fb.phase, &fb.started_at) {
            assert_eq!(out["operationState"]["phase"], json!(phase));
            assert_eq!(out["operationState"]["startedAt"], json!(started));
        }
        assert_eq!(out.get("conditions"), fb.conditions.as_ref());
        assert_eq!(out.get("resources"), fb.resources.as_ref());
    }
}

/// An arbitrary JSON object without nulls in objects (the API server keeps
/// none: a merge patch's null removes the field).
fn object(r: &mut Rng) -> Value {
    fn strip(v: Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k, strip(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.into_iter().map(strip).collect()),
            other => other,
        }
    }
    match strip(r.json(3)) {
        o @ Value::Object(_) => o,
        Value::Null => json!({}),
        other => json!({ "health": other }),
    }
}

#[test]
fn a_status_patch_turns_what_is_shown_into_what_is_wanted_and_only_when_they_differ() {
    let mut r = Rng::new();
    for case in 0..CASES {
        let current = object(&mut r);
        let wanted = if r.chance(4) {
            current.clone()
        } else {
            object(&mut r)
        };
        match status_patch(&current, &wanted, None) {
            None => assert_eq!(current, wanted, "case {case}: a difference left unwritten"),
            Some(p) => {
                assert_ne!(current, wanted, "case {case}: a no-op patch sent: {p}");
                let written = apply_merge_patch(&json!({ "status": current }), &p);
                assert_eq!(written, json!({ "status": wanted }), "case {case}: {p}");
            }
        }
    }
}

#[test]
fn the_status_of_a_report_carries_exactly_our_condition() {
    let mut r = Rng::new();
    for case in 0..CASES {
        let current = object(&mut r);
        let mut observed = object(&mut r);
        if r.chance(3) {
            // A hostile or confused spoke reporting a condition of our type.
            observed["conditions"] = json!([{ "type": "PullDeliveryError", "message": r.text(10) },
                                            { "type": r.text(8), "message": r.text(10) }]);
        }
        let observed = r.chance(4).then_some(observed);
        let condition = r.chance(2).then(|| r.text(30));
        let status = hub_status(&current, observed.as_ref(), condition.clone());
        let what = format!("case {case}: {status}");
        assert!(status.as_object().is_some_and(|m| !m.is_empty()), "{what}");
        assert_eq!(condition_of(&status), condition.as_deref(), "{what}");
    }
}

/// An arbitrary `.operation`, often with an argocd-pull stamp (right,
/// stale or garbage) among other info entries.
fn operation(r: &mut Rng) -> Value {
    let mut op = object(r);
    if r.chance(2) {
        op["sync"] = json!({ "revision": r.text(8) });
    }
    if r.chance(2) {
        let mut info = vec![json!({ "name": r.text(6), "value": r.text(6) })];
        if r.chance(2) {
            let value = match r.below(3) {
                0 => r.text(20),
                1 => format!("u.sync.1 {}", r.text(8)),
                _ => String::new(),
            };
            info.push(json!({ "name": OPERATION_ID_INFO, "value": value }));
        }
        op["info"] = Value::Array(info);
    }
    op
}

#[test]
fn a_sync_stamp_settles_in_one_write_whatever_the_operation_holds() {
    let mut r = Rng::new();
    for case in 0..CASES {
        let op = operation(&mut r);
        let app: Application = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "a", "namespace": "t", "uid": "u", "resourceVersion": "5" },
            "spec": {}, "operation": op,
        }))
        .unwrap();
        let what = format!("case {case}: {op}");
        let in_flight = InFlight {
            sync: r.chance(2).then_some("u.sync.3"),
            refresh: None,
        };
        let plan = commands::commands(&app, in_flight);
        let restamped = plan.stamp.is_some();
        let stamped = match plan.stamp {
            Some(patch) => {
                assert!(plan.ready.is_empty(), "{what}: sent before stamped");
                let mut v = serde_json::to_value(&app).unwrap();
                v = apply_merge_patch(&v, &patch);
                v["metadata"]["resourceVersion"] = json!("6");
                serde_json::from_value::<Application>(v).unwrap()
            }
            None => app.clone(),
        };
        let plan = commands::commands(&stamped, in_flight);
        assert_eq!(plan.stamp, None, "{what}: stamped twice");
        let [(id, Command::Sync(sent))] = plan.ready.as_slice() else {
            panic!("{what}: not exactly one sync ready: {:?}", plan.ready);
        };
        assert_eq!(Some(sent), stamped.data.get("operation"), "{what}");
        if restamped && let Some(running) = in_flight.sync {
            assert_eq!(
                id, running,
                "{what}: set again while a sync runs, yet a new sync"
            );
        }
        assert_eq!(
            argocd_pull_apis::keys::stamped_operation_id(sent),
            Some(id.as_str()),
            "{what}"
        );
        let done = completion_patch(&stamped, id, &Command::Sync(sent.clone())).unwrap();
        assert_eq!(done["operation"], Value::Null, "{what}");
    }
}

#[test]
fn the_work_carries_the_hub_operation_as_it_is() {
    let mut r = Rng::new();
    for case in 0..CASES {
        let op = r.chance(2).then(|| operation(&mut r));
        let spoke = r.chance(2).then(|| r.text(20));
        let carried = carried_operation(op.as_ref(), None, spoke.as_deref());
        match (&op, carried) {
            (Some(op), Some(c)) => {
                assert_eq!(&c.operation, op, "case {case}");
                assert_eq!(
                    c.previous_started_at,
                    spoke.unwrap_or_default(),
                    "case {case}"
                );
            }
            (None, None) => {}
            (op, c) => panic!("case {case}: {op:?} carried as {c:?}"),
        }
    }
}
