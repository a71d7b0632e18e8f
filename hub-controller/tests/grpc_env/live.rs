//! The hub's live endpoint, as argocd-server calls it: its flags, and a
//! Kubernetes client of one cluster's path on it.

use super::Env;

/// The live endpoint's flags for a replica listening on `addr`, reached by
/// argocd-server at `url` and by the other replicas at `peer` (as
/// `--live-peer-addr` takes it); its tokens in `live-tokens` of the
/// environment's folder, its CA the test CA.
pub fn flags(env: &Env, addr: std::net::SocketAddr, url: &str, peer: &str) -> Vec<String> {
    let d = env.dir.path();
    vec![
        format!("--live-addr={addr}"),
        format!("--live-url={url}"),
        format!("--live-token-file={}", d.join("live-tokens").display()),
        format!("--live-ca-file={}", d.join("ca.crt").display()),
        format!("--live-peer-addr={peer}"),
    ]
}

/// A client of the Kubernetes API at `url` (a cluster's path on the hub's
/// live endpoint) trusting `ca_pem`, presenting `token`.
pub fn client(url: &str, ca_pem: &str, token: &str) -> kube::Client {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut config = kube::Config::new(url.parse().unwrap());
    config.root_cert = Some(vec![
        CertificateDer::from_pem_slice(ca_pem.as_bytes())
            .unwrap()
            .to_vec(),
    ]);
    config.auth_info.token = Some(token.to_string().into());
    // Every answer as the endpoint gave it: no retries of a 503.
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// The code and message of a failed read through the live endpoint.
pub fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.message),
        other => panic!("not refused by the API: {other:?}"),
    }
}

/// Starts `env`'s hub with its live endpoint on a free loopback port,
/// taking `token`, and `extra` flags: the endpoint's address and the CA
/// that serves it.
pub async fn start_hub(
    env: &mut Env,
    token: &str,
    extra: &[&str],
) -> (std::net::SocketAddr, String) {
    std::fs::write(env.dir.path().join("live-tokens"), format!("{token}\n")).unwrap();
    let addr = testenv::net::free_addr().unwrap();
    let url = format!("https://{addr}");
    let mut flags = flags(env, addr, &url, &addr.to_string());
    flags.extend(extra.iter().map(|f| f.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.start_hub(&flags).await;
    let ca_pem = std::fs::read_to_string(env.dir.path().join("ca.crt")).unwrap();
    (addr, ca_pem)
}
