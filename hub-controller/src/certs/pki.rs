//! Certificate arithmetic, without I/O: new CAs, serving certificates, when
//! one is due for renewal, and the trust bundle that spans a CA rotation.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A PEM certificate with its PEM key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

pub use argocd_pull_core::validity::{Validity, validity};

fn set_validity(params: &mut CertificateParams, now: SystemTime, lifetime: Duration) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    // A minute of slack for clocks a little behind ours.
    params.not_before = epoch + since.saturating_sub(Duration::from_secs(60));
    params.not_after = epoch + (since + lifetime);
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "argocd-pull");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// The key type of a CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA P-256: small, which matters for the serving CA, whose
    /// certificate travels in a 1,024-character AddOnDeploymentConfig value.
    EcdsaP256,
    /// RSA 2048: OCM's addon-manager signs CustomSigner CSRs only with an
    /// RSA CA key (it parses it as PKCS#1).
    Rsa2048,
}

fn generate(kind: KeyKind) -> Result<KeyPair, rcgen::Error> {
    match kind {
        KeyKind::EcdsaP256 => KeyPair::generate(),
        KeyKind::Rsa2048 => {
            use rsa::pkcs8::EncodePrivateKey;
            let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)
                .map_err(|_| rcgen::Error::KeyGenerationUnavailable)?;
            let der = key
                .to_pkcs8_der()
                .map_err(|_| rcgen::Error::KeyGenerationUnavailable)?;
            KeyPair::from_pkcs8_der_and_sign_algo(
                &rustls::pki_types::PrivatePkcs8KeyDer::from(der.as_bytes()),
                &rcgen::PKCS_RSA_SHA256,
            )
        }
    }
}

/// A new self-signed CA valid from a minute before `now` for `lifetime`.
pub fn new_ca(
    common_name: &str,
    kind: KeyKind,
    now: SystemTime,
    lifetime: Duration,
) -> Result<Issued, rcgen::Error> {
    let key = generate(kind)?;
    let mut params = ca_params(common_name);
    set_validity(&mut params, now, lifetime);
    let cert = params.self_signed(&key)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A serving certificate for `sans` (DNS names or IP addresses) signed by
/// the CA `ca` (made by [`new_ca`] with `ca_name`).
pub fn issue_serving(
    ca: &Issued,
    ca_name: &str,
    sans: &[String],
    now: SystemTime,
    lifetime: Duration,
) -> Result<Issued, rcgen::Error> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::new(ca_params(ca_name), ca_key);
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        sans.first()
            .map(String::as_str)
            .unwrap_or("argocd-pull-hub"),
    );
    params.distinguished_name = dn;
    params.subject_alt_names = sans
        .iter()
        .map(|s| match s.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(s.as_str().try_into()?)),
        })
        .collect::<Result<_, rcgen::Error>>()?;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, now, lifetime);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The certificates in a PEM bundle, in order.
fn certs(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .collect()
}

/// Whether `issued` is a usable pair: a certificate and a key that parse.
pub fn usable(issued: &Issued) -> bool {
    validity(&issued.cert_pem).is_some() && KeyPair::from_pem(&issued.key_pem).is_ok()
}

/// The trust bundle after `current` took over: `current` first, then every
/// certificate of `previous` that is still valid at `now` and is not
/// `current`, so that certificates the old CA signed keep working until
/// they expire.
pub fn bundle(current: &str, previous: &str, now: SystemTime) -> String {
    let first = certs(current);
    let mut out: Vec<CertificateDer<'static>> = first.clone();
    for c in certs(previous) {
        if out.contains(&c) {
            continue;
        }
        if argocd_pull_core::validity::of_der(&c).is_some_and(|v| !v.expired(now)) {
            out.push(c);
        }
    }
    out.iter().map(to_pem).collect()
}

fn to_pem(der: &CertificateDer<'_>) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|l| std::str::from_utf8(l).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn due_once_a_third_of_the_lifetime_is_left() {
        let start = UNIX_EPOCH + 1000 * DAY;
        let v = Validity {
            not_before: start,
            not_after: start + 90 * DAY,
        };
        assert!(!v.due(start + DAY));
        assert!(!v.due(start + 59 * DAY));
        assert!(v.due(start + 61 * DAY));
        assert!(v.due(start + 91 * DAY));
        assert!(v.due(start - DAY), "not valid yet");
        assert!(v.expired(start + 90 * DAY));
        assert!(!v.expired(start + 89 * DAY));
    }

    /// A serving CA of ten years from `now`, as the hub-controller makes.
    fn serving_ca(now: SystemTime) -> Issued {
        new_ca(
            "argocd-pull serving CA",
            KeyKind::EcdsaP256,
            now,
            3650 * DAY,
        )
        .unwrap()
    }

    #[test]
    fn a_new_ca_has_the_asked_validity_and_fits_the_addon_variable() {
        let now = SystemTime::now();
        let ca = serving_ca(now);
        assert!(usable(&ca));
        let v = validity(&ca.cert_pem).unwrap();
        let lifetime = v.not_after.duration_since(v.not_before).unwrap();
        assert!(lifetime >= 3650 * DAY && lifetime <= 3650 * DAY + Duration::from_secs(120));
        let variable = argocd_pull_addon::hub_ca_variable(&ca.cert_pem).len();
        assert!(variable <= 1024, "{variable} characters");
    }

    #[test]
    fn a_serving_certificate_chains_to_its_ca_and_names_every_address() {
        let now = SystemTime::now();
        let ca = serving_ca(now);
        let leaf = issue_serving(
            &ca,
            "argocd-pull serving CA",
            &["hub.example.com".into(), "127.0.0.1".into()],
            now,
            90 * DAY,
        )
        .unwrap();
        let der = certs(&leaf.cert_pem).remove(0);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let ca_der = certs(&ca.cert_pem).remove(0);
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        assert_eq!(cert.issuer(), ca_cert.subject());
        let sans = cert.subject_alternative_name().unwrap().unwrap().value;
        let names: Vec<String> = sans.general_names.iter().map(|n| n.to_string()).collect();
        assert!(
            names.iter().any(|n| n.contains("hub.example.com")),
            "{names:?}"
        );
        assert!(names.iter().any(|n| n.contains("7f:00:00:01")), "{names:?}");
    }

    #[test]
    fn the_bundle_keeps_the_old_ca_until_it_expires() {
        let now = SystemTime::now();
        let old = new_ca("old", KeyKind::EcdsaP256, now - 300 * DAY, 365 * DAY).unwrap();
        let new = new_ca("new", KeyKind::EcdsaP256, now, 365 * DAY).unwrap();
        let b = bundle(&new.cert_pem, &old.cert_pem, now);
        assert_eq!(certs(&b).len(), 2);
        assert_eq!(certs(&b)[0], certs(&new.cert_pem)[0], "current first");
        // Rotating again later: the first one has expired by then.
        let newer = new_ca("newer", KeyKind::EcdsaP256, now + 200 * DAY, 365 * DAY).unwrap();
        let b2 = bundle(&newer.cert_pem, &b, now + 200 * DAY);
        assert_eq!(
            certs(&b2),
            vec![
                certs(&newer.cert_pem)[0].clone(),
                certs(&new.cert_pem)[0].clone()
            ]
        );
        // Idempotent.
        assert_eq!(bundle(&newer.cert_pem, &b2, now + 200 * DAY), b2);
    }

    #[test]
    fn an_rsa_ca_key_is_what_ocm_can_sign_with() {
        let ca = new_ca("signing", KeyKind::Rsa2048, SystemTime::now(), DAY).unwrap();
        assert!(usable(&ca));
        assert!(ca.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let der = rustls::pki_types::PrivateKeyDer::from_pem_slice(ca.key_pem.as_bytes()).unwrap();
        use rsa::pkcs8::DecodePrivateKey;
        rsa::RsaPrivateKey::from_pkcs8_der(der.secret_der()).expect("an RSA key");
    }

    #[test]
    fn pem_round_trips() {
        let ca = new_ca("x", KeyKind::EcdsaP256, SystemTime::now(), DAY).unwrap();
        let der = certs(&ca.cert_pem).remove(0);
        assert_eq!(to_pem(&der).trim(), ca.cert_pem.trim().replace("\r", ""));
    }
}
