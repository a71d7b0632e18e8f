//! The hub-controller's pod deleted while Applications are created,
//! changed and deleted on the hub: the Deployment's replacement pod picks
//! up where the old one stopped, and in the end every Application is on
//! its cluster exactly as on the hub (none lost, none left behind, one
//! ManifestWork each), the deleted ones gone from both.

use std::collections::BTreeMap;

use argocd_pull_apis::keys;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::stack::{self, Stack};

use super::support::{apps, at, eventually, get, names};

/// Applications per cluster.
const PER_CLUSTER: usize = 8;
const PREFIX: &str = "churn-";

/// An Application of the churn; deleting one waits for argocd-pull, even
/// while its pod is gone.
fn application(name: &str, cluster: &str, repo: &str, round: u64) -> DynamicObject {
    let mut app = stack::application(name, cluster, repo, "churn", round);
    app.metadata.finalizers = Some(vec![keys::RESOURCES_FINALIZER.into()]);
    app
}

/// The round an Application's spec carries.
fn round(a: &Value) -> String {
    at(a, "/spec/info/0/value").to_string()
}

/// The ready hub-controller pod now (name and UID).
async fn hub_pod(pods: &Api<Pod>) -> Option<(String, String)> {
    let list = pods.list(&ListParams::default()).await.ok()?;
    list.items.into_iter().find_map(|p| {
        let ready = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .all(|c| c.ready);
        (ready && p.metadata.deletion_timestamp.is_none()).then_some(())?;
        Some((p.metadata.name.clone()?, p.metadata.uid.clone()?))
    })
}

pub async fn hub_controller_pod_deleted_during_churn(stack: &Stack) {
    let hub_client = stack.hub().client().await.unwrap();
    let hub = apps(&hub_client);
    let clusters = ["cluster1", "cluster2"];
    let mut spokes = BTreeMap::new();
    for c in clusters {
        spokes.insert(c, apps(&stack.cluster(c).client().await.unwrap()));
    }
    let pods: Api<Pod> = Api::namespaced(hub_client.clone(), stack::HUB_NAMESPACE);
    let (old_name, old_uid) = hub_pod(&pods).await.expect("a ready hub-controller pod");
    let repo = stack.repo.url().to_string();

    // What the hub should end with: name -> (cluster, round); deleted names apart.
    let mut expected: BTreeMap<String, (&str, usize)> = BTreeMap::new();
    let mut deleted = Vec::new();
    let all: Vec<(String, &str)> = (0..PER_CLUSTER)
        .flat_map(|i| clusters.map(|c| (format!("{PREFIX}{c}-{i}"), c)))
        .collect();
    let pod_deleted_at = all.len() / 3;
    for (step, (name, cluster)) in all.iter().enumerate() {
        if step == pod_deleted_at {
            // Not waiting for it to go: the churn goes on meanwhile.
            pods.delete(&old_name, &DeleteParams::default())
                .await
                .unwrap();
        }
        hub.create(
            &PostParams::default(),
            &application(name, cluster, &repo, 0),
        )
        .await
        .unwrap();
        expected.insert(name.clone(), (cluster, 0));
        // Change an earlier one, and delete every fifth.
        if step >= 2 {
            let (earlier, _) = &all[step - 2];
            if step % 5 == 0 {
                hub.delete(earlier, &DeleteParams::default()).await.unwrap();
                expected.remove(earlier);
                deleted.push(earlier.clone());
            } else if let Some((_, r)) = expected.get_mut(earlier) {
                *r += 1;
                hub.patch(
                    earlier,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "info": [{ "name": "round", "value": r.to_string() }] } })),
                )
                .await
                .unwrap();
            }
        }
    }

    // The Deployment's replacement is a new pod, ready.
    let (new_name, new_uid) = eventually(stack, "a new hub-controller pod, ready", || async {
        match hub_pod(&pods).await {
            Some((n, u)) if u != old_uid => Ok((n, u)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eprintln!(
        "hub-controller pod {old_name} deleted during the churn; replaced by {new_name} ({new_uid})"
    );

    // Every Application on its cluster as on the hub; the deleted gone.
    eventually(stack, "every churned Application as on the hub", || async {
        let mut differences = Vec::new();
        let on_hub: Vec<String> = names(&hub)
            .await?
            .into_iter()
            .filter(|n| n.starts_with(PREFIX))
            .collect();
        let want: Vec<String> = expected.keys().cloned().collect();
        if on_hub != want {
            differences.push(format!("hub has {on_hub:?}"));
        }
        for (cluster, spoke) in &spokes {
            let mut want: Vec<&String> = expected
                .iter()
                .filter(|(_, (c, _))| c == cluster)
                .map(|(n, _)| n)
                .collect();
            want.sort();
            let have: Vec<String> = names(spoke)
                .await?
                .into_iter()
                .filter(|n| n.starts_with(PREFIX))
                .collect();
            if have.iter().collect::<Vec<_>>() != want {
                differences.push(format!("{cluster} has {have:?}, the hub wants {want:?}"));
                continue;
            }
            for name in have {
                let (s, h) = (get(spoke, &name).await?, get(&hub, &name).await?);
                let r = expected[&name].1.to_string();
                if round(&s) != r || round(&h) != r {
                    differences.push(format!(
                        "{name}: round {} on {cluster}, {} on the hub, want {r}",
                        round(&s),
                        round(&h)
                    ));
                } else if at(&h, "/status/sync/status").is_empty() {
                    differences.push(format!("{name}: no status back on the hub"));
                }
            }
        }
        // One ManifestWork per Application on cluster2, and none of the deleted.
        let works =
            Api::<argocd_pull_apis::ocm::ManifestWork>::namespaced(hub_client.clone(), "cluster2")
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
        let mut per_app: BTreeMap<String, usize> = BTreeMap::new();
        for w in works.items {
            let annotations = w.metadata.annotations.unwrap_or_default();
            if let Some(app) = annotations
                .get(keys::HUB_APP_NAME)
                .filter(|n| n.starts_with(PREFIX))
            {
                *per_app.entry(app.clone()).or_default() += 1;
            }
        }
        let want: BTreeMap<String, usize> = expected
            .iter()
            .filter(|(_, (c, _))| *c == "cluster2")
            .map(|(n, _)| (n.clone(), 1))
            .collect();
        if per_app != want {
            differences.push(format!("ManifestWorks per Application {per_app:?}"));
        }
        if differences.is_empty() {
            Ok(())
        } else {
            Err(differences.join("; "))
        }
    })
    .await;
    assert!(!deleted.is_empty());

    // Tidy up for the later phases: every churned Application goes.
    for name in expected.keys() {
        hub.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for (cluster, spoke) in &spokes {
        eventually(
            stack,
            &format!("the churned Applications gone from {cluster}"),
            || async {
                let left: Vec<String> = names(spoke)
                    .await?
                    .into_iter()
                    .filter(|n| n.starts_with(PREFIX))
                    .collect();
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?}"))
                }
            },
        )
        .await;
    }
}
