//! The addon's life cycle against real OCM, with the commands of
//! docs/addon.md: installed on every cluster a Placement selects (OCM's
//! addon-manager creates the ManagedClusterAddOns, no `clusteradm addon
//! enable`), then what the OCM-issued certificates may not do (another
//! cluster's Applications, an expired certificate signed by the CA OCM signs
//! with), then uninstalled: the agents go, the Applications fall back to
//! ManifestWorks and nothing is deleted on the managed clusters. One fleet,
//! phases in order; the agents run as the pods OCM deploys on each
//! cluster's real node (fixtures, and the one step that runs an agent in
//! the test process: `common/addon.rs`).

use std::time::{Duration, SystemTime};

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{
    AddOnDeploymentConfig, AddOnTemplate, ClusterManagementAddOn, ManagedClusterAddOn,
    decided_clusters, placement_decision_resource,
};
use argocd_pull_proto::digest::{BUCKETS, Entries, resync_requests};
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, DigestSet, Gone, HubMessage, ObjectAck, ObjectKey, StatusReport,
    agent_message, hub_message, status_report,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use testenv::pki::CertKey;
use testenv::wait;
use tonic::Streaming;

mod common;
use common::addon::{
    AGENT, AGENT_NS, AddonHub, Agent, CLUSTERS, SPOKE_NS, TIMEOUT, agent_holding, agent_subject,
    doc_commands, hub_app_shows, hub_ca, secret_text, sh, subject_of,
};
use common::apps_api;
use common::grpc_client::{any_next, hello, next, open, refused, report};
use common::logs;

const DOC: &str = "docs/addon.md";
/// The Placement docs/addon.md installs the addon with.
const PLACEMENT_NS: &str = argocd_pull_addon::HUB_NAMESPACE;
const PLACEMENT: &str = "all-clusters";

/// Whether `live` has every field `expected` has, with the same values
/// (lists: element by element).
fn contains(live: &Value, expected: &Value) -> bool {
    match (live, expected) {
        (Value::Object(l), Value::Object(e)) => e
            .iter()
            .all(|(k, v)| l.get(k).is_some_and(|lv| contains(lv, v))),
        (Value::Array(l), Value::Array(e)) => {
            l.len() == e.len() && l.iter().zip(e).all(|(lv, v)| contains(lv, v))
        }
        _ => live == expected,
    }
}

/// Waits until `name` is gone.
async fn gone<K>(api: Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait::gone(&api, name, TIMEOUT).await;
}

fn spoke_key(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: SPOKE_NS.into(),
        name: name.into(),
    }
}

/// Reads what the hub sends until the acknowledgement of the report of
/// `name`, failing on anything that names another cluster's Application.
async fn ack_of(inbound: &mut Streaming<HubMessage>, name: &str) -> ObjectAck {
    loop {
        let m = next(inbound).await.unwrap();
        never_cluster2(&m);
        if let Some(hub_message::Kind::ObjectAck(ack)) = m.kind
            && ack.key.as_ref().is_some_and(|k| k.name == name)
        {
            return ack;
        }
    }
}

/// Fails if the hub sent cluster1's identity anything of cluster2's.
fn never_cluster2(m: &HubMessage) {
    let text = format!("{m:?}");
    let leaked = match &m.kind {
        Some(hub_message::Kind::Upsert(u)) => {
            String::from_utf8_lossy(&u.application_json).contains("cluster2")
                || text.contains("guestbook-cluster2")
        }
        Some(hub_message::Kind::Delete(_) | hub_message::Kind::Operation(_)) => {
            text.contains("guestbook-cluster2")
        }
        _ => false,
    };
    assert!(!leaked, "the hub sent cluster1's agent cluster2's: {text}");
}

/// A client certificate for `user` signed by the CA `ca` (an RSA key, as
/// the signing CA the hub-controller keeps for OCM), valid from `from`
/// until `until`.
fn signed_by(ca: &CertKey, user: &str, from: SystemTime, until: SystemTime) -> CertKey {
    use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose};
    let ca_key = rcgen::KeyPair::from_pem_and_sign_algo(&ca.key_pem, &rcgen::PKCS_RSA_SHA256)
        .expect("the signing CA's key is RSA, PKCS#8");
    // The issuer is named exactly as the CA's certificate names itself.
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).unwrap();
    let ca_cert = pem.parse_x509().unwrap();
    let mut ca_name = DistinguishedName::new();
    for attr in ca_cert.subject().iter_attributes() {
        let oid: Vec<u64> = attr.attr_type().iter().unwrap().collect();
        ca_name.push(DnType::from_oid(&oid), attr.as_str().unwrap());
    }
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = ca_name;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, user);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let since = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    params.not_before = epoch + since(from);
    params.not_after = epoch + since(until);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    CertKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn placements_install_certificate_refusals_and_uninstall() {
    let logs = logs::capture();
    let hub = AddonHub::start().await;
    let client = &hub.client;
    let fleet = hub.fleet;

    // ---- Install on every cluster a Placement selects, as documented.
    sh(&doc_commands(DOC, "install-placements"), &hub.kubeconfig).await;
    let cma = Api::<ClusterManagementAddOn>::all(client.clone())
        .get(keys::ADDON_NAME)
        .await
        .unwrap();
    let rendered = argocd_pull_addon::placements_strategy(PLACEMENT_NS, PLACEMENT);
    assert!(
        contains(&serde_json::to_value(&cma).unwrap(), &rendered),
        "the documented patch is not what placements_strategy renders: {rendered} vs {:?}",
        cma.spec
    );
    // OCM's placement controller selects both clusters...
    let decisions: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), PLACEMENT_NS, &placement_decision_resource());
    wait::until("the Placement to select both clusters", TIMEOUT, || async {
        let list = decisions
            .list(&ListParams::default().labels(&format!("{}={PLACEMENT}", keys::PLACEMENT_LABEL)))
            .await
            .map_err(|e| e.to_string())?;
        let mut clusters: Vec<String> = list.items.iter().flat_map(decided_clusters).collect();
        clusters.sort();
        wait::equal(clusters, CLUSTERS)
    })
    .await;
    // ...and OCM's addon-manager creates their ManagedClusterAddOns, owned
    // by the ClusterManagementAddOn; nobody ran `clusteradm addon enable`.
    for cluster in CLUSTERS {
        let mcas: Api<ManagedClusterAddOn> = Api::namespaced(client.clone(), cluster);
        let mca = wait::exists(&mcas, keys::ADDON_NAME, TIMEOUT).await;
        let owners = mca.metadata.owner_references.unwrap_or_default();
        assert!(
            owners.iter().any(|o| o.kind == "ClusterManagementAddOn"
                && o.name == keys::ADDON_NAME
                && o.controller == Some(true)),
            "{cluster}'s ManagedClusterAddOn: {owners:?}"
        );
    }
    let agents = hub.agents_deployed_and_connected().await;
    let team = fleet.hub.cluster().namespace("team").await.unwrap();
    let hub_apps = apps_api(client, &team);
    let spoke_uids = hub.deliver_over_grpc(&team).await;

    // ---- cluster1's certificate, as OCM issued it, and cluster2's
    // Applications. cluster1's agent is down meanwhile (the hub takes one
    // stream per cluster: ours would replace it, and its reconnect ours).
    agents[0].hold().await;
    agents[0]
        .shows("cluster1's agent stopped", |s| !s.running)
        .await;
    hub.hub_sees_connected("cluster1", false).await;
    let spoke1 = fleet.cluster("cluster1");
    let spoke1_client = spoke1.client().await.unwrap();
    let issued = Api::<Secret>::namespaced(spoke1_client.clone(), AGENT_NS)
        .get(&argocd_pull_addon::client_cert_secret())
        .await
        .unwrap();
    let cluster1 = CertKey {
        cert_pem: secret_text(&issued, "tls.crt"),
        key_pem: secret_text(&issued, "tls.key"),
    };
    assert_eq!(subject_of(&cluster1.cert_pem), agent_subject("cluster1"));
    // The hub's CA as the agents get it.
    let hub_ca = hub_ca(fleet, "cluster1").await;
    let address = format!("https://{}", hub.grpc);
    let sent_to_cluster2 = || async {
        let mut sent = Vec::new();
        for kind in ["upsert", "delete", "operation"] {
            sent.push(
                hub.series(&format!(
                    "argocd_pull_hub_grpc_messages_total{{cluster=\"cluster2\",direction=\"out\",kind=\"{kind}\"}}"
                ))
                .await,
            );
        }
        sent
    };
    let sent_before = sent_to_cluster2().await;
    let (tx, mut inbound, welcome) = open(&address, &hub_ca, &cluster1, hello(1, 1))
        .await
        .expect("cluster1's OCM-issued certificate is accepted");
    assert!(
        matches!(welcome.kind, Some(hub_message::Kind::Welcome(_))),
        "{welcome:?}"
    );

    // Reading: what the hub holds for this identity is cluster1's one
    // Application (its digest counts it)...
    loop {
        let m = any_next(&mut inbound).await.unwrap();
        never_cluster2(&m);
        if let Some(hub_message::Kind::Digest(d)) = m.kind {
            assert_eq!(d.set, DigestSet::Desired as i32);
            assert_eq!(
                d.count, 1,
                "the hub desires more than cluster1's one Application"
            );
            break;
        }
    }
    // ...and asked for everything, it sends that one, nothing of cluster2's.
    let all: Vec<u32> = (0..BUCKETS).collect();
    for r in resync_requests(DigestSet::Desired, &Entries::new(), &all) {
        tx.send(AgentMessage {
            kind: Some(agent_message::Kind::ResyncRequest(r)),
        })
        .await
        .unwrap();
    }
    loop {
        let m = next(&mut inbound).await.unwrap();
        never_cluster2(&m);
        if let Some(hub_message::Kind::Upsert(u)) = &m.kind
            && u.key == Some(spoke_key("guestbook-cluster1"))
        {
            break;
        }
    }

    // Writing: a status for cluster2's Application is refused...
    let forged = serde_json::to_vec(&json!({ "health": { "status": "Missing" } })).unwrap();
    tx.send(report(spoke_key("guestbook-cluster2"), 1, forged.clone()))
        .await
        .unwrap();
    let ack = ack_of(&mut inbound, "guestbook-cluster2").await;
    assert_eq!(ack.outcome, AckOutcome::Rejected as i32, "{ack:?}");
    assert!(
        ack.message
            .contains("not an Application the hub delivers to cluster cluster1"),
        "{ack:?}"
    );
    // ...and so is saying it is gone, in effect: it is cluster1's
    // bookkeeping that hears it, and cluster2's Application stays.
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Status(StatusReport {
            key: Some(spoke_key("guestbook-cluster2")),
            seq: 2,
            state: Some(status_report::State::Gone(Gone {
                uid: spoke_uids[1].clone(),
            })),
            trace_parent: String::new(),
        })),
    })
    .await
    .unwrap();
    ack_of(&mut inbound, "guestbook-cluster2").await;
    // The same certificate writes cluster1's own status: the refusal is
    // about the cluster, not the certificate.
    let own = serde_json::to_vec(&json!({ "health": { "status": "Degraded" } })).unwrap();
    tx.send(report(spoke_key("guestbook-cluster1"), 3, own))
        .await
        .unwrap();
    let ack = ack_of(&mut inbound, "guestbook-cluster1").await;
    assert_eq!(ack.outcome, AckOutcome::Applied as i32, "{ack:?}");
    hub_app_shows(&hub_apps, "guestbook-cluster1", "Degraded").await;
    drop((tx, inbound));
    // cluster2's Application: untouched on the hub and on cluster2, still
    // served by cluster2's agent. Checked once a status change from
    // cluster2 has come all the way to the hub after the forgeries: the hub
    // has sent cluster2's agent nothing that changes it meanwhile.
    hub.revision_reaches_hub(&team, "cluster2", "after-the-forgeries")
        .await;
    assert_eq!(
        sent_to_cluster2().await,
        sent_before,
        "(upserts, deletes, operations) the hub sent cluster2's agent"
    );
    let hub2 = hub_apps.get("guestbook-cluster2").await.unwrap();
    assert_eq!(hub2.data["status"]["health"]["status"], "Healthy");
    let spoke2 = apps_api(&fleet.cluster("cluster2").client().await.unwrap(), SPOKE_NS);
    let app2 = spoke2.get("guestbook-cluster2").await.unwrap();
    assert_eq!(app2.metadata.uid.as_deref(), Some(spoke_uids[1].as_str()));
    assert!(agents[1].now().await.unwrap().connected);
    assert!(
        hub.hub_log()
            .lines()
            .any(|l| l.contains("refused a status report")
                && l.contains("cluster=cluster1")
                && l.contains("name=guestbook-cluster2")),
        "{}",
        hub.hub_log()
    );

    // ---- An expired certificate signed by the CA OCM signs with (the
    // Secret the hub-controller keeps), for cluster1's identity.
    let signing = Api::<Secret>::namespaced(client.clone(), argocd_pull_addon::HUB_NAMESPACE)
        .get(argocd_pull_addon::SIGNING_CA_SECRET)
        .await
        .unwrap();
    let signing_ca = CertKey {
        cert_pem: secret_text(&signing, "tls.crt"),
        key_pem: secret_text(&signing, "tls.key"),
    };
    let day = Duration::from_secs(24 * 3600);
    let now = SystemTime::now();
    let expired = signed_by(
        &signing_ca,
        &agent_subject("cluster1"),
        now - 2 * day,
        now - day,
    );
    // The hub refuses it in the handshake and says so, naming the cluster.
    refused(open(&address, &hub_ca, &expired, hello(1, 1)).await);
    wait::until(
        "the hub's log of the expired certificate",
        TIMEOUT,
        || async {
            let log = hub.hub_log();
            let line = log.lines().find(|l| {
                l.contains("refused an agent's client certificate")
                    && l.contains("cluster=cluster1")
                    && l.to_lowercase().contains("expired")
            });
            line.map(str::to_string).ok_or(log)
        },
    )
    .await;
    // Counted without the name: the handshake verified nothing.
    assert!(
        hub.metrics().await.lines().any(|l| l.starts_with(
            "argocd_pull_hub_grpc_refused_total{cluster=\"unverified\",reason=\"certificate-expired\"}"
        )),
        "no expired refusal counted"
    );
    // The same CA's certificate, valid, but signed outside OCM's CSR flow:
    // the CA's signature alone is not enough, the hub never saw it issued
    // on cluster1's own request (`hostile_identity.rs` for the forged CSR).
    let valid = signed_by(
        &signing_ca,
        &agent_subject("cluster1"),
        now - Duration::from_secs(150),
        now + day,
    );
    let status = refused(open(&address, &hub_ca, &valid, hello(1, 1)).await);
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .contains("not issued on a request by cluster cluster1's own OCM identity"),
        "{status:?}"
    );
    // cluster1's agent, as deployed, holding the expired certificate:
    // it does not dial with it, and says why.
    let dir = tempfile::tempdir().unwrap();
    let (pod, config) = agent_holding(spoke1, dir.path(), &address, &expired).await;
    let refusals = || {
        hub.hub_log()
            .lines()
            .filter(|l| l.contains("refused an agent's client certificate"))
            .count()
    };
    let refused_before = refusals();
    let stale = Agent::start(config, &pod.kubeconfig).await;
    let said = wait::until(
        "the agent's log of its expired certificate",
        TIMEOUT,
        || async {
            let lines = logs.matching(&[
                "no connection to the hub",
                "cluster=cluster1",
                "expired at",
                "waiting for a renewed one",
            ]);
            lines.into_iter().next().ok_or("not yet")
        },
    )
    .await;
    assert!(said.contains(&agent_subject("cluster1")), "{said}");
    // It keeps trying, and each time refuses to dial with it: three
    // attempts (two reconnects, each after a delay of up to 2 s), every one
    // ended by the expiry, none reaching the hub.
    wait::until(
        "the agent's third attempt, refused for the expiry",
        TIMEOUT,
        || async {
            let expired = logs
                .matching(&["no connection to the hub", "cluster=cluster1", "expired at"])
                .len();
            let reconnects = stale.metrics.reconnects.get();
            if reconnects >= 2 && expired >= 3 {
                Ok(())
            } else {
                Err(format!(
                    "{reconnects} reconnects, {expired} logged expiries"
                ))
            }
        },
    )
    .await;
    assert!(!stale.connected());
    stale.stop().await;
    assert_eq!(refusals(), refused_before, "{}", hub.hub_log());

    // cluster1's agent comes back, and the hub copy back to the spoke's
    // truth (the observed digests differ, the agent reports again).
    agents[0].resume().await;
    agents[0]
        .shows("cluster1's agent connected again", |s| s.connected)
        .await;
    hub.hub_sees_connected("cluster1", true).await;
    hub_app_shows(&hub_apps, "guestbook-cluster1", "Healthy").await;

    // ---- Uninstall, as documented.
    sh(&doc_commands(DOC, "uninstall"), &hub.kubeconfig).await;
    for (i, cluster) in CLUSTERS.iter().enumerate() {
        agents[i]
            .shows(&format!("{cluster}'s agent pod removed by OCM"), |s| {
                !s.running
            })
            .await;
        hub.hub_sees_connected(cluster, false).await;
        gone(
            Api::<ManagedClusterAddOn>::namespaced(client.clone(), cluster),
            keys::ADDON_NAME,
        )
        .await;
        hub.fell_back_to_manifest_work(&team, cluster, &spoke_uids[i])
            .await;
        // The agent's namespace and RBAC go with the deploy work; the Argo
        // CD namespace and its Applications stay.
        let spoke = fleet.cluster(cluster).client().await.unwrap();
        gone(Api::<Namespace>::all(spoke.clone()), AGENT_NS).await;
        gone(Api::<ClusterRole>::all(spoke.clone()), AGENT).await;
        for mode in ["managed", "autonomous"] {
            gone(
                Api::<Role>::namespaced(spoke.clone(), SPOKE_NS),
                &format!("{AGENT}-{mode}"),
            )
            .await;
        }
    }
    // Nothing of the addon is left on the hub, and the hub-controller,
    // which keeps checking its certificates (and setting HUB_CA on every
    // AddOnDeploymentConfig it lists), does not bring the
    // AddOnDeploymentConfig back: checked after two more of its passes
    // have listed them, so that one ran whole after the deletion.
    let hub_ns = argocd_pull_addon::HUB_NAMESPACE;
    gone(
        Api::<ClusterManagementAddOn>::all(client.clone()),
        keys::ADDON_NAME,
    )
    .await;
    gone(Api::<AddOnTemplate>::all(client.clone()), keys::ADDON_NAME).await;
    let configs = Api::<AddOnDeploymentConfig>::namespaced(client.clone(), hub_ns);
    gone(configs.clone(), argocd_pull_addon::DEPLOYMENT_CONFIG).await;
    const LISTS: &str = "argocd_pull_hub_api_requests_total{verb=\"list\",resource=\"addondeploymentconfigs\",code=\"200\"}";
    let writes = || async {
        let mut n = 0.0;
        for verb in ["create", "update", "patch"] {
            for code in ["200", "201"] {
                n += hub
                    .series(&format!(
                        "argocd_pull_hub_api_requests_total{{verb=\"{verb}\",resource=\"addondeploymentconfigs\",code=\"{code}\"}}"
                    ))
                    .await;
            }
        }
        n
    };
    let (lists_before, writes_before) = (hub.series(LISTS).await, writes().await);
    wait::until(
        "two more certificate passes listing the AddOnDeploymentConfigs",
        TIMEOUT,
        || async {
            let lists = hub.series(LISTS).await;
            if lists >= lists_before + 2.0 {
                Ok(())
            } else {
                Err(format!("{lists} lists, {lists_before} before"))
            }
        },
    )
    .await;
    assert_eq!(
        writes().await,
        writes_before,
        "the hub-controller wrote an AddOnDeploymentConfig after the uninstall"
    );
    let left = common::names(&configs).await.unwrap();
    assert!(left.is_empty(), "AddOnDeploymentConfigs back: {left:?}");
    // Status still comes back, now through the work agent's feedback.
    for cluster in CLUSTERS {
        hub.status_reaches_hub(&team, cluster, "Suspended").await;
    }
}
