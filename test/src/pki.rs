//! The certificates a test cluster needs: one CA that both signs the API
//! server's serving certificate and client certificates, and is the
//! controller-manager's CSR signing CA, so that certificates issued through
//! the real CSR API (as OCM registration does) are trusted by the API server.

use std::net::{IpAddr, Ipv4Addr};

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
