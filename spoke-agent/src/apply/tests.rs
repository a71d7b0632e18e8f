use super::*;

fn key() -> ObjectKey {
    ObjectKey {
        namespace: "argocd".into(),
        name: "gb".into(),
    }
}

fn delivered() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": "gb", "namespace": "argocd", "labels": { "team": "a" } },
        "spec": { "project": "default", "source": { "path": "p" } },
    })
}

fn app(v: Value) -> Application {
    serde_json::from_value(v).unwrap()
}

/// The delivered Application as the agent applies it for hub Application
/// `hub_uid` at `version`.
fn config(hub_uid: &str, version: &str) -> Value {
    applied_config(
        &key(),
        &serde_json::to_vec(&delivered()).unwrap(),
        hub_uid,
        version,
    )
    .unwrap()
}

/// The delivered Application, changed by `change`, as it would be on the
/// cluster.
fn delivered_with(change: impl FnOnce(&mut Value)) -> Application {
    let mut v = delivered();
    change(&mut v);
    app(v)
}

#[test]
fn the_applied_config_is_marked_and_hashed() {
    let config = config("u1", "u1.abc");
    assert_eq!(
        config["metadata"]["labels"],
        json!({ "team": "a", keys::HUB_MANAGED: "true" })
    );
    assert_eq!(
        config["metadata"]["annotations"][keys::DESIRED_VERSION],
        "u1.abc"
    );
    let a = app(config.clone());
    assert!(is_managed(&a) && !is_edited(&a));
    assert_eq!(replica_version(&a).as_deref(), Some("u1.abc"));

    let mut edited = config.clone();
    edited["spec"]["source"]["path"] = json!("other");
    let edited = app(edited);
    assert!(is_edited(&edited));
    assert_eq!(
        replica_version(&edited).as_deref(),
        Some(""),
        "never matches the hub"
    );
}

#[test]
fn bad_deliveries_are_refused_with_a_reason() {
    let cases = [
        (b"not json".to_vec(), "not JSON"),
        (
            serde_json::to_vec(&json!({ "kind": "ConfigMap", "apiVersion": "v1" })).unwrap(),
            "not an argoproj.io Application",
        ),
        (
            serde_json::to_vec(&{
                let mut d = delivered();
                d["metadata"]["name"] = json!("x");
                d
            })
            .unwrap(),
            "names argocd/x, but the message is for argocd/gb",
        ),
    ];
    for (json, want) in cases {
        let err = applied_config(&key(), &json, "u", "v")
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn commands_run_once_and_remember_a_bounded_history() {
    let a = delivered_with(|a| a["metadata"]["resourceVersion"] = json!("5"));
    let sync = Command::Sync(json!({ "sync": { "revision": "r" } }));
    let Run::Patch(p) = run_command(&a, "op-1", &sync) else {
        panic!()
    };
    assert_eq!(p["operation"], json!({ "sync": { "revision": "r" } }));
    assert_eq!(p["metadata"]["annotations"][keys::OPERATION_IDS], "op-1");
    assert_eq!(p["metadata"]["resourceVersion"], "5");

    let ids: Vec<String> = (0..OPERATION_MEMORY).map(|i| format!("op-{i}")).collect();
    let done = delivered_with(|d| {
        d["metadata"]["annotations"] = json!({ keys::OPERATION_IDS: ids.join(",") })
    });
    assert_eq!(run_command(&done, "op-3", &sync), Run::Duplicate);
    let Run::Patch(p) = run_command(&done, "new", &Command::Refresh(RefreshKind::Hard)) else {
        panic!()
    };
    let recorded = p["metadata"]["annotations"][keys::OPERATION_IDS]
        .as_str()
        .unwrap();
    assert_eq!(recorded.split(',').count(), OPERATION_MEMORY);
    assert!(recorded.ends_with(",new") && !recorded.contains("op-0,"));
    assert_eq!(p["metadata"]["annotations"][keys::REFRESH], "hard");
    assert_eq!(run_command(&a, "t", &Command::Terminate), Run::Nothing);
}

#[test]
fn only_what_the_agent_delivered_for_this_hub_application_is_written() {
    let config = config("hub-a", "v1");
    let ours = app(config.clone());
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = config.clone();
        f(&mut v);
        app(v)
    };
    let other_hub_app = with(&|v| v["metadata"]["annotations"][keys::HUB_UID] = json!("hub-b"));
    let unmarked_managed = with(&|v| {
        v["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(keys::HUB_UID);
    });
    // What a ManifestWork left on the cluster: the delivered copy as is.
    let left_by_a_work = app(delivered());
    let marked_by_the_hub = delivered_with(|v| {
        v["spec"]["source"]["path"] = json!("older");
        v["metadata"]["annotations"] = json!({ keys::HUB_UID: "hub-a" });
    });
    let local = delivered_with(|v| v["spec"]["source"]["path"] = json!("mine"));
    let local_same_spec_other_labels =
        delivered_with(|v| v["metadata"]["labels"] = json!({ "team": "b" }));
    let local_marked_for_another =
        delivered_with(|v| v["metadata"]["annotations"] = json!({ keys::HUB_UID: "hub-b" }));
    let cases: [(&str, Option<&Application>, Ownership); 9] = [
        ("nothing there", None, Ownership::Free),
        ("delivered for it", Some(&ours), Ownership::Ours),
        (
            "delivered for another hub Application",
            Some(&other_hub_app),
            Ownership::Refuse(Holder::HubApplication("hub-b".into())),
        ),
        (
            "managed without a hub uid",
            Some(&unmarked_managed),
            Ownership::Refuse(Holder::NotArgocdPull),
        ),
        (
            "left by a work, as delivered",
            Some(&left_by_a_work),
            Ownership::Adopt,
        ),
        (
            "left by a work the hub marked",
            Some(&marked_by_the_hub),
            Ownership::Adopt,
        ),
        (
            "created locally",
            Some(&local),
            Ownership::Refuse(Holder::NotArgocdPull),
        ),
        (
            "created locally, same spec, other labels",
            Some(&local_same_spec_other_labels),
            Ownership::Refuse(Holder::NotArgocdPull),
        ),
        (
            "marked for another hub Application",
            Some(&local_marked_for_another),
            Ownership::Refuse(Holder::NotArgocdPull),
        ),
    ];
    for (what, existing, want) in cases {
        assert_eq!(ownership(existing, "hub-a", &config), want, "{what}");
    }
    // A hub that sends no uid owns nothing.
    assert_eq!(
        ownership(Some(&ours), "", &config),
        Ownership::Refuse(Holder::HubApplication("hub-a".into()))
    );
    assert!(is_delivered_for(&ours, "hub-a"));
    assert!(!is_delivered_for(&ours, "hub-b") && !is_delivered_for(&ours, ""));
    assert!(
        !is_delivered_for(&marked_by_the_hub, "hub-a"),
        "not managed by the agent"
    );
}

#[test]
fn reports_carry_the_hub_application_they_belong_to() {
    let config = config("hub-a", "v1");
    let (v_a, o) = observed(&app(config.clone()), false);
    assert_eq!(o.hub_uid, "hub-a");
    let mut b = config.clone();
    b["metadata"]["annotations"][keys::HUB_UID] = json!("hub-b");
    let (v_b, o) = observed(&app(b), false);
    assert_eq!(o.hub_uid, "hub-b");
    assert_ne!(v_a, v_b, "a new holder is a new report");
    assert_eq!(observed(&app(config), true).1.hub_uid, "", "autonomous");
}

#[test]
fn reports_change_exactly_when_what_they_carry_changes() {
    let mut a = delivered();
    a["status"] = json!({ "health": { "status": "Healthy" } });
    a["metadata"]["resourceVersion"] = json!("1");
    let (v1, o) = observed(&app(a.clone()), false);
    assert!(o.application_json.is_empty());
    a["metadata"]["resourceVersion"] = json!("2");
    assert_eq!(
        observed(&app(a.clone()), false).0,
        v1,
        "a new resourceVersion alone is no change"
    );
    a["status"]["health"]["status"] = json!("Degraded");
    assert_ne!(observed(&app(a.clone()), false).0, v1);

    let (_, auto) = observed(&app(a.clone()), true);
    let mirrored: Value = serde_json::from_slice(&auto.application_json).unwrap();
    assert!(mirrored.get("status").is_none() && mirrored.get("operation").is_none());
    assert_eq!(mirrored["spec"], a["spec"]);
    assert!(mirrored["metadata"].get("resourceVersion").is_none());
}

#[test]
fn a_sync_settles_when_argo_cd_clears_the_operation_it_was_set_in() {
    let stamped =
        json!({ "sync": {}, "info": [{ "name": keys::OPERATION_ID_INFO, "value": "op-2 h" }] });
    let on = |ids: &str, op: Option<Value>, started: Option<&str>| {
        let mut v = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "gb", "namespace": "argocd", "uid": "u1",
                          "annotations": { keys::OPERATION_IDS: ids } },
        });
        if let Some(op) = op {
            v["operation"] = op;
        }
        if let Some(t) = started {
            v["status"] = json!({ "operationState": { "startedAt": t } });
        }
        app(v)
    };
    let settled = |t: &str| Settlement::Settled {
        started_at: t.into(),
    };
    // The cache has not seen the write that set it yet.
    assert_eq!(
        settlement(Some(&on("op-1", None, Some("T1"))), "op-2", "u1"),
        Settlement::Waiting
    );
    // Set, not finished: still carried.
    assert_eq!(
        settlement(
            Some(&on("op-1,op-2", Some(stamped.clone()), Some("T1"))),
            "op-2",
            "u1"
        ),
        Settlement::Waiting
    );
    // Argo CD cleared it: settled, with the start the status shows.
    assert_eq!(
        settlement(Some(&on("op-1,op-2", None, Some("T2"))), "op-2", "u1"),
        settled("T2")
    );
    // Another operation replaced it (set on the cluster, or a later sync).
    let other =
        json!({ "sync": {}, "info": [{ "name": keys::OPERATION_ID_INFO, "value": "op-3 h" }] });
    assert_eq!(
        settlement(Some(&on("op-1,op-2,op-3", Some(other), None)), "op-2", "u1"),
        settled("")
    );
    // Gone, or a new Application of the same name: nothing left to wait for.
    assert_eq!(settlement(None, "op-2", "u1"), settled(""));
    assert_eq!(
        settlement(
            Some(&on("op-2", Some(stamped), Some("T1"))),
            "op-2",
            "u-other"
        ),
        settled("")
    );
    // The id has dropped out of the bounded list: later operations were set since.
    let many: Vec<String> = (10..10 + OPERATION_MEMORY)
        .map(|i| format!("op-{i}"))
        .collect();
    assert_eq!(
        settlement(Some(&on(&many.join(","), None, Some("T9"))), "op-2", "u1"),
        settled("T9")
    );
}
