//! The leader's share of the record: the shards created, what was issued
//! on the clusters' own requests written, expired entries pruned, and a
//! Warning Event on each CSR whose certificate is refused.

use super::*;

/// The leader's share until `down`: creates the shards, records what was
/// issued on the clusters' own requests, prunes expired entries, and
/// publishes a Warning Event on each CSR whose certificate is refused.
pub async fn lead(
    issued: Arc<Issued>,
    client: kube::Client,
    down: impl std::future::Future<Output = ()>,
) {
    if !issued.on {
        return;
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &issued.namespace);
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "argocd-pull-hub-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    tokio::pin!(down);
    loop {
        // Writes stuck on a stalled API server must not hold up the end
        // of the term (the step-down waits for this task).
        let ok = tokio::select! {
            ok = async {
                let ok = create_shards(&issued, &api).await && write(&issued, &api).await;
                events(&issued, &recorder).await;
                ok
            } => ok,
            _ = &mut down => return,
        };
        // Soon again while something failed or a shard is not there yet
        // (not listed, or missing: created above once listed).
        let wait = if ok && *issued.loaded.borrow() {
            PRUNE_EVERY
        } else {
            Duration::from_secs(2)
        };
        tokio::select! {
            _ = &mut down => return,
            _ = issued.dirty.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn create_shards(issued: &Issued, api: &Api<ConfigMap>) -> bool {
    let missing: Vec<u32> = {
        let state = issued.state();
        (0..record::SHARDS)
            .filter(|i| {
                state.shards_listed.contains(i)
                    && state.shards.get(i).is_none_or(|s| s.since.is_none())
            })
            .collect()
    };
    let mut ok = true;
    for i in missing {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(record::shard_name(i)),
                labels: Some(
                    [
                        (record::SHARD_LABEL.to_string(), "true".to_string()),
                        (
                            "app.kubernetes.io/managed-by".to_string(),
                            "argocd-pull-hub-controller".to_string(),
                        ),
                    ]
                    .into(),
                ),
                annotations: Some(
                    [(record::SINCE_ANNOTATION.to_string(), now().to_string())].into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(created) => {
                tracing::info!(configmap = %record::shard_name(i), "began the record of issued certificates");
                issued.apply_shard(i, Some(&created));
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                ok = false;
                tracing::error!(configmap = %record::shard_name(i), error = %e, "cannot create the record of issued certificates; retrying");
            }
        }
    }
    ok
}

/// Writes what the CSR watch saw issued and is not recorded yet, and
/// drops what expired.
async fn write(issued: &Issued, api: &Api<ConfigMap>) -> bool {
    let now = now();
    let plans: Vec<(u32, BTreeMap<String, Option<Entry>>)> = {
        let mut state = issued.state();
        state.issued.retain(|_, i| i.not_after > now);
        state.refused.retain(|_, (i, _)| i.not_after > now);
        let refused: HashSet<String> = state.refused.values().map(|(i, _)| i.csr.clone()).collect();
        state.evented.retain(|csr| refused.contains(csr));
        let mut add: HashMap<u32, Vec<(String, Entry)>> = HashMap::new();
        for (fp, issue) in &state.issued {
            let Some(cluster) = issue.cluster.as_deref() else {
                continue;
            };
            add.entry(record::shard_of(cluster))
                .or_default()
                .push((fp.clone(), Entry::of(cluster, issue)));
        }
        state
            .shards
            .iter()
            .filter(|(_, s)| s.since.is_some())
            .map(|(i, s)| {
                (
                    *i,
                    record::changes(&s.entries, add.get(i).map_or(&[][..], |v| v), now),
                )
            })
            .filter(|(_, c)| !c.is_empty())
            .collect()
    };
    let mut ok = true;
    for (i, changes) in plans {
        let data: serde_json::Map<String, serde_json::Value> = changes
            .iter()
            .map(|(fp, e)| {
                let v = match e {
                    Some(e) => serde_json::Value::String(
                        serde_json::to_string(e).expect("an entry serializes"),
                    ),
                    None => serde_json::Value::Null,
                };
                (fp.clone(), v)
            })
            .collect();
        let patch = serde_json::json!({ "data": data });
        match api
            .patch(
                &record::shard_name(i),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(cm) => {
                let (added, removed) = changes.values().fold((0, 0), |(a, r), e| {
                    if e.is_some() { (a + 1, r) } else { (a, r + 1) }
                });
                tracing::info!(configmap = %record::shard_name(i), added, removed, "recorded issued certificates");
                issued.apply_shard(i, Some(&cm));
            }
            Err(e) => {
                ok = false;
                tracing::error!(configmap = %record::shard_name(i), error = %e, "cannot write the record of issued certificates; retrying (agents whose certificate was issued meanwhile are accepted while its CSR exists)");
            }
        }
    }
    ok
}

async fn events(issued: &Issued, recorder: &Recorder) {
    let todo: Vec<(Issue, String)> = {
        let state = issued.state();
        state
            .refused
            .values()
            .filter(|(i, _)| !state.evented.contains(&i.csr))
            .cloned()
            .collect()
    };
    for (issue, why) in todo {
        let reference = ObjectReference {
            api_version: Some("certificates.k8s.io/v1".into()),
            kind: Some("CertificateSigningRequest".into()),
            name: Some(issue.csr.clone()),
            ..Default::default()
        };
        let claimed = issue.cluster.as_deref().unwrap_or("no cluster");
        let note = format!(
            "argocd-pull never accepts the certificate issued on this CSR (SHA-256 {}) for cluster {claimed}: {why}. Requester: {}",
            issue.fingerprint, issue.requester
        );
        let event = Event {
            type_: EventType::Warning,
            reason: "CertificateNotRequestedByCluster".into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Verify".into(),
            secondary: None,
        };
        match recorder.publish(&event, &reference).await {
            Ok(()) => {
                issued.state().evented.insert(issue.csr.clone());
            }
            Err(e) => tracing::warn!(csr = %issue.csr, error = %e, "could not publish event"),
        }
    }
}
