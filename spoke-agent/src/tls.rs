//! The agent's certificates, read from disk at every connection attempt and
//! watched while connected: OCM rotates addon client certificates every
//! 24 hours, and an agent must pick the new one up without a restart
//! (argocd-agent read them once and went stale with `expired certificate`).

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use argocd_pull_proto::content;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use x509_parser::prelude::{FromDer, X509Certificate};

/// Where the agent's TLS material is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// The files as read for one connection.
pub struct Loaded {
    pub config: ClientTlsConfig,
    /// Changes whenever any of the files does.
    pub fingerprint: String,
    pub subject: String,
    /// Seconds since the Unix epoch.
    pub not_after: i64,
}

fn read(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
}

impl TlsFiles {
    /// A hash of the files' contents, `None` while one cannot be read (a
    /// Secret volume is swapped atomically, but be safe).
    pub fn fingerprint(&self) -> Option<String> {
        let parts = [
            std::fs::read(&self.cert).ok()?,
            std::fs::read(&self.key).ok()?,
            std::fs::read(&self.ca).ok()?,
        ];
        Some(content::hash_bytes(&parts.concat()))
    }

    /// Reads and checks the files. An expired certificate is an error that
    /// says so: dialling with it would only be refused by the hub.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let (cert, key, ca) = (read(&self.cert)?, read(&self.key)?, read(&self.ca)?);
        let fingerprint = content::hash_bytes(&[cert.as_slice(), &key, &ca].concat());
        let (_, pem) = x509_parser::pem::parse_x509_pem(&cert).map_err(|e| {
            anyhow::anyhow!("{} is not a PEM certificate: {e}", self.cert.display())
        })?;
        let (_, x509) = X509Certificate::from_der(&pem.contents)
            .map_err(|e| anyhow::anyhow!("{} cannot be parsed: {e}", self.cert.display()))?;
        let subject = x509
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string();
        // OCM (through the kubelet) swaps the certificate and key together,
        // but a reader can still open the new certificate and the old key
        // around the swap: a mismatched pair is "not yet", never a dial.
        let spki = x509.public_key().raw;
        if !key_matches(&key, spki).map_err(|e| {
            anyhow::anyhow!("{} is not a usable private key: {e}", self.key.display())
        })? {
            anyhow::bail!(
                "client certificate {} does not match its key {} (a renewal in progress?): trying again shortly",
                self.cert.display(),
                self.key.display()
            );
        }
        let not_after = x509.validity().not_after.timestamp();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64;
        if not_after <= now {
            anyhow::bail!(
                "client certificate {} ({subject}) expired at {}: waiting for a renewed one (OCM rotates it every 24 hours)",
                self.cert.display(),
                x509.validity().not_after
            );
        }
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key));
        Ok(Loaded {
            config,
            fingerprint,
            subject,
            not_after,
        })
    }
}

/// Whether the PEM private key `key` is the one of the public key `spki`
/// (DER SubjectPublicKeyInfo of the certificate). A key type whose public
/// half cannot be derived is taken as matching: the handshake decides.
fn key_matches(key: &[u8], spki: &[u8]) -> Result<bool, String> {
    use rustls::pki_types::{PrivateKeyDer, pem::PemObject};
    let der = PrivateKeyDer::from_pem_slice(key).map_err(|e| e.to_string())?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| e.to_string())?;
    Ok(signer.public_key().is_none_or(|p| p.as_ref() == spki))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_reports_changes_and_refuses_unreadable_files() {
        let dir = tempfile::tempdir().unwrap();
        let ca = testenv::pki::Ca::new("ca").unwrap();
        let cert = ca.agent("c1", "a").unwrap();
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: dir.path().join("ca.crt"),
        };
        assert!(files.fingerprint().is_none());
        let err = |f: &TlsFiles| f.load().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(&files).contains("cannot read"));
        std::fs::write(&files.cert, &cert.cert_pem).unwrap();
        std::fs::write(&files.key, &cert.key_pem).unwrap();
        std::fs::write(&files.ca, &ca.pem.cert_pem).unwrap();
        let loaded = files.load().unwrap();
        assert!(loaded.subject.ends_with(":agent:a"));
        assert_eq!(files.fingerprint().unwrap(), loaded.fingerprint);
        let renewed = ca
            .client(
                "system:open-cluster-management:cluster:c1:addon:argocd-pull:agent:a",
                None,
            )
            .unwrap();
        std::fs::write(&files.cert, &renewed.cert_pem).unwrap();
        assert_ne!(files.fingerprint().unwrap(), loaded.fingerprint);
        // Halfway through a renewal: the new certificate, the old key.
        let e = err(&files);
        assert!(e.contains("does not match its key"), "{e}");
        std::fs::write(&files.key, &renewed.key_pem).unwrap();
        assert!(files.load().is_ok(), "the pair is whole again");
        let expired = ca
            .client_valid("agent", (2020, 1, 1), (2021, 1, 1))
            .unwrap();
        std::fs::write(&files.cert, &expired.cert_pem).unwrap();
        std::fs::write(&files.key, &expired.key_pem).unwrap();
        let e = err(&files);
        assert!(
            e.contains("expired at") && e.contains("waiting for a renewed one"),
            "{e}"
        );
        std::fs::write(&files.cert, "junk").unwrap();
        assert!(err(&files).contains("not a PEM certificate"));
    }
}
