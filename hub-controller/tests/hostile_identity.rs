//! A cluster may speak only for itself, against real
//! OCM: an admin of cluster2, holding its klusterlet's real hub
//! credentials, files a CSR of the addon's signer whose subject names
//! cluster1. OCM v1.2.1's addon-manager approves and signs it (shown
//! here). The hub-controller refuses the certificate, naming the
//! requester: a raw client and a real spoke-agent on cluster2 holding it
//! are never taken for cluster1, cluster1's agent stays connected and
//! cluster1's Applications never reach cluster2; the refusal is logged
//! with the requester, counted, and the CSR gets a Warning Event. The real
//! agents' certificates, issued on their own requests, are accepted, also
//! by a restarted hub-controller once their CSRs are gone (the record
//! survives), and by a second replica that never led nor saw a CSR, which
//! refuses the forged one as the first does. Fixtures: `common/addon.rs`.

use argocd_pull_apis::keys;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use testenv::pki::CertKey;
use testenv::{paths, wait};
use tonic::Code;

mod common;
use common::addon::{
    AGENT_NS, AddonHub, Agent, SPOKE_NS, TIMEOUT, agent_holding, agent_subject, client_cert,
    fingerprint_of, hub_ca, run, secret_text, subject_of,
};
use common::apps_api;
use common::grpc_client::{hello, open};

/// A key and a CSR (PEM) for `subject`, as the klusterlet makes them.
fn key_and_request(subject: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, subject);
    let request = params.serialize_request(&key).unwrap();
    (key.serialize_pem(), request.pem().unwrap())
}

/// Opens a stream with `identity` until the hub answers for good (a
/// refusal that says "try again" is retried): the final refusal.
async fn refusal(address: &str, ca: &str, identity: &CertKey) -> tonic::Status {
    wait::until("the hub's answer to the certificate", TIMEOUT, || async {
        match open(address, ca, identity, hello(1, 1)).await {
            Ok((_, _, welcome)) => panic!(
                "the hub accepted a certificate issued on cluster2's request for cluster1: {welcome:?}"
            ),
            Err(s) if s.code() == Code::Unavailable => Err(s.message().to_string()),
            Err(s) => Ok(s),
        }
    })
    .await
}

/// The value of the refusals counted for `reason`, whatever the other labels.
async fn refused_total(hub: &AddonHub, reason: &str) -> f64 {
    let needle = format!("reason=\"{reason}\"");
    hub.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("argocd_pull_hub_grpc_refused_total{") && l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_requested_by_another_cluster_is_refused() {
    testenv::init_tracing();
    let mut hub = AddonHub::start().await;
    let fleet = hub.fleet;
    hub.clusteradm_addon("enable", "cluster1,cluster2").await;
    // The real agents, with certificates issued on their own requests, are
    // accepted (`agents_deployed_and_connected` checks the hub logged each
    // connected with the certificate in its pod's Secret).
    let agents = hub.agents_deployed_and_connected().await;
    let team = fleet.hub.cluster().namespace("team").await.unwrap();
    hub.deliver_over_grpc(&team).await;

    // ---- cluster2's admin, with its klusterlet's hub credentials, asks
    // for cluster1's agent identity.
    let klusterlet = fleet
        .cluster("cluster2")
        .dir()
        .join("klusterlet/hub-kubeconfig/kubeconfig");
    let kubectl = paths::bin_dir().join("kubectl");
    let whoami = run(
        &kubectl,
        &[
            "--kubeconfig",
            klusterlet.to_str().unwrap(),
            "auth",
            "whoami",
        ],
    )
    .await;
    assert!(
        whoami.contains("system:open-cluster-management:cluster2:"),
        "the klusterlet's hub identity: {whoami}"
    );
    let (key_pem, request_pem) = key_and_request(&agent_subject("cluster1"));
    let csr_file = hub.fleet.cluster("cluster2").dir().join("forged-csr.yaml");
    let b64 = serde_json::to_value(k8s_openapi::ByteString(request_pem.into_bytes())).unwrap();
    std::fs::write(
        &csr_file,
        serde_json::json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            // OCM's addon-manager looks only at CSRs named `addon*`.
            "metadata": {
                "name": "addon-cluster2-argocd-pull-forged",
                "labels": {
                    "open-cluster-management.io/cluster-name": "cluster2",
                    "open-cluster-management.io/addon-name": keys::ADDON_NAME,
                },
            },
            "spec": {
                "signerName": argocd_pull_addon::SIGNER_NAME,
                "request": b64,
                "usages": ["digital signature", "key encipherment", "client auth"],
            },
        })
        .to_string(),
    )
    .unwrap();
    run(
        &kubectl,
        &[
            "--kubeconfig",
            klusterlet.to_str().unwrap(),
            "create",
            "-f",
            csr_file.to_str().unwrap(),
        ],
    )
    .await;
    // OCM approves and signs it, with the subject asked for.
    let csrs: Api<CertificateSigningRequest> = Api::all(hub.client.clone());
    let signed = wait::until("OCM to sign the forged CSR", TIMEOUT, || async {
        let csr = csrs
            .get("addon-cluster2-argocd-pull-forged")
            .await
            .map_err(|e| e.to_string())?;
        csr.status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .map(|c| (String::from_utf8_lossy(&c.0).into_owned(), csr.spec.clone()))
            .ok_or_else(|| format!("{:?}", csr.status))
    })
    .await;
    let (cert_pem, spec) = signed;
    assert_eq!(subject_of(&cert_pem), agent_subject("cluster1"));
    let requester = spec.username.unwrap_or_default();
    assert!(
        requester.starts_with("system:open-cluster-management:cluster2:"),
        "the API server recorded the requester: {requester}"
    );
    let forged = CertKey { cert_pem, key_pem };
    let forged_fp = fingerprint_of(&forged.cert_pem);
    let address = format!("https://{}", hub.grpc);
    let ca = hub_ca(hub.fleet, "cluster2").await;

    // ---- A raw client with it: refused, naming the requester.
    let status = refusal(&address, &ca, &forged).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let message = status.message();
    assert!(
        message.contains("names cluster cluster1")
            && message.contains("requested by cluster cluster2's klusterlet")
            && message.contains(&requester),
        "{message}"
    );
    // Logged with the requester, counted without a cluster's name, and a
    // Warning Event on the CSR.
    let line = wait::until("the hub's log of the refusal", TIMEOUT, || async {
        let log = hub.hub_log();
        log.lines()
            .find(|l| {
                l.contains(
                    "refused an agent: its certificate was not issued on the cluster's own request",
                ) && l.contains(&forged_fp)
            })
            .map(str::to_string)
            .ok_or(())
    })
    .await;
    assert!(
        line.contains(&format!("requester={requester}"))
            && line.contains("cluster=cluster1")
            && line.contains("reason=\"certificate-not-requested-by-cluster\""),
        "{line}"
    );
    println!("the hub's refusal: {line}");
    assert!(refused_total(&hub, "certificate-not-requested-by-cluster").await >= 1.0);
    assert!(
        !hub.metrics()
            .await
            .lines()
            .any(|l| l.starts_with("argocd_pull_hub_grpc_refused_total{cluster=\"cluster1\"")),
        "a refusal of an unvouched name became cluster1's series"
    );
    let events: Api<Event> = Api::namespaced(hub.client.clone(), "default");
    let note = wait::warning(
        &events,
        "involvedObject.name=addon-cluster2-argocd-pull-forged",
        "CertificateNotRequestedByCluster",
        TIMEOUT,
    )
    .await
    .message
    .unwrap_or_default();
    assert!(
        note.contains(&requester) && note.contains("cluster1"),
        "{note}"
    );

    // ---- A real spoke-agent on cluster2 holding it, as in the issue: it
    // is refused on every attempt and creates nothing of cluster1's there.
    let spoke2 = fleet.cluster("cluster2");
    let dir = tempfile::tempdir().unwrap();
    let (pod, config) = agent_holding(spoke2, dir.path(), &address, &forged).await;
    let before = refused_total(&hub, "certificate-not-requested-by-cluster").await;
    let impostor = Agent::start(config, &pod.kubeconfig).await;
    wait::until("three refusals of the impostor", TIMEOUT, || async {
        let now = refused_total(&hub, "certificate-not-requested-by-cluster").await;
        if now >= before + 3.0 {
            Ok(())
        } else {
            Err(now - before)
        }
    })
    .await;
    assert!(!impostor.connected());
    impostor.stop().await;
    // cluster1's agent was never replaced, and still carries status.
    hub.hub_sees_connected("cluster1", true).await;
    assert!(agents[0].now().await.unwrap().connected);
    hub.status_reaches_hub(&team, "cluster1", "Progressing")
        .await;
    let log = hub.hub_log();
    assert!(
        !log.lines()
            .any(|l| l.contains("agent connected") && l.contains(&forged_fp)),
        "the forged certificate connected:\n{log}"
    );
    assert!(
        !log.contains("replaced by a newer connection"),
        "cluster1's agent was replaced:\n{log}"
    );
    let spoke2_apps = apps_api(&spoke2.client().await.unwrap(), SPOKE_NS);
    assert!(
        spoke2_apps
            .get_opt("guestbook-cluster1")
            .await
            .unwrap()
            .is_none(),
        "cluster1's Application reached cluster2"
    );

    // ---- The record survives: the CSRs are deleted (as Kubernetes does
    // after an hour) and the hub-controller restarted; the real agents'
    // certificates are still accepted, the forged one still refused.
    let spoke1_secrets: Api<Secret> =
        Api::namespaced(fleet.cluster("cluster1").client().await.unwrap(), AGENT_NS);
    let issued1 = client_cert(
        &spoke1_secrets
            .get(&argocd_pull_addon::client_cert_secret())
            .await
            .unwrap(),
    );
    for csr in csrs.list(&ListParams::default()).await.unwrap().items {
        if csr.spec.signer_name == argocd_pull_addon::SIGNER_NAME {
            csrs.delete(&csr.metadata.name.unwrap(), &DeleteParams::default())
                .await
                .unwrap();
        }
    }
    hub.restart().await;
    hub.connected_with("cluster1", &issued1).await;
    hub.hub_sees_connected("cluster2", true).await;
    hub.status_reaches_hub(&team, "cluster1", "Healthy").await;
    let status = match open(&address, &ca, &forged, hello(1, 1)).await {
        Ok((_, _, welcome)) => {
            panic!("the restarted hub accepted the forged certificate: {welcome:?}")
        }
        Err(s) => s,
    };
    assert!(
        status.message().contains(&forged_fp) && status.code() != Code::Ok,
        "{status:?}"
    );
    let log = hub.hub_log();
    assert!(
        !log.contains("the upgrade grace"),
        "the restarted hub let a certificate in under the grace:\n{log}"
    );
    // The record itself, as an operator reads it.
    let records =
        Api::<ConfigMap>::namespaced(hub.client.clone(), argocd_pull_addon::HUB_NAMESPACE)
            .list(&ListParams::default().labels("argocd-pull.io/issued-certificates"))
            .await
            .unwrap();
    assert_eq!(records.items.len(), 16);
    let recorded: Vec<String> = records
        .items
        .into_iter()
        .flat_map(|cm| cm.data.unwrap_or_default().into_keys())
        .collect();
    assert!(recorded.contains(&fingerprint_of(&issued1)), "{recorded:?}");
    assert!(!recorded.contains(&forged_fp), "{recorded:?}");

    // ---- A second replica that never led and never saw a CSR (another
    // replica holds the leader Lease): it judges from the record alone,
    // as the first does.
    let leases: Api<Lease> = Api::namespaced(hub.client.clone(), argocd_pull_addon::HUB_NAMESPACE);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    leases
        .patch(
            argocd_pull_hub_controller::LEASE_NAME,
            &PatchParams::apply("another-replica").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": argocd_pull_hub_controller::LEASE_NAME },
                "spec": { "holderIdentity": "another-replica", "leaseDurationSeconds": 3600,
                          "acquireTime": now, "renewTime": now },
            })),
        )
        .await
        .unwrap();
    let (follower, follower_grpc, _files) = hub.replica("follower").await;
    let follower_address = format!("https://{follower_grpc}");
    let key1 = secret_text(
        &spoke1_secrets
            .get(&argocd_pull_addon::client_cert_secret())
            .await
            .unwrap(),
        "tls.key",
    );
    let real1 = CertKey {
        cert_pem: issued1.clone(),
        key_pem: key1,
    };
    let welcome = wait::until(
        "the follower to welcome cluster1's certificate",
        TIMEOUT,
        || async {
            open(&follower_address, &ca, &real1, hello(1, 1))
                .await
                .map(|(_, _, welcome)| welcome)
                .map_err(|s| format!("{s:?}"))
        },
    )
    .await;
    assert!(
        matches!(
            welcome.kind,
            Some(argocd_pull_proto::v1::hub_message::Kind::Welcome(_))
        ),
        "{welcome:?}"
    );
    let status = match open(&follower_address, &ca, &forged, hello(1, 1)).await {
        Ok((_, _, welcome)) => panic!("the follower accepted the forged certificate: {welcome:?}"),
        Err(s) => s,
    };
    assert!(
        status.message().contains(&forged_fp) && status.code() != Code::Ok,
        "{status:?}"
    );
    // It never led: the record it read was written by the other.
    let lease = leases
        .get(argocd_pull_hub_controller::LEASE_NAME)
        .await
        .unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("another-replica")
    );
    drop(follower);
}
