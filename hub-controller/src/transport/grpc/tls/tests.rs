use super::*;

fn served(acceptor: &Acceptor) -> Vec<u8> {
    acceptor.current.lock().unwrap().1.clone()
}

/// The files of a server in `dir`, the client CA `ca`'s written.
fn files_in(dir: &Path, ca: &testenv::pki::Ca) -> TlsFiles {
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        client_ca: dir.join("ca.crt"),
    };
    std::fs::write(&files.client_ca, &ca.pem.cert_pem).unwrap();
    files
}

#[test]
fn a_certificate_is_only_ever_used_with_its_own_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = testenv::pki::Ca::new("ca").unwrap();
    let (a, b) = (
        ca.serving(&["a"], &[]).unwrap(),
        ca.serving(&["b"], &[]).unwrap(),
    );
    let files = files_in(dir.path(), &ca);
    std::fs::write(&files.cert, &b.cert_pem).unwrap();
    std::fs::write(&files.key, &a.key_pem).unwrap();
    let metrics = GrpcMetrics::default();
    let identities = IdentityMap::default();
    let err = Acceptor::new(files.clone(), identities.clone(), metrics.clone())
        .err()
        .unwrap();
    assert!(err.is::<KeyMismatch>(), "{err}");
    assert!(
        err.to_string().contains("does not belong to the key"),
        "{err}"
    );

    std::fs::write(&files.cert, &a.cert_pem).unwrap();
    let acceptor = Acceptor::new(files.clone(), identities, metrics)
        .unwrap()
        .with_reload_check(Duration::ZERO);
    let first = served(&acceptor);
    // Half a renewal: the new certificate, the old key.
    std::fs::write(&files.cert, &b.cert_pem).unwrap();
    acceptor.acceptor();
    assert_eq!(served(&acceptor), first, "the previous pair stays");
    // The key lands: the new pair is used.
    std::fs::write(&files.key, &b.key_pem).unwrap();
    acceptor.acceptor();
    assert_eq!(
        served(&acceptor),
        [
            b.cert_pem.as_bytes(),
            b.key_pem.as_bytes(),
            ca.pem.cert_pem.as_bytes()
        ]
        .concat()
    );
}

/// The expiry of the first certificate in `pem`.
fn not_after_of(pem: &str) -> Option<i64> {
    let der = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()?;
    identity::not_after(&der)
}

#[test]
fn the_expiry_gauge_shows_the_certificate_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca = testenv::pki::Ca::new("ca").unwrap();
    let a = ca.serving(&["a"], &[]).unwrap();
    let files = files_in(dir.path(), &ca);
    std::fs::write(&files.cert, &a.cert_pem).unwrap();
    std::fs::write(&files.key, "not a key").unwrap();
    let metrics = GrpcMetrics::default();
    assert!(Acceptor::new(files.clone(), IdentityMap::default(), metrics.clone()).is_err());
    assert_eq!(metrics.serving_not_after(), None, "nothing served yet");

    std::fs::write(&files.key, &a.key_pem).unwrap();
    Acceptor::new(files, IdentityMap::default(), metrics.clone()).unwrap();
    let expected = not_after_of(&a.cert_pem);
    assert!(expected.is_some());
    assert_eq!(metrics.serving_not_after(), expected);
}
