//! `deploy/hub` installs with `kubectl apply -k`, and its RBAC is enough
//! for everything the hub-controller does, and no more: the binary runs
//! with exactly the service account's permissions (a client certificate for
//! its user name) through a whole delivery, refusal and deletion.

use std::path::Path;
use std::time::Duration;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManifestWork;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use testenv::{Cluster, wait};

mod common;
use common::{
    Binary, app, app_for, apps_api, feed_back, kubectl, managed_cluster, placement_selects,
};

const TIMEOUT: Duration = Duration::from_secs(60);

fn can_i(kubeconfig: &Path, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend(args);
    let out = kubectl(kubeconfig, &all);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
async fn the_deployed_rbac_is_enough_and_no_more() {
    let (hub, client, sa) = common::deployed_hub("hub").await;
    // Least privilege: what it must not be able to do.
    for denied in [
        &["list", "secrets", "--all-namespaces"][..],
        &["get", "secrets", "-n", "kube-system"],
        // Not even in the Argo CD namespace: argocd-secret and repository
        // credentials live there; it only writes its cluster Secrets.
        &["list", "secrets", "-n", "argocd"],
        &["watch", "secrets", "-n", "argocd"],
        &["get", "secrets/argocd-secret", "-n", "argocd"],
        &["create", "applications.argoproj.io", "-n", "default"],
        &["delete", "applications.argoproj.io", "-n", "default"],
        &[
            "update",
            "managedclusters.cluster.open-cluster-management.io",
        ],
        &["create", "leases.coordination.k8s.io", "-n", "default"],
        // The deny list is the only ConfigMap it reads, and it never writes it.
        &["list", "configmaps", "-n", "argocd-pull"],
        &["get", "configmaps/kube-root-ca.crt", "-n", "argocd-pull"],
        &[
            "update",
            "configmaps/argocd-pull-denied-certificates",
            "-n",
            "argocd-pull",
        ],
        &[
            "patch",
            "configmaps/argocd-pull-denied-certificates",
            "-n",
            "argocd-pull",
        ],
        // CSRs: read only; OCM approves and signs them.
        &["update", "certificatesigningrequests.certificates.k8s.io"],
        &["delete", "certificatesigningrequests.certificates.k8s.io"],
        &[
            "update",
            "certificatesigningrequests.certificates.k8s.io",
            "--subresource=approval",
        ],
        &[
            "update",
            "certificatesigningrequests.certificates.k8s.io",
            "--subresource=status",
        ],
    ] {
        assert!(!can_i(&sa, denied), "the service account may {denied:?}");
    }
    assert!(can_i(&sa, &["patch", "secrets", "-n", "argocd"]));
    assert!(can_i(
        &sa,
        &["watch", "certificatesigningrequests.certificates.k8s.io"]
    ));
    for verb in ["get", "list", "watch", "patch"] {
        assert!(
            can_i(
                &sa,
                &[
                    verb,
                    "configmaps/argocd-pull-issued-certificates-15",
                    "-n",
                    "argocd-pull"
                ]
            ),
            "{verb} of the record of issued certificates"
        );
    }
    for verb in ["get", "list", "watch"] {
        assert!(
            can_i(
                &sa,
                &[
                    verb,
                    "configmaps/argocd-pull-denied-certificates",
                    "-n",
                    "argocd-pull"
                ]
            ),
            "{verb} of the deny list"
        );
    }

    managed_cluster(&hub, "cluster1").await;
    let ns = hub.namespace("team").await.unwrap();
    placement_selects(&client, &ns, &["cluster1"]).await;
    let apps = apps_api(&client, &ns);

    let log = hub.dir().join("hub-controller.log");
    let controller = Binary::start_as(
        &sa,
        &["--sweep-interval=2s"],
        std::fs::File::create(&log).unwrap(),
    );
    wait::until("the controller to lead", TIMEOUT, || async {
        match controller.metric("argocd_pull_hub_leader").await {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Delivery with a sync operation, status back, and a refusal event.
    let extra = json!({
        "finalizers": [keys::RESOURCES_FINALIZER],
        "operation": { "sync": { "revision": "HEAD" } }
    });
    apps.create(
        &PostParams::default(),
        &app(
            "guestbook",
            &ns,
            json!({ keys::MANAGED_CLUSTER: "cluster1" }),
            extra,
        ),
    )
    .await
    .unwrap();
    common::create(&apps, &app_for("lost", &ns, "nowhere")).await;
    let works: Api<ManifestWork> = Api::namespaced(client.clone(), "cluster1");
    let work = format!("{ns}.guestbook");
    wait::exists(&works, &work, TIMEOUT).await;
    feed_back(
        &works,
        &work,
        &ns,
        "guestbook",
        &[("healthStatus", "Healthy"), ("syncStatus", "Synced")],
    )
    .await;
    wait::until(
        "status and the hand-over on the hub copy",
        TIMEOUT,
        || async {
            let a = apps.get("guestbook").await.map_err(|e| e.to_string())?;
            let healthy = a.data.pointer("/status/health/status") == Some(&json!("Healthy"));
            let handed_over = a.data.get("operation").is_none_or(Value::is_null);
            if healthy && handed_over {
                Ok(())
            } else {
                Err(a.data.to_string())
            }
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    wait::warning(
        &events,
        "involvedObject.name=lost",
        "UnknownCluster",
        TIMEOUT,
    )
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "argocd");
    wait::exists(&secrets, "cluster1-cluster-secret", TIMEOUT).await;

    // Deletion: the work goes, then Argo CD's finalizer is released.
    apps.delete("guestbook", &DeleteParams::default())
        .await
        .unwrap();
    wait::gone(&apps, "guestbook", TIMEOUT).await;
    assert!(works.get_opt(&work).await.unwrap().is_none());

    drop(controller);
    issued_certificates_record(&hub, &sa).await;
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the controller hit a permission it does not have:\n{log}"
    );
}

/// The record of issued certificates (`transport::grpc::issued`) with the
/// service account's rights: the CSRs of the signer listed and watched by
/// field selector, the sixteen record ConfigMaps created, watched by name
/// and patched, an Event on a CSR whose certificate is refused.
async fn issued_certificates_record(hub: &Cluster, sa: &Path) {
    use argocd_pull_hub_controller::transport::grpc::identity::IdentityMap;
    use argocd_pull_hub_controller::transport::grpc::issued::{self, Issued, record};
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams};

    let admin = hub.client().await.unwrap();
    let as_sa = testenv::client_for(sa).await.unwrap();
    // A CSR of the signer, approved and signed by hand as an admin (who is
    // not a klusterlet: its certificate is refused).
    let ca = testenv::pki::Ca::new("signing").unwrap();
    let subject = "system:open-cluster-management:cluster:cluster1:addon:argocd-pull:agent:a";
    let pair = ca.client(subject, None).unwrap();
    let key = rcgen::KeyPair::from_pem(&pair.key_pem).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, subject);
    let request = params.serialize_request(&key).unwrap().pem().unwrap();
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": { "name": "by-an-admin", "labels": {
            "open-cluster-management.io/cluster-name": "cluster1" } },
        "spec": { "signerName": argocd_pull_addon::SIGNER_NAME,
                  "request": k8s_openapi::ByteString(request.into_bytes()),
                  "usages": ["client auth"] },
    }))
    .unwrap();
    csrs.create(&PostParams::default(), &csr).await.unwrap();
    csrs.patch_approval(
        "by-an-admin",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "conditions": [{
            "type": "Approved", "status": "True", "reason": "Test", "message": "test" }] } })),
    )
    .await
    .unwrap();
    csrs.patch_status(
        "by-an-admin",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "certificate": k8s_openapi::ByteString(pair.cert_pem.clone().into_bytes()) } })),
    )
    .await
    .unwrap();

    let issued = Issued::new(true, "argocd-pull", IdentityMap::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let reading = tokio::spawn(issued::run(
        issued.clone(),
        as_sa.clone(),
        until(stopped.clone()),
    ));
    let leading = tokio::spawn(issued::lead(issued.clone(), as_sa, until(stopped)));
    tokio::time::timeout(TIMEOUT, issued.wait_loaded())
        .await
        .expect("the record loads with the service account's rights");
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "argocd-pull");
    for i in 0..record::SHARDS {
        let cm = cms.get(&record::shard_name(i)).await.unwrap();
        assert!(
            cm.annotations().contains_key(record::SINCE_ANNOTATION),
            "{cm:?}"
        );
    }
    let events: Api<Event> = Api::namespaced(admin, "default");
    wait::warning(
        &events,
        "involvedObject.name=by-an-admin",
        "CertificateNotRequestedByCluster",
        TIMEOUT,
    )
    .await;
    let _ = stop.send(true);
    let _ = reading.await;
    let _ = leading.await;
}
