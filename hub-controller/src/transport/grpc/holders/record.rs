//! Pure: the hub's record of what one cluster's agent holds over gRPC, as
//! it is kept in its Lease, and how a replica's latest reports change it.

use std::collections::BTreeMap;

use argocd_pull_proto::v1::ObjectKey;

/// Spoke Application (namespace, name) -> the uid of the hub Application
/// the agent applied it for.
pub type Record = BTreeMap<ObjectKey, String>;

/// Label on the record Leases.
pub const LABEL: &str = "argocd-pull.io/agent-holds";
/// The record, as JSON: `{"<namespace>/<name>": "<hub uid>", ...}`.
pub const ANNOTATION: &str = "argocd-pull.io/holders";
/// The record's size at most, in bytes of JSON. Annotations of one object
/// may take 256 KiB in all; a spoke Application is recorded in 60 to 120
/// bytes, so this holds a few thousand per cluster. What does not fit is
/// not recorded: those keys are decided by age alone (and logged).
pub const MAX_BYTES: usize = 200 * 1024;

/// The Lease that holds `cluster`'s record.
pub fn lease_name(cluster: &str) -> String {
    format!("argocd-pull-holders-{cluster}")
}

/// `record` as its annotation's JSON (in key order: the same record is
/// always the same text).
pub fn encode(record: &Record) -> String {
    let map: serde_json::Map<String, serde_json::Value> = record
        .iter()
        .map(|(k, uid)| (format!("{}/{}", k.namespace, k.name), uid.clone().into()))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// The record in an annotation's JSON; an entry that is not a
/// `namespace/name` key with a string uid is skipped (only the hub writes
/// the Lease, but a bad edit must not stop a replica).
pub fn decode(json: &str) -> Record {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(json) else {
        return Record::new();
    };
    map.into_iter()
        .filter_map(|(k, v)| {
            let (namespace, name) = k.split_once('/')?;
            let uid = v.as_str().filter(|u| !u.is_empty())?;
            (!namespace.is_empty() && !name.is_empty()).then(|| {
                (
                    ObjectKey {
                        namespace: namespace.into(),
                        name: name.into(),
                    },
                    uid.to_string(),
                )
            })
        })
        .collect()
}

/// `record` changed by what the agent reported since (`reports`: key ->
/// the holder it reports, `None` for gone), keeping only keys that `named`
/// (some hub Application names them on the cluster). Keys reported nothing
/// of stay as they were: a replica that has not heard the agent since it
/// started knows nothing new. Entries already recorded are kept first;
/// new ones are added while the record stays under [`MAX_BYTES`]. Returns
/// the record and how many new entries did not fit.
pub fn merge<'a>(
    record: &Record,
    reports: impl IntoIterator<Item = (&'a ObjectKey, Option<&'a str>)>,
    named: impl Fn(&ObjectKey) -> bool,
) -> (Record, usize) {
    let mut next = record.clone();
    let mut added = Vec::new();
    for (key, holder) in reports {
        match holder {
            Some(uid) if record.get(key).map(String::as_str) == Some(uid) => {}
            Some(uid) => {
                next.remove(key);
                added.push((key.clone(), uid.to_string()));
            }
            None => {
                next.remove(key);
            }
        }
    }
    next.retain(|k, _| named(k));
    added.retain(|(k, _)| named(k));
    let mut bytes = encode(&next).len();
    let mut left_out = 0;
    for (key, uid) in added {
        // `"ns/name":"uid",`
        let entry = key.namespace.len() + key.name.len() + uid.len() + 7;
        if bytes + entry > MAX_BYTES {
            left_out += 1;
            continue;
        }
        bytes += entry;
        next.insert(key, uid);
    }
    (next, left_out)
}

/// The keys whose holder differs between `old` and `new`.
pub fn changed(old: &Record, new: &Record) -> Vec<ObjectKey> {
    let mut keys: Vec<ObjectKey> = old
        .iter()
        .filter(|(k, v)| new.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    keys.extend(new.keys().filter(|k| !old.contains_key(*k)).cloned());
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_bad_entries_are_skipped() {
        let record = Record::from([
            (key("argocd", "guestbook"), "u-1".to_string()),
            (key("apps", "a.b"), "u-2".to_string()),
        ]);
        let json = encode(&record);
        assert_eq!(json, r#"{"apps/a.b":"u-2","argocd/guestbook":"u-1"}"#);
        assert_eq!(decode(&json), record);
        assert_eq!(
            decode(r#"{"argocd/x":"u-1","noslash":"u","argocd/y":3,"/z":"u","argocd/w":""}"#),
            Record::from([(key("argocd", "x"), "u-1".to_string())])
        );
        assert!(decode("not json").is_empty());
        assert!(decode("[]").is_empty());
    }

    #[test]
    fn reports_change_only_what_they_name_and_unnamed_keys_go() {
        let (a, b, c) = (key("argocd", "a"), key("argocd", "b"), key("argocd", "c"));
        let record = Record::from([(a.clone(), "u-a".into()), (b.clone(), "u-b".into())]);
        let (next, left_out) = merge(&record, [(&b, None), (&c, Some("u-c"))], |_| true);
        assert_eq!(left_out, 0);
        assert_eq!(
            next,
            Record::from([(a.clone(), "u-a".into()), (c.clone(), "u-c".into())]),
            "a stays (nothing said of it), b is gone, c is new"
        );
        let (next, _) = merge(&record, [(&a, Some("u-other"))], |k| *k != b);
        assert_eq!(
            next,
            Record::from([(a.clone(), "u-other".into())]),
            "a new holder replaces the old; a key nobody names goes"
        );
        assert_eq!(changed(&record, &next), vec![a.clone(), b.clone()]);
        assert!(changed(&record, &record).is_empty());
    }

    #[test]
    fn what_is_recorded_stays_and_new_entries_stop_at_the_bound() {
        let long = "x".repeat(200);
        let keys: Vec<ObjectKey> = (0..2000)
            .map(|i| key("ns", &format!("{long}-{i}")))
            .collect();
        let uid = "0".repeat(36);
        let reports: Vec<(&ObjectKey, Option<&str>)> =
            keys.iter().map(|k| (k, Some(uid.as_str()))).collect();
        let (full, left_out) = merge(&Record::new(), reports.clone(), |_| true);
        assert!(left_out > 0 && full.len() + left_out == keys.len());
        assert!(encode(&full).len() <= MAX_BYTES, "{}", encode(&full).len());
        // The recorded ones are kept when more come.
        let more = key("ns", &format!("{long}-more"));
        let (again, left_out) = merge(&full, [(&more, Some(uid.as_str()))], |_| true);
        assert_eq!((again.len(), left_out), (full.len(), 1));
    }

    #[test]
    fn what_a_report_says_the_agent_holds() {
        use super::super::super::cluster::{Observation, Report};
        use argocd_pull_proto::v1::ObservedApplication;
        use std::sync::Arc;
        let managed = |hub_uid: &str| Observation::Observed {
            version: "u-ver.123".into(),
            report: Arc::new(Report::of(&ObservedApplication {
                hub_uid: hub_uid.into(),
                status_json: "{}".into(),
                ..Default::default()
            })),
        };
        assert_eq!(Observation::holder(&managed("u-1")), Some(Some("u-1")));
        assert_eq!(
            Observation::holder(&managed("")),
            Some(Some("u-ver")),
            "an agent before owner-check: the version names the hub uid"
        );
        assert_eq!(Observation::holder(&Observation::Gone), Some(None));
        let autonomous = Observation::Observed {
            version: "v".into(),
            report: Arc::new(Report::of(&ObservedApplication {
                status_json: "{}".into(),
                application_json: "{}".into(),
                ..Default::default()
            })),
        };
        assert_eq!(Observation::holder(&autonomous), None);
        assert_eq!(
            Observation::holder(&Observation::Mirrored {
                version: "v".into()
            }),
            None
        );
    }
}
