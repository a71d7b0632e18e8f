//! The client's limits against a real API server: Lease requests (leader
//! election, the replicas' presence and claims) pass a rate limit that
//! holds everything else back, so a replica busy with its own writes still
//! renews its leases in time.

use std::time::Duration;

use argocd_pull_runtime::client::{ApiLayer, ApiMetrics, Limits, build};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use testenv::CrdSet;

#[tokio::test]
async fn leases_pass_a_rate_limit_that_holds_other_requests_back() {
    testenv::init_tracing();
    let cluster = testenv::shared("lease", CrdSet::None).await.unwrap();
    let ns = cluster.namespace("client-limits").await.unwrap();
    let admin = cluster.client().await.unwrap();
    Api::<Lease>::namespaced(admin, &ns)
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("l".into()),
                    ..Default::default()
                },
                spec: None,
            },
        )
        .await
        .unwrap();

    // One request every 20 s, one at a time: the first request takes the
    // only token.
    let kc = Kubeconfig::read_from(cluster.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let limits = Limits {
        qps: 0.05,
        burst: 1,
        max_in_flight: 1,
        min_in_flight: 1,
    };
    let client = build(config, &ApiLayer::new(ApiMetrics::default(), limits)).unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client, &ns);
    maps.get_opt("first").await.unwrap();
    // The next ConfigMap read waits for a token (about 20 s)...
    let waiting = tokio::spawn(async move { maps.get_opt("second").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...while Lease requests go at once, again and again.
    for _ in 0..5 {
        let mut l = leases.get("l").await.unwrap();
        l.spec.get_or_insert_with(Default::default).holder_identity = Some("me".into());
        leases
            .replace("l", &PostParams::default(), &l)
            .await
            .unwrap();
    }
    assert!(
        !waiting.is_finished(),
        "the ConfigMap read is still held back by the rate limit"
    );
    waiting.abort();
}
