//! Proves the harness runs a real Kubernetes control plane: real watches,
//! real status subresources, real CRD schema validation, and a real
//! controller-manager (namespace deletion, service accounts, CSR signing).

use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::ocm::{ManifestWork, ManifestWorkStatus};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use testenv::{CrdSet, shared, wait};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The Kubernetes release pinned in test/tools/kube/go.mod.
fn pinned_version() -> String {
    let gomod = include_str!("../tools/kube/go.mod");
    gomod
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("k8s.io/kubernetes is required in test/tools/kube/go.mod")
        .to_string()
}

async fn hub() -> &'static testenv::Cluster {
    testenv::init_tracing();
    shared("hub", CrdSet::Hub)
        .await
        .expect("hub cluster starts")
}

/// A new namespace named after `prefix` on the hub, and its Applications.
async fn applications_in(prefix: &str) -> (String, Api<Application>) {
    let hub = hub().await;
    let client = hub.client().await.unwrap();
    let ns = hub.namespace(prefix).await.unwrap();
    let apps = Api::namespaced_with(client, &ns, &application_resource());
    (ns, apps)
}

fn application(name: &str, ns: &str) -> Application {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://example.com/repo.git", "path": "guestbook", "targetRevision": "HEAD" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" }
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn serves_the_pinned_kubernetes_release() {
    let hub = hub().await;
    let client = hub.client().await.unwrap();
    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.git_version, pinned_version());
    assert_eq!(hub.version(), pinned_version());
}

#[tokio::test]
async fn watches_an_application_from_creation_to_deletion() {
    let (ns, apps) = applications_in("watch").await;

    let mut stream = apps
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    apps.create(&PostParams::default(), &application("guestbook", &ns))
        .await
        .unwrap();
    let mut labelled = application("guestbook", &ns);
    labelled.metadata.labels = Some([("stage".to_string(), "two".to_string())].into());
    apps.patch(
        "guestbook",
        &PatchParams::apply("test").force(),
        &Patch::Apply(&labelled),
    )
    .await
    .unwrap();
    apps.delete("guestbook", &DeleteParams::default())
        .await
        .unwrap();

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(TIMEOUT, stream.try_next())
            .await
            .expect("watch event in time")
            .unwrap()
            .expect("watch stays open");
        seen.push(match event {
            WatchEvent::Added(a) => ("added", a.metadata.labels.unwrap_or_default().len()),
            WatchEvent::Modified(a) => ("modified", a.metadata.labels.unwrap_or_default().len()),
            WatchEvent::Deleted(a) => ("deleted", a.metadata.labels.unwrap_or_default().len()),
            WatchEvent::Bookmark(_) => continue,
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(seen, [("added", 0), ("modified", 1), ("deleted", 1)]);
}

#[tokio::test]
async fn writes_manifestwork_status_only_through_the_status_subresource() {
    let hub = hub().await;
    let client = hub.client().await.unwrap();
    let ns = hub.namespace("cluster").await.unwrap();
    let works: Api<ManifestWork> = Api::namespaced(client, &ns);

    let work: ManifestWork = serde_json::from_value(json!({
        "apiVersion": "work.open-cluster-management.io/v1",
        "kind": "ManifestWork",
        "metadata": { "name": "app-1", "namespace": ns },
        "spec": { "workload": { "manifests": [
            { "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "cm", "namespace": "default" } }
        ]}}
    }))
    .unwrap();
    works.create(&PostParams::default(), &work).await.unwrap();

    let applied = Condition {
        type_: "Applied".into(),
        status: "True".into(),
        reason: "AppliedManifestWorkComplete".into(),
        message: "Apply manifest work complete".into(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ),
        observed_generation: Some(1),
    };
    let status = ManifestWorkStatus {
        conditions: Some(vec![applied.clone()]),
        ..Default::default()
    };
    // A status sent with the main resource is dropped by the server...
    let mut with_status = work.clone();
    with_status.status = Some(status.clone());
    works
        .patch(
            "app-1",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&with_status),
        )
        .await
        .unwrap();
    assert!(
        works
            .get("app-1")
            .await
            .unwrap()
            .status
            .is_none_or(|s| s.conditions.is_none())
    );

    // ...and kept when written through /status, as the work agent does.
    works
        .patch_status(
            "app-1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
    let got = works.get("app-1").await.unwrap();
    let conditions = got.status.unwrap().conditions.unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].type_, "Applied");
    assert_eq!(conditions[0].reason, "AppliedManifestWorkComplete");
}

#[tokio::test]
async fn rejects_an_application_that_violates_the_crd_schema() {
    let (ns, apps) = applications_in("schema").await;

    let mut bad = application("bad", &ns);
    // spec.destination must be an object.
    bad.data["spec"]["destination"] = json!("not-an-object");
    let err = apps.create(&PostParams::default(), &bad).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains("spec.destination"),
        "{}",
        status.message
    );

    // ...and a missing required field (spec) too.
    let mut no_spec = application("no-spec", &ns);
    no_spec.data.as_object_mut().unwrap().remove("spec");
    let err = apps
        .create(&PostParams::default(), &no_spec)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );
}

#[tokio::test]
async fn controller_manager_deletes_namespaces_and_creates_service_accounts() {
    let hub = hub().await;
    let client = hub.client().await.unwrap();
    let ns = hub.namespace("kcm").await.unwrap();

    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    wait::until("the default service account", TIMEOUT, || async {
        sas.get("default").await
    })
    .await;

    let apps: Api<Application> = Api::namespaced_with(client.clone(), &ns, &application_resource());
    apps.create(&PostParams::default(), &application("doomed", &ns))
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    // The namespace controller must empty it (custom resources included)
    // before the namespace goes away.
    wait::until("the namespace to be deleted", TIMEOUT, || async {
        match namespaces.get_opt(&ns).await {
            Ok(None) => Ok(()),
            Ok(Some(n)) => Err(format!("phase {:?}", n.status.and_then(|s| s.phase))),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

#[tokio::test]
async fn controller_manager_signs_approved_client_csrs() {
    let hub = hub().await;
    let client = hub.client().await.unwrap();

    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "csr-test-user");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "csr-test-group");
    let request = params.serialize_request(&key).unwrap().pem().unwrap();

    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let name = format!("csr-test-{}", std::process::id());
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(request.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["client auth".into(), "digital signature".into()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        status: None,
    };
    csrs.create(&PostParams::default(), &csr).await.unwrap();
    let approval = CertificateSigningRequest {
        status: Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some("Test".into()),
                message: Some("approved by the harness test".into()),
                ..Default::default()
            }]),
            certificate: None,
        }),
        ..csr
    };
    csrs.replace_subresource("approval", &name, &PostParams::default(), &approval)
        .await
        .unwrap();

    let cert = wait::until("the CSR to be signed", TIMEOUT, || async {
        let got = csrs.get(&name).await.map_err(|e| e.to_string())?;
        got.status
            .and_then(|s| s.certificate)
            .filter(|c| !c.0.is_empty())
            .ok_or_else(|| "not signed yet".to_string())
    })
    .await;

    // The signed certificate authenticates against the same API server.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let identity = testenv::pki::CertKey {
        cert_pem: String::from_utf8(cert.0).unwrap(),
        key_pem: key.serialize_pem(),
    };
    hub.write_kubeconfig_for(&identity, &kubeconfig).unwrap();
    let user_client = testenv::client_for(&kubeconfig).await.unwrap();
    let review: serde_json::Value = user_client
        .request(
            http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
                .header("content-type", "application/json")
                .body(
                    serde_json::to_vec(&json!({
                        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"
                    }))
                    .unwrap(),
                )
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(review["status"]["userInfo"]["username"], "csr-test-user");
    assert!(
        review["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("csr-test-group"))
    );
}
