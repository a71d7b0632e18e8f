use super::*;
use crate::render::delivered_copy;
use serde_json::json;

fn app(name: &str) -> Application {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": "hub-apps", "uid": "uid-1" },
        "spec": { "project": "default", "destination": {} }
    }))
    .unwrap()
}

fn target() -> Target {
    Target {
        cluster: "cluster1".into(),
        app_namespace: "argocd".into(),
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[test]
fn work_names_are_deterministic_valid_and_distinct() {
    assert_eq!(work_name("hub-apps", "guestbook"), "hub-apps.guestbook");
    // Names that would collide when joined with '-' stay apart.
    assert_ne!(work_name("a-b", "c"), work_name("a", "b-c"));
    let long = "x".repeat(63);
    for name in [
        format!("{long}.{long}.{long}.{long}"),
        format!("{long}.{long}.{long}.{long}-"),
        format!("{long}.{long}.{long}.{}", "y".repeat(50)),
    ] {
        let n = work_name("some-namespace", &name);
        assert!(
            n.len() <= 188,
            "{} chars: the work agent's AppliedManifestWork name must fit",
            n.len()
        );
        assert!(format!("{}-{n}", "h".repeat(64)).len() <= 253);
        assert!(is_dns_subdomain(&n), "{n}");
        assert_eq!(n, work_name("some-namespace", &name), "deterministic");
    }
    // Long names that share the kept prefix still differ.
    let a = format!("{long}.{long}.{long}.{long}a");
    let b = format!("{long}.{long}.{long}.{long}b");
    assert_ne!(work_name("ns", &a), work_name("ns", &b));
}

#[test]
fn manifest_work_shape_matches_the_reference() {
    let app = app("guestbook");
    let t = target();
    let work = manifest_work(&app, &t, delivered_copy(&app, &t), &WorkOptions::default()).unwrap();
    let v = serde_json::to_value(&work).unwrap();
    assert_eq!(v["metadata"]["name"], "hub-apps.guestbook");
    assert_eq!(v["metadata"]["namespace"], "cluster1");
    assert_eq!(
        v["metadata"]["annotations"][keys::HUB_APP_NAMESPACE],
        "hub-apps"
    );
    assert_eq!(
        v["metadata"]["annotations"][keys::HUB_APP_NAME],
        "guestbook"
    );
    assert_eq!(v["metadata"]["annotations"][HUB_APP_UID], "uid-1");
    assert_eq!(v["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(
        v["spec"]["workload"]["manifests"][0]["metadata"]["name"],
        "guestbook"
    );
    let config = &v["spec"]["manifestConfigs"][0];
    assert_eq!(
        config["resourceIdentifier"],
        json!({ "group": "argoproj.io", "resource": "applications", "namespace": "argocd", "name": "guestbook" })
    );
    assert_eq!(config["feedbackScrapeType"], "Watch");
    assert_eq!(config["feedbackRules"][0]["type"], "JSONPaths");
    let paths: Vec<(String, String)> = config["feedbackRules"][0]["jsonPaths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().into(),
                p["path"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        paths,
        FEEDBACK_SCALARS
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        config["updateStrategy"],
        json!({ "type": "ServerSideApply", "serverSideApply": {
            "force": true,
            "ignoreFields": [{ "condition": "OnSpokeChange", "jsonPaths": [".operation"] }]
        }})
    );
}

#[test]
fn raw_feedback_rules_are_opt_in() {
    let app = app("guestbook");
    let t = target();
    let opts = WorkOptions {
        raw_feedback: true,
        ..Default::default()
    };
    let work = manifest_work(&app, &t, delivered_copy(&app, &t), &opts).unwrap();
    let rules = &work.spec.manifest_configs.unwrap()[0]
        .feedback_rules
        .clone()
        .unwrap()[0];
    assert_eq!(
        rules.json_paths.as_ref().unwrap().len(),
        FEEDBACK_SCALARS.len() + FEEDBACK_RAW.len()
    );
}

#[test]
fn refuses_an_oversized_application_with_a_fix() {
    let mut app = app("big");
    app.data["spec"]["source"] = json!({ "helm": { "values": "x".repeat(MAX_MANIFESTS_BYTES) } });
    let t = target();
    let err =
        manifest_work(&app, &t, delivered_copy(&app, &t), &WorkOptions::default()).unwrap_err();
    assert!(matches!(err, WorkError::TooLarge { size } if size > MAX_MANIFESTS_BYTES));
    assert!(err.to_string().contains("500 KiB"), "{err}");
}

#[test]
fn applied_when_nothing_would_change() {
    let a = app("guestbook");
    let desired = manifest_work(
        &a,
        &target(),
        delivered_copy(&a, &target()),
        &WorkOptions::default(),
    )
    .unwrap();
    // The server adds defaults and its own metadata: still applied.
    let mut stored = serde_json::to_value(&desired).unwrap();
    stored["metadata"]["resourceVersion"] = json!("7");
    stored["metadata"]["labels"]["extra"] = json!("x");
    stored["spec"]["deleteOption"] = json!({ "propagationPolicy": "Foreground" });
    let stored: ManifestWork = serde_json::from_value(stored).unwrap();
    assert!(is_applied(&desired, &stored));

    // A changed or removed field of the delivered Application is not.
    let mut op = serde_json::to_value(&stored).unwrap();
    op["spec"]["workload"]["manifests"][0]["operation"] = json!({ "sync": {} });
    let with_op: ManifestWork = serde_json::from_value(op).unwrap();
    assert!(!is_applied(&desired, &with_op));

    // A feedback rule more or less is not.
    let raw = manifest_work(
        &a,
        &target(),
        delivered_copy(&a, &target()),
        &WorkOptions {
            raw_feedback: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!is_applied(&raw, &stored));
    assert!(!is_applied(&desired, &raw));

    // Nor is a missing label, or a handover annotation left behind.
    let mut bare = stored.clone();
    bare.labels_mut().remove(MANAGED_BY_LABEL);
    assert!(!is_applied(&desired, &bare));
    let mut left = stored.clone();
    left.annotations_mut().insert(
        crate::render::operation::PREVIOUS_STARTED_AT.into(),
        String::new(),
    );
    assert!(!is_applied(&desired, &left));
}

#[test]
fn applied_on_spoke_means_this_generation() {
    let mut w: ManifestWork = serde_json::from_value(serde_json::json!({
        "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": { "name": "w", "generation": 2 },
        "spec": {},
        "status": { "conditions": [{ "type": "Applied", "status": "True",
            "observedGeneration": 1, "reason": "x", "message": "x",
            "lastTransitionTime": "2026-01-01T00:00:00Z" }] }
    }))
    .unwrap();
    assert!(!applied_on_spoke(&w), "an older generation was applied");
    assert!(!reported_applied(&w));
    w.metadata.generation = Some(1);
    assert!(applied_on_spoke(&w) && reported_applied(&w));
    // A report that names no generation: applied for the silence check,
    // not for a refresh hand-over.
    w.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].observed_generation = None;
    assert!(!applied_on_spoke(&w) && reported_applied(&w));
    w.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    assert!(!applied_on_spoke(&w) && !reported_applied(&w));
}
