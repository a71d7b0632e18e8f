//! The Argo CD cluster Secret that makes a ManagedCluster visible to the
//! hub's Argo CD: its UI lists it and ApplicationSet cluster generators can
//! target it. The hub's Argo CD never connects to it (the Applications it
//! would deploy there are dormant), so the Secret carries no credentials.

use std::collections::BTreeMap;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManagedCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::core::ObjectMeta;
use kube::{Resource, ResourceExt};

/// Label naming the ManagedCluster a cluster Secret stands for.
pub const CLUSTER_NAME_LABEL: &str = "apps.open-cluster-management.io/cluster-name";

/// The Secret's name in the Argo CD namespace.
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-cluster-secret")
}

/// Keeps of `cluster` only what [`cluster_secret`] reads: its metadata
/// (without managedFields, labels and annotations) and its clients' URLs.
/// The cache of every ManagedCluster held the rest for nothing: OCM's
/// status (conditions, capacity, claims, version) and each client
/// config's CA bundle, about 1.5 KiB a cluster, 15 MiB at 10,000.
pub fn slim(cluster: &mut ManagedCluster) {
    cluster.status = None;
    let meta = &mut cluster.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = None;
    for c in cluster
        .spec
        .managed_cluster_client_configs
        .iter_mut()
        .flatten()
    {
        c.ca_bundle = None;
    }
}

/// Why a cluster's own URL is not used as the Secret's `server`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServerRefused {
    #[error("is not an https:// URL with a host")]
    NotHttps,
    #[error("is a loopback address")]
    Loopback,
    #[error(
        "is an address inside a cluster (the hub's own Service network, a link-local or unspecified address, or a `.svc`/`.cluster.local` name)"
    )]
    InCluster,
    #[error("is the hub's own API server")]
    Hub,
    #[error(
        "is a numeric host written in another form than a dotted IPv4 or an IPv6 address (resolvers read `2130706433` or `0x7f.1` as 127.0.0.1)"
    )]
    NumericForm,
    #[error(
        "is also the URL of ManagedCluster {by:?}, registered before this one, which keeps it (two cluster Secrets with one server make the hub's Argo CD take one cluster for the other)"
    )]
    Taken { by: String },
    #[error(
        "is the server that stands for ManagedCluster {by:?}, registered before this one, when its own URL cannot be used (https://<cluster name>)"
    )]
    OtherClusterName { by: String },
    #[error(
        "is under .invalid, a domain that never resolves (RFC 6761), which argocd-pull keeps for the servers it makes up"
    )]
    Reserved,
}

/// Whether `url`, which the cluster's own klusterlet writes into
/// `ManagedCluster.spec.managedClusterClientConfigs`, may be the `server`
/// of the Argo CD cluster Secret. Pure. A Secret whose server is the hub's
/// own API server, a loopback or an in-cluster address would make the
/// hub's Argo CD take it for itself (`https://kubernetes.default.svc` is
/// its in-cluster cluster) or point it at something inside the hub.
/// `hub`: the hosts the hub's API server is known by (its URL's host, the
/// `kubernetes` Service's address in the hub-controller's pod).
pub fn check_server(url: &str, hub: &[String]) -> Result<(), ServerRefused> {
    let rest = url
        .strip_prefix("https://")
        .ok_or(ServerRefused::NotHttps)?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    // `[v6]:port`, `[v6]`, `host:port` or `host`.
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(h, _)| h).unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() {
        return Err(ServerRefused::NotHttps);
    }
    if hub
        .iter()
        .any(|h| host == h.trim_end_matches('.').to_ascii_lowercase())
    {
        return Err(ServerRefused::Hub);
    }
    if host == "localhost" || host.ends_with(".localhost") {
        return Err(ServerRefused::Loopback);
    }
    if host == "invalid" || host.ends_with(".invalid") {
        return Err(ServerRefused::Reserved);
    }
    if host == "kubernetes"
        || host.starts_with("kubernetes.default")
        || host.ends_with(".svc")
        || host.contains(".svc.")
        || host.ends_with(".cluster.local")
    {
        return Err(ServerRefused::InCluster);
    }
    let ip = host.parse::<std::net::IpAddr>();
    // The checks below read addresses in their canonical forms only; the
    // system resolver also takes `2130706433`, `127.1` or `0x7f.0.0.1`.
    // A name that is no DNS name (every label numeric) must be canonical.
    let numeric = |l: &str| {
        !l.is_empty()
            && (l.bytes().all(|b| b.is_ascii_digit())
                || l.strip_prefix("0x")
                    .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit())))
    };
    if ip.is_err() && host.split('.').all(numeric) {
        return Err(ServerRefused::NumericForm);
    }
    if let Ok(ip) = ip {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
            v4 => v4,
        };
        if ip.is_loopback() {
            return Err(ServerRefused::Loopback);
        }
        let in_cluster = match ip {
            std::net::IpAddr::V4(v4) => v4.is_unspecified() || v4.is_link_local(),
            std::net::IpAddr::V6(v6) => {
                v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80
            }
        };
        if in_cluster {
            return Err(ServerRefused::InCluster);
        }
    }
    Ok(())
}

/// The cluster's own API URL as OCM knows it, when there is one.
pub fn cluster_url(cluster: &ManagedCluster) -> Option<&str> {
    cluster
        .spec
        .managed_cluster_client_configs
        .as_ref()
        .and_then(|c| c.first())
        .map(|c| c.url.as_str())
        .filter(|u| !u.is_empty())
}

/// The server that stands for `cluster` when its own URL cannot be used: a
/// stable placeholder that is still a valid, unique server for Argo CD
/// (ApplicationSet cluster generators match on the name and labels; the
/// hub's Argo CD never connects).
pub fn placeholder(cluster: &str) -> String {
    format!("https://{cluster}")
}

/// The server of last resort for `cluster`, when a cluster registered
/// before it gives [`placeholder`]`(cluster)` as its own URL, and for a
/// cluster whose name is under `.invalid` (whose placeholder could be
/// another's last resort): a name under `.invalid`, which no cluster can
/// give ([`ServerRefused::Reserved`]) and which differs for every cluster.
pub fn last_resort(cluster: &str) -> String {
    format!("https://{cluster}.argocd-pull.invalid")
}

/// The placeholder `cluster` may use: none for a name under `.invalid`.
fn own_placeholder(cluster: &str) -> Option<String> {
    let name = cluster.trim_end_matches('.').to_ascii_lowercase();
    (name != "invalid" && !name.ends_with(".invalid")).then(|| placeholder(cluster))
}

/// Whether Argo CD would take `a` and `b` for one server (it compares them
/// without a trailing `/`; compared here without case too, so that more
/// pairs count as one, never fewer).
pub fn same_server(a: &str, b: &str) -> bool {
    a.trim_end_matches('/')
        .eq_ignore_ascii_case(b.trim_end_matches('/'))
}

/// The Secret's server for `cluster`: its own URL when OCM knows one,
/// [`check_server`] allows it and no cluster of `fleet` registered before
/// it claims that server; otherwise its [`placeholder`] when no cluster
/// registered before it claims that; otherwise its [`last_resort`]. The
/// URL refused, and why, comes with it (for the cluster's owner). Pure.
///
/// A cluster's URL is whatever its klusterlet writes, so a cluster could
/// give another's URL, or another's placeholder, and its Secret would
/// then name the same server as the other's: the hub's Argo CD would take
/// one cluster for the other. A cluster claims the server its allowed URL
/// names and its own placeholder; of the clusters that claim one server,
/// the one registered first (creationTimestamp, then name) has it, so no
/// two Secrets name one server and a cluster registered later, whatever
/// its name or URL, takes nothing from one registered before. `fleet`:
/// every ManagedCluster on the hub (`cluster` may be among them); one
/// being deleted is left out.
pub fn choose_server<'a>(
    cluster: &ManagedCluster,
    hub: &[String],
    fleet: impl IntoIterator<Item = &'a ManagedCluster>,
) -> (String, Option<(String, ServerRefused)>) {
    let name = cluster.name_any();
    let registered = |c: &ManagedCluster| (c.metadata.creation_timestamp.clone(), c.name_any());
    let mine = registered(cluster);
    let earlier: Vec<&ManagedCluster> = fleet
        .into_iter()
        .filter(|o| o.name_any() != name && o.metadata.deletion_timestamp.is_none())
        .filter(|o| registered(o) < mine)
        .collect();
    // Who registered before `cluster` claims `server`, if anyone.
    let claimed = |server: &str| {
        earlier.iter().find_map(|other| {
            let by = other.name_any();
            if own_placeholder(&by).is_some_and(|p| same_server(server, &p)) {
                return Some(ServerRefused::OtherClusterName { by });
            }
            let theirs = cluster_url(other)?;
            (same_server(server, theirs) && check_server(theirs, hub).is_ok())
                .then_some(ServerRefused::Taken { by })
        })
    };
    let refused = match cluster_url(cluster) {
        None => None,
        Some(url) => match check_server(url, hub).err().or_else(|| claimed(url)) {
            None => return (url.to_string(), None),
            Some(why) => Some((url.to_string(), why)),
        },
    };
    let server = match own_placeholder(&name) {
        Some(p) if claimed(&p).is_none() => p,
        _ => last_resort(&name),
    };
    (server, refused)
}

/// What the cluster Secrets carry when the hub's live endpoint serves
/// argocd-server's live views (`--live-url`): the endpoint's URL, the
/// token argocd-server presents, and the CA of the endpoint's certificate
/// (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveEndpoint {
    pub url: String,
    pub token: String,
    pub ca_pem: String,
}

impl LiveEndpoint {
    /// The server of `cluster`'s Secret: its path on the live endpoint.
    pub fn server(&self, cluster: &str) -> String {
        live_server(&self.url, cluster)
    }
}

/// `cluster`'s path on the live endpoint at `url`.
pub fn live_server(url: &str, cluster: &str) -> String {
    format!("{}/clusters/{cluster}", url.trim_end_matches('/'))
}

/// The cluster Secret for `cluster` with the live endpoint's server and
/// credentials: argocd-server's reads of the cluster go to the hub's live
/// endpoint, which forwards them to the cluster's agent.
pub fn live_cluster_secret(
    cluster: &ManagedCluster,
    argocd_namespace: &str,
    live: &LiveEndpoint,
) -> Secret {
    use base64::Engine as _;
    let mut secret = cluster_secret(cluster, argocd_namespace, &live.server(&cluster.name_any()));
    let config = serde_json::json!({
        "bearerToken": live.token,
        "tlsClientConfig": {
            "caData": base64::engine::general_purpose::STANDARD.encode(&live.ca_pem),
        },
    });
    secret
        .string_data
        .get_or_insert_with(Default::default)
        .insert("config".into(), config.to_string());
    secret
}

/// The cluster Secret for `cluster`, with `server` ([`choose_server`]),
/// owned by the cluster so that it goes when the cluster is removed from
/// OCM.
pub fn cluster_secret(cluster: &ManagedCluster, argocd_namespace: &str, server: &str) -> Secret {
    let name = cluster.name_any();
    let server = server.to_string();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&name)),
            namespace: Some(argocd_namespace.to_string()),
            labels: Some(BTreeMap::from([
                (keys::ARGOCD_SECRET_TYPE.to_string(), "cluster".to_string()),
                (CLUSTER_NAME_LABEL.to_string(), name.clone()),
                (
                    crate::render::work::MANAGED_BY_LABEL.to_string(),
                    crate::render::work::MANAGED_BY.to_string(),
                ),
            ])),
            owner_references: cluster.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([
            ("name".to_string(), name),
            ("server".to_string(), server),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(spec: serde_json::Value) -> ManagedCluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": { "name": "cluster1", "uid": "u-1" }, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn with_the_live_endpoint_the_secret_points_there_with_its_credentials() {
        let c = cluster(
            json!({ "managedClusterClientConfigs": [{ "url": "https://c1.example:6443" }] }),
        );
        let live = LiveEndpoint {
            url: "https://argocd-pull-live.argocd-pull.svc:8444/".into(),
            token: "t0ken".into(),
            ca_pem: "-----BEGIN CERTIFICATE-----".into(),
        };
        let s = live_cluster_secret(&c, "argocd", &live);
        let data = s.string_data.unwrap();
        assert_eq!(
            data["server"],
            "https://argocd-pull-live.argocd-pull.svc:8444/clusters/cluster1"
        );
        let config: serde_json::Value = serde_json::from_str(&data["config"]).unwrap();
        assert_eq!(config["bearerToken"], "t0ken");
        assert_eq!(
            config["tlsClientConfig"]["caData"],
            "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t"
        );
        assert_eq!(data["name"], "cluster1");
    }

    #[test]
    fn names_labels_and_owns_the_secret() {
        let c = cluster(json!({}));
        let (server, refused) = choose_server(&c, &[], [&c]);
        assert_eq!((server.as_str(), refused), ("https://cluster1", None));
        let s = cluster_secret(&c, "argocd", &server);
        assert_eq!(s.metadata.name.as_deref(), Some("cluster1-cluster-secret"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("argocd"));
        assert_eq!(
            s.metadata.labels.as_ref().unwrap()[keys::ARGOCD_SECRET_TYPE],
            "cluster"
        );
        let data = s.string_data.unwrap();
        assert_eq!(data["name"], "cluster1");
        assert_eq!(data["server"], "https://cluster1");
        let owner = &s.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ManagedCluster", "u-1")
        );
    }

    #[test]
    fn uses_the_cluster_url_ocm_knows() {
        let spec =
            json!({ "managedClusterClientConfigs": [{ "url": "https://api.c1.example:6443" }] });
        let (server, refused) = choose_server(&cluster(spec), &[], []);
        assert_eq!(
            (server.as_str(), refused),
            ("https://api.c1.example:6443", None)
        );
    }

    #[test]
    fn a_server_at_the_hub_a_loopback_or_inside_a_cluster_is_refused() {
        let hub = &["hub.example.com".to_string(), "10.96.0.1".to_string()];
        for url in [
            "https://api.c1.example:6443",
            "https://api.c1.example",
            "https://10.0.0.1:6443",
            "https://[2001:db8::1]:6443",
            "https://c1.example/prefix",
        ] {
            assert_eq!(check_server(url, hub), Ok(()), "{url}");
        }
        for (url, why) in [
            ("https://hub.example.com:6443", ServerRefused::Hub),
            ("https://HUB.example.com./x", ServerRefused::Hub),
            ("https://10.96.0.1:443", ServerRefused::Hub),
            ("https://127.0.0.1:6443", ServerRefused::Loopback),
            ("https://127.8.9.10", ServerRefused::Loopback),
            ("https://[::1]:6443", ServerRefused::Loopback),
            ("https://[::ffff:127.0.0.1]", ServerRefused::Loopback),
            ("https://localhost:6443", ServerRefused::Loopback),
            ("https://user@localhost", ServerRefused::Loopback),
            ("https://kubernetes.default.svc", ServerRefused::InCluster),
            (
                "https://kubernetes.default.svc.cluster.local:443",
                ServerRefused::InCluster,
            ),
            ("https://kubernetes", ServerRefused::InCluster),
            ("https://argocd-server.argocd.svc", ServerRefused::InCluster),
            ("https://169.254.169.254", ServerRefused::InCluster),
            ("https://0.0.0.0:6443", ServerRefused::InCluster),
            ("https://[fe80::1]", ServerRefused::InCluster),
            ("https://2130706433:6443", ServerRefused::NumericForm),
            ("https://127.1", ServerRefused::NumericForm),
            ("https://0x7f.0.0.1", ServerRefused::NumericForm),
            ("https://0177.0.0.1", ServerRefused::NumericForm),
            ("http://api.c1.example", ServerRefused::NotHttps),
            ("https://", ServerRefused::NotHttps),
        ] {
            assert_eq!(check_server(url, hub), Err(why), "{url}");
        }
        // Refused: the Secret is still written, with the placeholder.
        let spec =
            json!({ "managedClusterClientConfigs": [{ "url": "https://kubernetes.default.svc" }] });
        let (server, refused) = choose_server(&cluster(spec), hub, []);
        assert_eq!(server, "https://cluster1");
        assert_eq!(
            refused,
            Some((
                "https://kubernetes.default.svc".into(),
                ServerRefused::InCluster
            ))
        );
    }

    #[test]
    fn a_slimmed_cluster_makes_the_same_secret() {
        let mut full: ManagedCluster = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {
                "name": "cluster1", "uid": "u-1", "generation": 3,
                "creationTimestamp": "2026-11-27T10:00:00Z",
                "labels": { "env": "prod" }, "annotations": { "a": "b" },
                "managedFields": [{ "manager": "registration", "operation": "Update" }]
            },
            "spec": { "hubAcceptsClient": true, "managedClusterClientConfigs": [
                { "url": "https://api.c1.example:6443", "caBundle": "LS0tLS1CRUdJTg==" }
            ] },
            "status": { "conditions": [], "version": { "kubernetes": "v1.35.0" } }
        }))
        .unwrap();
        let secret = |c: &ManagedCluster| cluster_secret(c, "argocd", &choose_server(c, &[], []).0);
        let before = secret(&full);
        slim(&mut full);
        assert_eq!(secret(&full), before);
        assert!(
            full.metadata.creation_timestamp.is_some(),
            "who came first is kept"
        );
        assert!(full.status.is_none());
        assert_eq!(full.metadata.generation, Some(3), "the watch filters on it");
        assert!(full.metadata.managed_fields.is_none() && full.metadata.annotations.is_none());
        let configs = full.spec.managed_cluster_client_configs.unwrap();
        assert_eq!(configs[0].ca_bundle, None);
        assert_eq!(configs[0].url, "https://api.c1.example:6443");
    }

    /// A ManagedCluster `name` registered at `created` with `url`.
    fn registered(name: &str, created: &str, url: &str) -> ManagedCluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": { "name": name, "creationTimestamp": created },
            "spec": { "managedClusterClientConfigs": [{ "url": url }] }
        }))
        .unwrap()
    }

    #[test]
    fn of_two_clusters_that_give_one_url_the_first_registered_keeps_it() {
        let honest = registered(
            "honest",
            "2026-01-01T00:00:00Z",
            "https://api.honest.example:6443",
        );
        // Later, with the same URL written another way.
        let thief = registered(
            "thief",
            "2026-06-01T00:00:00Z",
            "https://API.honest.example:6443/",
        );
        let fleet = [&honest, &thief];
        assert_eq!(
            choose_server(&honest, &[], fleet),
            ("https://api.honest.example:6443".into(), None)
        );
        assert_eq!(
            choose_server(&thief, &[], fleet),
            (
                "https://thief".into(),
                Some((
                    "https://API.honest.example:6443/".into(),
                    ServerRefused::Taken {
                        by: "honest".into()
                    }
                ))
            )
        );
        // Registered at the same second: the name decides, the same way
        // for both.
        let twin = registered(
            "a-twin",
            "2026-01-01T00:00:00Z",
            "https://api.honest.example:6443",
        );
        let fleet = [&honest, &twin];
        assert_eq!(choose_server(&twin, &[], fleet).1, None);
        assert!(choose_server(&honest, &[], fleet).1.is_some());
        // A URL the other cannot use itself (refused for it) takes nothing
        // from it; one being deleted neither.
        let loopback = registered("early", "2025-01-01T00:00:00Z", "https://127.0.0.1:6443");
        let late = registered("late", "2026-01-01T00:00:00Z", "https://127.0.0.1:6443");
        assert_eq!(
            choose_server(&late, &[], [&loopback, &late]).1,
            Some(("https://127.0.0.1:6443".into(), ServerRefused::Loopback))
        );
        let mut leaving = registered(
            "leaving",
            "2025-01-01T00:00:00Z",
            "https://api.honest.example:6443",
        );
        leaving.metadata.deletion_timestamp = honest.metadata.creation_timestamp.clone();
        assert_eq!(choose_server(&honest, &[], [&leaving, &honest]).1, None);
    }

    #[test]
    fn another_clusters_placeholder_is_no_server_for_one_registered_later() {
        let other = registered(
            "cluster2",
            "2026-06-01T00:00:00Z",
            "https://kubernetes.default.svc",
        );
        // Registered after cluster2: refused, the placeholder is cluster2's.
        let squatter = registered("cluster1", "2026-07-01T00:00:00Z", "https://cluster2/");
        assert_eq!(
            choose_server(&squatter, &[], [&squatter, &other]),
            (
                "https://cluster1".into(),
                Some((
                    "https://cluster2/".into(),
                    ServerRefused::OtherClusterName {
                        by: "cluster2".into()
                    }
                ))
            )
        );
        // Its own name as its URL is its own placeholder: kept.
        let own = registered("cluster3", "2026-01-01T00:00:00Z", "https://cluster3");
        assert_eq!(choose_server(&own, &[], [&own, &other]).1, None);
        // Every server chosen is different.
        let fleet = [&squatter, &other, &own];
        let servers: std::collections::BTreeSet<String> = fleet
            .iter()
            .map(|c| choose_server(c, &[], fleet).0)
            .collect();
        assert_eq!(servers.len(), 3, "{servers:?}");
    }

    #[test]
    fn a_cluster_registered_later_takes_nothing_from_one_registered_before() {
        // `early`'s real API server is reached as https://late (a host
        // name on the platform team's network); a cluster called `late`
        // registered after it does not take that server away.
        let early = registered("early", "2025-01-01T00:00:00Z", "https://late");
        let late = registered("late", "2026-01-01T00:00:00Z", "https://late");
        let fleet = [&early, &late];
        assert_eq!(
            choose_server(&early, &[], fleet),
            ("https://late".into(), None)
        );
        // `late` gives its own name as its URL, held by `early`: it gets
        // the last resort, never a server another Secret names.
        assert_eq!(
            choose_server(&late, &[], fleet),
            (
                "https://late.argocd-pull.invalid".into(),
                Some((
                    "https://late".into(),
                    ServerRefused::Taken { by: "early".into() }
                ))
            )
        );
        // Without a URL of its own, the same.
        let mut bare = late.clone();
        bare.spec.managed_cluster_client_configs = None;
        assert_eq!(
            choose_server(&bare, &[], [&early, &bare]),
            ("https://late.argocd-pull.invalid".into(), None)
        );
        // Once `early` leaves, `late` has its placeholder back.
        let mut leaving = early.clone();
        leaving.metadata.deletion_timestamp = late.metadata.creation_timestamp.clone();
        assert_eq!(
            choose_server(&bare, &[], [&leaving, &bare]).0,
            "https://late"
        );
    }

    #[test]
    fn no_cluster_gives_or_gets_a_server_under_invalid_but_its_own_last_resort() {
        assert_eq!(
            check_server("https://a.argocd-pull.invalid", &[]),
            Err(ServerRefused::Reserved)
        );
        assert_eq!(
            check_server("https://x.INVALID.:6443", &[]),
            Err(ServerRefused::Reserved)
        );
        // A cluster named like another's last resort never uses its
        // placeholder, which is that last resort.
        let a = registered(
            "a",
            "2026-01-01T00:00:00Z",
            "https://kubernetes.default.svc",
        );
        let tricky = registered("a.argocd-pull.invalid", "2025-01-01T00:00:00Z", "");
        let fleet = [&a, &tricky];
        let servers: std::collections::BTreeSet<String> = fleet
            .iter()
            .map(|c| choose_server(c, &[], fleet).0)
            .collect();
        assert_eq!(
            servers,
            [
                "https://a".to_string(),
                "https://a.argocd-pull.invalid.argocd-pull.invalid".to_string()
            ]
            .into()
        );
    }
}
