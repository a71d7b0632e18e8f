//! Which cluster an agent speaks for, from its verified client certificate
//! only (never from anything it sends).
//!
//! The certificate's subject common name is the Kubernetes user OCM issued
//! it to; patterns map it to a cluster. A pattern is literal text with
//! `{cluster}` where the cluster name is (a DNS label) and `*` for any run
//! of characters without `:`. The default accepts what OCM's addon
//! registration issues for the argocd-pull addon:
//! `system:open-cluster-management:cluster:<cluster>:addon:argocd-pull:agent:<agent>`.

use std::fmt;
use std::str::FromStr;

use argocd_pull_apis::keys;
use argocd_pull_apis::names::dns_label;
use x509_parser::prelude::{FromDer, X509Certificate};

/// One subject pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    raw: String,
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Cluster,
    Any,
}

impl Pattern {
    /// The pattern of OCM addon certificates of addon `addon`.
    pub fn ocm_addon(addon: &str) -> Self {
        format!("system:open-cluster-management:cluster:{{cluster}}:addon:{addon}:agent:*")
            .parse()
            .expect("a valid pattern")
    }

    /// The cluster named by `subject`, if the pattern matches it whole.
    pub fn cluster(&self, subject: &str) -> Option<String> {
        let mut captured = None;
        matches(&self.parts, subject, &mut captured).then_some(captured)?
    }
}

/// Backtracking match; patterns are a handful of parts long.
fn matches(parts: &[Part], rest: &str, captured: &mut Option<String>) -> bool {
    let Some((first, more)) = parts.split_first() else {
        return rest.is_empty();
    };
    match first {
        Part::Literal(l) => rest
            .strip_prefix(l.as_str())
            .is_some_and(|r| matches(more, r, captured)),
        Part::Any | Part::Cluster => {
            let limit = rest.find(':').unwrap_or(rest.len());
            for end in (0..=limit).rev() {
                let (head, tail) = rest.split_at(end);
                if matches!(first, Part::Cluster) && dns_label(head).is_err() {
                    continue;
                }
                if matches(more, tail, captured) {
                    if matches!(first, Part::Cluster) {
                        *captured = Some(head.to_string());
                    }
                    return true;
                }
            }
            false
        }
    }
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = raw;
        let mut clusters = 0;
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("{cluster}") {
                if !literal.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut literal)));
                }
                parts.push(Part::Cluster);
                clusters += 1;
                rest = r;
            } else if let Some(r) = rest.strip_prefix('*') {
                if !literal.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut literal)));
                }
                parts.push(Part::Any);
                rest = r;
            } else {
                let c = rest.chars().next().expect("not empty");
                literal.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if clusters != 1 {
            return Err(format!(
                "identity pattern {raw:?} must contain {{cluster}} exactly once, e.g. system:open-cluster-management:cluster:{{cluster}}:addon:{}:agent:*",
                keys::ADDON_NAME
            ));
        }
        if parts
            .windows(2)
            .any(|w| !matches!(w[0], Part::Literal(_)) && !matches!(w[1], Part::Literal(_)))
        {
            return Err(format!(
                "identity pattern {raw:?} has {{cluster}} or * next to another wildcard: separate them with literal text"
            ));
        }
        Ok(Self {
            raw: raw.to_string(),
            parts,
        })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// The configured patterns, tried in order.
#[derive(Clone, Debug)]
pub struct IdentityMap(pub Vec<Pattern>);

impl Default for IdentityMap {
    fn default() -> Self {
        Self(vec![Pattern::ocm_addon(keys::ADDON_NAME)])
    }
}

impl IdentityMap {
    pub fn cluster(&self, subject: &str) -> Result<String, IdentityError> {
        self.0
            .iter()
            .find_map(|p| p.cluster(subject))
            .ok_or_else(|| IdentityError::NoMatch {
                subject: subject.to_string(),
                patterns: self.0.iter().map(|p| p.to_string()).collect(),
            })
    }
}

/// What a client certificate says, once rustls has verified it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Subject common name (the Kubernetes user).
    pub subject: String,
    /// Seconds since the Unix epoch from which it is valid.
    pub not_before: i64,
    /// Seconds since the Unix epoch after which it is no longer valid.
    pub not_after: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("no client certificate: the hub requires mutual TLS")]
    NoCertificate,
    #[error("the client certificate cannot be read: {0}")]
    Unreadable(String),
    #[error("the client certificate has no subject common name")]
    NoCommonName,
    #[error(
        "client certificate subject {subject:?} matches no identity pattern ({}): issue the agent an OCM addon certificate or add a --grpc-identity pattern",
        .patterns.join(", ")
    )]
    NoMatch {
        subject: String,
        patterns: Vec<String>,
    },
}

/// Who is at the other end of a stream, from its verified certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub cluster: String,
    /// Seconds since the Unix epoch from which the certificate is valid.
    pub not_before: i64,
    /// Seconds since the Unix epoch after which the certificate is no
    /// longer valid.
    pub not_after: i64,
    /// [`fingerprint`] of the certificate.
    pub fingerprint: String,
}

/// The SHA-256 of a DER certificate, lowercase hex: what the deny list
/// names (`openssl x509 -in tls.crt -outform DER | sha256sum`).
pub fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reads the subject and expiry of a DER certificate.
pub fn cert_info(der: &[u8]) -> Result<CertInfo, IdentityError> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| IdentityError::Unreadable(e.to_string()))?;
    let subject = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or(IdentityError::NoCommonName)?
        .to_string();
    Ok(CertInfo {
        subject,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}

/// When the certificate `der` expires (Unix time), whatever its subject.
pub fn not_after(der: &[u8]) -> Option<i64> {
    X509Certificate::from_der(der)
        .ok()
        .map(|(_, cert)| cert.validity().not_after.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ocm_addon_certificates_map_out_of_the_box() {
        let map = IdentityMap::default();
        let cases = [
            (
                "system:open-cluster-management:cluster:cluster1:addon:argocd-pull:agent:spoke-agent",
                Some("cluster1"),
            ),
            (
                "system:open-cluster-management:cluster:prod-eu-1:addon:argocd-pull:agent:x",
                Some("prod-eu-1"),
            ),
            // Another addon's certificate of the same cluster is not ours.
            (
                "system:open-cluster-management:cluster:cluster1:addon:work-manager:agent:x",
                None,
            ),
            // A colon cannot smuggle a second cluster in.
            (
                "system:open-cluster-management:cluster:a:b:addon:argocd-pull:agent:x",
                None,
            ),
            // Not a DNS label.
            (
                "system:open-cluster-management:cluster:Bad_Name:addon:argocd-pull:agent:x",
                None,
            ),
            (
                "system:open-cluster-management:cluster:cluster1:addon:argocd-pull:agent:x:extra",
                None,
            ),
            ("cluster1", None),
            ("", None),
        ];
        for (subject, want) in cases {
            assert_eq!(map.cluster(subject).ok().as_deref(), want, "{subject:?}");
        }
    }

    #[test]
    fn custom_patterns() {
        let map = IdentityMap(vec![
            "spoke-{cluster}".parse().unwrap(),
            "{cluster}".parse().unwrap(),
        ]);
        assert_eq!(map.cluster("spoke-c1").unwrap(), "c1");
        assert_eq!(map.cluster("c9").unwrap(), "c9");
        let map = IdentityMap(vec!["agent.{cluster}.example".parse().unwrap()]);
        assert_eq!(map.cluster("agent.c2.example").unwrap(), "c2");
        let err = map.cluster("someone").unwrap_err().to_string();
        assert!(
            err.contains("\"someone\"") && err.contains("agent.{cluster}.example"),
            "{err}"
        );
    }

    #[test]
    fn bad_patterns_say_why() {
        for (raw, want) in [
            ("no-placeholder", "exactly once"),
            ("{cluster}-{cluster}", "exactly once"),
            ("x:{cluster}*", "next to another wildcard"),
        ] {
            let err = raw.parse::<Pattern>().unwrap_err();
            assert!(err.contains(want), "{raw}: {err}");
        }
    }

    #[test]
    fn reads_subject_and_expiry_from_a_certificate() {
        let ca = testenv::pki::Ca::new("ca").unwrap();
        let cert = ca.agent("c1", "a").unwrap();
        let der = x509_parser::pem::parse_x509_pem(cert.cert_pem.as_bytes())
            .unwrap()
            .1
            .contents;
        let info = cert_info(&der).unwrap();
        assert_eq!(IdentityMap::default().cluster(&info.subject).unwrap(), "c1");
        assert!(info.not_after > 0);
        let fp = fingerprint(&der);
        assert_eq!(fp.len(), 64);
        assert!(
            fp.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(
            fingerprint(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(matches!(
            cert_info(b"junk"),
            Err(IdentityError::Unreadable(_))
        ));
    }
}
