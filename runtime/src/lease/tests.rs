use super::*;

#[test]
fn decision_table() {
    let cases = [
        (None, false, Next::Take),
        (Some(""), false, Next::Take),
        (Some("me"), false, Next::Renew),
        (Some("me"), true, Next::Take),
        (
            Some("other"),
            false,
            Next::Wait {
                holder: "other".into(),
            },
        ),
        (Some("other"), true, Next::Take),
    ];
    for (holder, expired, want) in cases {
        assert_eq!(
            decide(holder, "me", expired),
            want,
            "{holder:?} expired={expired}"
        );
    }
}

#[test]
fn expiry_is_measured_on_the_local_clock_from_the_last_change() {
    let mut obs = Observer::default();
    let t0 = Instant::now();
    let fallback = Duration::from_secs(15);
    let spec = |renew: &str| LeaseSpec {
        holder_identity: Some("other".into()),
        lease_duration_seconds: Some(10),
        renew_time: Some(MicroTime(renew.parse().unwrap())),
        ..Default::default()
    };
    // Is the lease renewed at `renew` expired, seen `secs` after t0?
    let mut expired_at = |renew: &str, secs: u64| {
        obs.observe(&spec(renew), t0 + Duration::from_secs(secs), fallback)
    };
    // A renewTime far in the past means nothing by itself: clocks differ.
    assert!(!expired_at("2000-01-01T00:00:00Z", 0));
    assert!(!expired_at("2000-01-01T00:00:00Z", 9));
    assert!(expired_at("2000-01-01T00:00:00Z", 11));
    // A renewal restarts the count.
    assert!(!expired_at("2000-01-01T00:00:05Z", 12));
    assert!(!expired_at("2000-01-01T00:00:05Z", 21));
    assert!(expired_at("2000-01-01T00:00:05Z", 23));
    // Without a duration on the lease, the configured one applies.
    let mut obs = Observer::default();
    let bare = LeaseSpec {
        holder_identity: Some("other".into()),
        ..Default::default()
    };
    assert!(!obs.observe(&bare, t0, fallback));
    assert!(!obs.observe(&bare, t0 + Duration::from_secs(14), fallback));
    assert!(obs.observe(&bare, t0 + Duration::from_secs(16), fallback));
}
