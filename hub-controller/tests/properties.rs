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
//! status merge never panics and yields an object.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_hub_controller::render::{delivered_copy, grpc, work};
use argocd_pull_hub_controller::route::authz::Authorization;
use argocd_pull_hub_controller::route::decide::{Facts, Route, World, decide};
use argocd_pull_hub_controller::status::feedback::{Feedback, status_update};
use argocd_pull_proto::v1::ObjectKey;
use serde_json::{Map, Value, json};

#[path = "../../proto/tests/support/property.rs"]
mod property;
use property::{Rng, k8s_label, k8s_name, k8s_namespace};

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

#[test]
fn the_status_merge_never_panics_and_yields_an_object() {
    let mut r = Rng::new();
    let maybe = |r: &mut Rng| r.chance(2).then(|| r.text(20));
    for _ in 0..CASES {
        let current = r.json(3);
        let fb = Feedback {
            health: maybe(&mut r),
            sync: maybe(&mut r),
            revision: maybe(&mut r),
            phase: maybe(&mut r),
            started_at: maybe(&mut r),
            conditions: r.chance(3).then(|| r.json(2)),
            operation_message: maybe(&mut r),
            health_message: maybe(&mut r),
        };
        assert!(status_update(&current, &fb).is_object());
    }
}
