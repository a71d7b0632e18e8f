//! Egress through an HTTP proxy, the decisions without the sockets: which
//! proxy the hub is dialled through (`--proxy`, else `HTTPS_PROXY` and
//! friends, unless `NO_PROXY` names the hub), the `CONNECT` request, and
//! what the proxy's answer means. `session::tunnel` does the dialling.
//!
//! The proxy only ever carries a TCP tunnel: TLS (with the agent's client
//! certificate) starts inside it after `CONNECT`, so the proxy sees the
//! hub's name and port and nothing else.

use std::net::IpAddr;
use std::path::PathBuf;

/// The longest answer head a proxy may send to `CONNECT`; past it the
/// dial fails rather than buffer whatever a broken proxy sends.
pub const MAX_HEAD: usize = 8 * 1024;

/// The proxy settings the agent started with. The URL is kept as given
/// and read at each dial, so that an error in it is a clear dial error
/// (and the same error after every backoff), not a crash loop.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The proxy's URL (`http://[user:password@]host:port`), if any.
    pub url: Option<String>,
    /// Where it came from (`--proxy`, `HTTPS_PROXY`, ...), for the logs.
    pub source: &'static str,
    /// `NO_PROXY`: the hosts reached directly.
    pub no_proxy: String,
    /// A file holding `user:password` for the proxy (Basic), read at each
    /// dial; a missing file means none.
    pub credentials_file: Option<PathBuf>,
}

/// Never prints a password, wherever the config is logged.
impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("url", &self.url.as_deref().map(redacted))
            .field("source", &self.source)
            .field("no_proxy", &self.no_proxy)
            .field("credentials_file", &self.credentials_file)
            .finish()
    }
}

/// `url` without the password of its user part.
pub fn redacted(url: &str) -> String {
    let (scheme, rest) = split_scheme(url);
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{scheme}{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

impl ProxyConfig {
    /// The settings from `flag` (`--proxy`, which wins) or the environment
    /// as `env` reads it, for a hub dialled with `https` or not: the
    /// variables curl and Go read, upper case first as Go does. An empty
    /// value counts as unset.
    pub fn resolve(
        flag: Option<&str>,
        credentials_file: Option<PathBuf>,
        https: bool,
        env: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let set = |name: &'static str| {
            env(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (name, v))
        };
        let names: [&'static str; 2] = if https {
            ["HTTPS_PROXY", "https_proxy"]
        } else {
            ["HTTP_PROXY", "http_proxy"]
        };
        let (source, url) = match flag.filter(|f| !f.trim().is_empty()) {
            Some(f) => ("--proxy", Some(f.trim().to_string())),
            None => match names.into_iter().find_map(set) {
                Some((name, v)) => (name, Some(v.trim().to_string())),
                None => ("", None),
            },
        };
        let no_proxy = ["NO_PROXY", "no_proxy"]
            .into_iter()
            .find_map(set)
            .map(|(_, v)| v)
            .unwrap_or_default();
        Self {
            url,
            source,
            no_proxy,
            credentials_file,
        }
    }

    /// The proxy to reach `host:port` through, or `None` to dial it
    /// directly (no proxy set, or `NO_PROXY` names it).
    pub fn route(&self, host: &str, port: u16) -> Result<Option<ProxyUrl>, ProxyError> {
        match &self.url {
            Some(url) if !bypassed(&self.no_proxy, host, port) => {
                ProxyUrl::parse(url).map(Some).map_err(|why| {
                    ProxyError::Config(format!("{} {}: {why}", self.source, redacted(url)))
                })
            }
            _ => Ok(None),
        }
    }
}

/// A proxy to dial: where, and the credentials its URL carries.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    pub host: String,
    pub port: u16,
    pub credentials: Option<Credentials>,
}

impl std::fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.address())
    }
}

impl ProxyUrl {
    /// `http://[user:password@]host[:port][/]`; no scheme means `http`,
    /// no port 80 (curl's and Go's defaults). A proxy spoken to over TLS
    /// (`https://`) or SOCKS is not supported: said so, not guessed.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = split_scheme(url);
        match scheme.to_ascii_lowercase().as_str() {
            "" | "http://" => {}
            other => {
                return Err(format!(
                    "only an http:// proxy (HTTP CONNECT) is supported, not {}",
                    other.trim_end_matches("://")
                ));
            }
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (credentials, hostport) = match authority.rfind('@') {
            Some(at) => {
                let (user, password) = authority[..at]
                    .split_once(':')
                    .unwrap_or((&authority[..at], ""));
                let credentials = Credentials {
                    user: percent_decoded(user)?,
                    password: percent_decoded(password)?,
                };
                (Some(credentials), &authority[at + 1..])
            }
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport)?;
        if host.is_empty() {
            return Err("no host".into());
        }
        Ok(Self {
            host: host.to_string(),
            port: port.unwrap_or(80),
            credentials,
        })
    }

    /// `host:port`, as the proxy is dialled.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A user and password for Basic proxy authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:***", self.user)
    }
}

impl Credentials {
    /// A credentials file's text: `user:password` on the first line (a
    /// Secret's value, with or without a trailing newline).
    pub fn from_file_text(text: &str) -> Result<Self, String> {
        let line = text
            .lines()
            .next()
            .unwrap_or_default()
            .trim_end_matches('\r');
        match line.split_once(':') {
            Some((user, password)) if !user.is_empty() => Ok(Self {
                user: user.to_string(),
                password: password.to_string(),
            }),
            _ => Err("expected one line `user:password`".into()),
        }
    }

    /// The `Proxy-Authorization` header's value.
    fn basic(&self) -> String {
        use base64::Engine;
        let pair = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// Why a dial through the proxy failed, as an operator reads it.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("proxy setting {0}")]
    Config(String),
    #[error("proxy credentials file {file}: {why}")]
    Credentials { file: String, why: String },
    #[error("cannot reach the proxy {proxy}: {source}")]
    Unreachable {
        proxy: String,
        source: std::io::Error,
    },
    #[error("the proxy {proxy} closed the connection during CONNECT to {target}: {source}")]
    Closed {
        proxy: String,
        target: String,
        source: std::io::Error,
    },
    #[error("the proxy {proxy} refused CONNECT to {target}: {answer}")]
    Refused {
        proxy: String,
        target: String,
        answer: String,
    },
}

/// The `CONNECT` request for `target` (`host:port`, an IPv6 host in
/// brackets), with Basic credentials if any.
pub fn connect_request(target: &str, credentials: Option<&Credentials>) -> String {
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(c) = credentials {
        request.push_str(&format!("Proxy-Authorization: {}\r\n", c.basic()));
    }
    request.push_str("\r\n");
    request
}

/// What the head of the proxy's answer to `CONNECT` says: `Ok` for a 2xx
/// (the tunnel is open), else the status line and what to do about it.
/// `sent_credentials` says whether the request carried any.
pub fn connect_answer(head: &[u8], sent_credentials: bool) -> Result<(), String> {
    let head = String::from_utf8_lossy(head);
    let status_line = head.lines().next().unwrap_or_default().trim();
    let mut words = status_line.splitn(3, ' ');
    let (version, code, reason) = (words.next(), words.next(), words.next());
    let code: u16 = match (version, code.and_then(|c| c.parse().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code,
        _ => return Err(format!("not an HTTP answer: {status_line:?}")),
    };
    let status = format!("{code} {}", reason.unwrap_or_default().trim());
    match code {
        200..=299 => Ok(()),
        // Some proxies (tinyproxy) answer a wrong password with 401.
        401 | 407 if sent_credentials => Err(format!(
            "{status}: the proxy refused the credentials of --proxy-credentials-file"
        )),
        407 => Err(format!(
            "{status}: set --proxy-credentials-file (a Secret with `user:password`)"
        )),
        _ => Err(status),
    }
}

/// Whether `no_proxy` (comma- or space-separated) names `host:port`, as
/// Go's `httpproxy` reads it: `*` is everything; an IP or CIDR matches an
/// IP host; `name` matches it and its subdomains, `.name` its subdomains
/// only; an entry with `:port` only that port. Unlike Go, loopback
/// addresses are not exempt by themselves: the agent dials one host, and
/// a proxy set for it is meant.
pub fn bypassed(no_proxy: &str, host: &str, port: u16) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let host = host.trim_end_matches('.');
    let ip: Option<IpAddr> = host.parse().ok();
    no_proxy
        .split([',', ' '])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            if let Some((net, bits)) = entry.split_once('/') {
                return match (ip, net.parse::<IpAddr>(), bits.parse::<u32>()) {
                    (Some(ip), Ok(net), Ok(bits)) => in_cidr(ip, net, bits),
                    _ => false,
                };
            }
            let (name, entry_port) = match split_host_port(entry) {
                Ok((name, entry_port)) => (name.to_ascii_lowercase(), entry_port),
                Err(_) => return false,
            };
            if entry_port.is_some_and(|p| p != port) {
                return false;
            }
            let name = name.trim_end_matches('.');
            if let (Some(ip), Ok(entry_ip)) = (ip, name.parse::<IpAddr>()) {
                return ip == entry_ip;
            }
            match name.strip_prefix('.') {
                Some(suffix) => host.ends_with(&format!(".{suffix}")),
                None => host == name || host.ends_with(&format!(".{name}")),
            }
        })
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u32) -> bool {
    match (ip.to_canonical(), net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// `(scheme://, rest)`; the scheme empty when there is none.
fn split_scheme(url: &str) -> (&str, &str) {
    match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; the host without brackets.
fn split_host_port(s: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .map(Some)
            .map_err(|_| format!("bad port {p:?}"))
    };
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed [ in {s:?}"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host, port(p)?)),
            None if after.is_empty() => Ok((host, None)),
            None => Err(format!("bad address {s:?}")),
        };
    }
    match s.rsplit_once(':') {
        // More than one colon and no brackets: an IPv6 address alone.
        Some((host, _)) if host.contains(':') => Ok((s, None)),
        Some((host, p)) => Ok((host, port(p)?)),
        None => Ok((s, None)),
    }
}

/// `%XX` escapes of a URL's user part decoded.
fn percent_decoded(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a bad %-escape in the user part")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the user part is not UTF-8".to_string())
}

/// The `host:port` of a `CONNECT` to `host` (an IPv6 address in brackets).
pub fn connect_target(host: &str, port: u16) -> String {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.contains(':') {
        format!("[{bare}]:{port}")
    } else {
        format!("{bare}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.get(k).cloned()
    }

    #[test]
    fn the_flag_wins_over_the_environment_and_https_reads_https_proxy() {
        let vars = env(&[
            ("HTTPS_PROXY", "http://upper:3128"),
            ("https_proxy", "http://lower:3128"),
            ("HTTP_PROXY", "http://plain:3128"),
            ("no_proxy", ".internal"),
        ]);
        let c = ProxyConfig::resolve(Some("http://flag:8080"), None, true, &vars);
        assert_eq!(
            (c.url.as_deref(), c.source),
            (Some("http://flag:8080"), "--proxy")
        );
        assert_eq!(c.no_proxy, ".internal");
        let c = ProxyConfig::resolve(None, None, true, &vars);
        assert_eq!(
            (c.url.as_deref(), c.source),
            (Some("http://upper:3128"), "HTTPS_PROXY")
        );
        let c = ProxyConfig::resolve(Some(""), None, true, env(&[("https_proxy", "lower:1")]));
        assert_eq!(
            (c.url.as_deref(), c.source),
            (Some("lower:1"), "https_proxy")
        );
        // A plain-http hub reads HTTP_PROXY, never HTTPS_PROXY.
        let c = ProxyConfig::resolve(None, None, false, &vars);
        assert_eq!(c.url.as_deref(), Some("http://plain:3128"));
        // Empty is unset; nothing set is no proxy.
        let c = ProxyConfig::resolve(None, None, true, env(&[("HTTPS_PROXY", " ")]));
        assert_eq!(c.url, None);
        assert_eq!(c.route("hub", 443).unwrap(), None);
    }

    #[test]
    fn proxy_urls_parse_with_their_defaults_and_credentials() {
        let p = ProxyUrl::parse("http://u%40corp:p%3Ass@proxy.corp:3128/").unwrap();
        assert_eq!(p.address(), "proxy.corp:3128");
        assert_eq!(
            p.credentials,
            Some(Credentials {
                user: "u@corp".into(),
                password: "p:ss".into()
            })
        );
        assert_eq!(ProxyUrl::parse("proxy").unwrap().address(), "proxy:80");
        assert_eq!(
            ProxyUrl::parse("http://[fd00::1]:3128").unwrap().host,
            "fd00::1"
        );
        for (bad, why) in [
            ("https://proxy:443", "not https"),
            ("socks5://proxy:1080", "not socks5"),
            ("http://proxy:http", "bad port"),
            ("http://:3128", "no host"),
            ("http://u:%zz@proxy", "%-escape"),
        ] {
            let e = ProxyUrl::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_password_is_never_shown() {
        let c = ProxyConfig {
            url: Some("http://user:s3cret@proxy:3128".into()),
            source: "HTTPS_PROXY",
            ..Default::default()
        };
        let shown = format!("{c:?} {:?}", c.route("hub", 443).unwrap());
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("user:***@proxy:3128"), "{shown}");
        let bad = ProxyConfig {
            url: Some("https://user:s3cret@proxy".into()),
            source: "--proxy",
            ..Default::default()
        };
        let e = bad.route("hub", 443).unwrap_err().to_string();
        assert!(
            !e.contains("s3cret") && e.starts_with("proxy setting --proxy"),
            "{e}"
        );
    }

    #[test]
    fn no_proxy_matches_hosts_domains_ports_and_networks() {
        let table: &[(&str, &str, u16, bool)] = &[
            ("*", "hub.example.com", 443, true),
            ("hub.example.com", "hub.example.com", 443, true),
            ("example.com", "hub.example.com", 443, true),
            ("example.com", "badexample.com", 443, false),
            (".example.com", "hub.example.com", 443, true),
            (".example.com", "example.com", 443, false),
            ("HUB.Example.com.", "hub.example.com", 443, true),
            ("hub.example.com:8443", "hub.example.com", 8443, true),
            ("hub.example.com:8443", "hub.example.com", 443, false),
            ("other, hub.example.com", "hub.example.com", 443, true),
            ("other hub.example.com", "hub.example.com", 443, true),
            ("10.0.0.0/8", "10.1.2.3", 443, true),
            ("10.0.0.0/8", "11.1.2.3", 443, false),
            ("10.0.0.0/8", "hub.example.com", 443, false),
            ("10.1.2.3", "10.1.2.3", 443, true),
            ("127.0.0.1:8443", "127.0.0.1", 8443, true),
            ("fd00::/8", "[fd00::5]", 443, true),
            ("[fd00::5]:443", "[fd00::5]", 443, true),
            ("::1", "[::1]", 443, true),
            ("", "hub.example.com", 443, false),
            // Loopback is proxied unless named: Go would exempt it.
            ("other", "127.0.0.1", 443, false),
        ];
        for &(no_proxy, host, port, want) in table {
            assert_eq!(
                bypassed(no_proxy, host, port),
                want,
                "{no_proxy:?} {host}:{port}"
            );
        }
        let c = ProxyConfig {
            url: Some("http://proxy:3128".into()),
            source: "HTTPS_PROXY",
            no_proxy: ".example.com".into(),
            credentials_file: None,
        };
        assert_eq!(c.route("hub.example.com", 443).unwrap(), None);
        assert_eq!(
            c.route("hub.other.com", 443).unwrap().unwrap().address(),
            "proxy:3128"
        );
    }

    #[test]
    fn the_connect_request_names_the_hub_and_carries_basic_credentials() {
        assert_eq!(
            connect_request(&connect_target("hub", 8443), None),
            "CONNECT hub:8443 HTTP/1.1\r\nHost: hub:8443\r\n\r\n"
        );
        assert_eq!(connect_target("[::1]", 443), "[::1]:443");
        assert_eq!(connect_target("::1", 443), "[::1]:443");
        let c = Credentials::from_file_text("agent:pa:ss\n").unwrap();
        assert_eq!(c.password, "pa:ss");
        // base64("agent:pa:ss")
        assert!(
            connect_request("hub:443", Some(&c))
                .contains("\r\nProxy-Authorization: Basic YWdlbnQ6cGE6c3M=\r\n")
        );
        assert!(Credentials::from_file_text("no-colon").is_err());
        assert!(Credentials::from_file_text(":pw").is_err());
    }

    #[test]
    fn the_proxys_answer_says_what_to_fix() {
        assert_eq!(
            connect_answer(b"HTTP/1.1 200 Connection established\r\n\r\n", false),
            Ok(())
        );
        assert_eq!(connect_answer(b"HTTP/1.0 200 OK\r\n\r\n", true), Ok(()));
        let e = connect_answer(
            b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n",
            false,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "407 Proxy Authentication Required: set --proxy-credentials-file (a Secret with `user:password`)"
        );
        let e = connect_answer(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", true)
            .unwrap_err();
        assert!(e.contains("refused the credentials"), "{e}");
        let e = connect_answer(b"HTTP/1.0 401 Unauthorized\r\n\r\n", true).unwrap_err();
        assert_eq!(
            e,
            "401 Unauthorized: the proxy refused the credentials of --proxy-credentials-file"
        );
        assert_eq!(
            connect_answer(b"HTTP/1.1 403 Forbidden\r\n\r\n", false),
            Err("403 Forbidden".into())
        );
        assert!(connect_answer(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
    }
}
