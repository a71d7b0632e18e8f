//! The certificates a test cluster needs: one CA that both signs the API
//! server's serving certificate and client certificates, and is the
//! controller-manager's CSR signing CA, so that certificates issued through
//! the real CSR API (as OCM registration does) are trusted by the API server.
//!
//! Also how the harness puts secrets on disk: private keys are mode 0600
//! from the moment they exist, and a certificate and its key change
//! together ([`write_files_atomically`]), so a reader never pairs a new
//! certificate with an old key.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A PEM certificate and its PEM private key.
#[derive(Clone, Debug)]
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority that can issue serving and client certificates.
pub struct Ca {
    pub pem: CertKey,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(common_name: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let pem = CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Ok(Self {
            pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn serving(&self, dns: &[&str], ips: &[IpAddr]) -> Result<CertKey, rcgen::Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(dns.first().copied().unwrap_or("server"), None);
        params.subject_alt_names = dns
            .iter()
            .map(|d| Ok(SanType::DnsName((*d).try_into()?)))
            .chain(ips.iter().map(|ip| Ok(SanType::IpAddress(*ip))))
            .collect::<Result<_, rcgen::Error>>()?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate; Kubernetes reads the user from the common name
    /// and the group from the organization.
    pub fn client(&self, user: &str, group: Option<&str>) -> Result<CertKey, rcgen::Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(user, group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    /// The client certificate OCM signs for agent `agent` of the argocd-pull
    /// addon on `cluster` (its subject, no group).
    pub fn agent(&self, cluster: &str, agent: &str) -> Result<CertKey, rcgen::Error> {
        self.client(
            &format!(
                "system:open-cluster-management:cluster:{cluster}:addon:argocd-pull:agent:{agent}"
            ),
            None,
        )
    }

    /// A client certificate valid only between two dates (year, month,
    /// day, UTC): one that has expired, or is not valid yet.
    pub fn client_valid(
        &self,
        user: &str,
        from: (i32, u8, u8),
        until: (i32, u8, u8),
    ) -> Result<CertKey, rcgen::Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(user, None);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
        self.sign(params)
    }

    /// A client certificate valid from a minute ago for `lifetime`, to
    /// watch one expire.
    pub fn client_expiring(
        &self,
        user: &str,
        lifetime: std::time::Duration,
    ) -> Result<CertKey, rcgen::Error> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970");
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(user, None);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = epoch + (now - std::time::Duration::from_secs(60));
        params.not_after = epoch + (now + lifetime);
        self.sign(params)
    }

    fn sign(&self, mut params: CertificateParams) -> Result<CertKey, rcgen::Error> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn dn(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(o) = organization {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

/// The addresses an API server's serving certificate must cover: loopback,
/// and the in-cluster names and service IP that pods would use.
pub fn apiserver_sans() -> (Vec<&'static str>, Vec<IpAddr>) {
    (
        vec![
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        ],
    )
}

/// A fresh EC key pair (PKCS#8 private key PEM, public key PEM), used to
/// sign and verify service-account tokens.
pub fn signing_key() -> Result<(String, String), rcgen::Error> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// Writes `content` to `path` readable by its owner only (mode 0600, set
/// when the file is created, never after), through a temporary file
/// renamed into place, so a reader sees the old content or the new.
pub fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(content)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// Writes a set of files into `dir` so that they all change at once, the
/// way the kubelet updates a Secret volume: the files go into a new
/// timestamped folder (each mode 0600), a `..data` symlink is swapped to
/// it in one rename, and each name in `dir` is a symlink through `..data`.
/// A reader that opens `tls.crt` and then `tls.key` may see two versions
/// only if the swap falls between the two opens; it then finds a
/// mismatched pair and reads again, never a half-written file.
pub fn write_files_atomically(
    dir: &Path,
    files: &BTreeMap<String, Vec<u8>>,
) -> std::io::Result<()> {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let version = format!("..{stamp}");
    let fresh = dir.join(&version);
    std::fs::create_dir(&fresh)?;
    for (name, content) in files {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(fresh.join(name))?;
        f.write_all(content)?;
        f.sync_all()?;
    }
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o700))?;
    let data = dir.join("..data");
    let old = std::fs::read_link(&data).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&version, &tmp)?;
    std::fs::rename(&tmp, &data)?;
    for name in files.keys() {
        let link = dir.join(name);
        let is_link = std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            // A plain file from an earlier layout: replace it with the link.
            let _ = std::fs::remove_file(&link);
            symlink(Path::new("..data").join(name), &link)?;
        }
    }
    if let Some(old) = old.filter(|o| o != Path::new(&version)) {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_keys_are_owner_only_and_pairs_change_together() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("tls.key");
        write_private(&key, b"one").unwrap();
        write_private(&key, b"two").unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&key).unwrap(), b"two");

        let mount = dir.path().join("mount");
        for round in ["a", "b"] {
            let files: BTreeMap<String, Vec<u8>> = [
                ("tls.crt".to_string(), format!("cert-{round}").into_bytes()),
                ("tls.key".to_string(), format!("key-{round}").into_bytes()),
            ]
            .into();
            write_files_atomically(&mount, &files).unwrap();
            assert_eq!(
                std::fs::read(mount.join("tls.crt")).unwrap(),
                format!("cert-{round}").as_bytes()
            );
            assert_eq!(
                std::fs::read(mount.join("tls.key")).unwrap(),
                format!("key-{round}").as_bytes()
            );
            let real = std::fs::canonicalize(mount.join("tls.key")).unwrap();
            let mode = std::fs::metadata(real).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        // Only the current version is left.
        let versions = std::fs::read_dir(&mount)
            .unwrap()
            .filter(|e| {
                let n = e
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .into_owned();
                n.starts_with("..") && n != "..data"
            })
            .count();
        assert_eq!(versions, 1);
    }
}
