//! From when until when a certificate is valid, and when it is due for
//! renewal: read from its PEM or DER, for the hub (renewing its
//! certificates, its `/status` page) and `kubectl argocd-pull certs`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// From when until when a certificate is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// Due for renewal once less than a third of its lifetime is left (or
    /// it is not valid at all at `now`).
    pub fn due(&self, now: SystemTime) -> bool {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        match self.not_after.duration_since(now) {
            Ok(left) => now < self.not_before || left < lifetime / 3,
            Err(_) => true,
        }
    }

    /// When [`Self::due`] becomes true: a third of the lifetime before
    /// expiry.
    pub fn renew_at(&self) -> SystemTime {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_after - lifetime / 3
    }

    pub fn expired(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }
}

/// The validity of the first certificate in `pem`.
pub fn validity(pem: &str) -> Option<Validity> {
    let first = x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .next()?
        .ok()?;
    of_der(&first.contents)
}

/// The validity of a DER certificate.
pub fn of_der(der: &[u8]) -> Option<Validity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let secs = |t: i64| UNIX_EPOCH + Duration::from_secs(t.max(0) as u64);
    Some(Validity {
        not_before: secs(cert.validity().not_before.timestamp()),
        not_after: secs(cert.validity().not_after.timestamp()),
    })
}
