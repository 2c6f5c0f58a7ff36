use super::*;

fn lease(holder: Option<&str>, renewed: Option<Timestamp>, duration: Option<i32>) -> Lease {
    Lease {
        metadata: ObjectMeta::default(),
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(MicroTime),
            lease_duration_seconds: duration,
            ..Default::default()
        }),
    }
}

#[test]
fn a_lease_is_free_without_holder_or_renewal_else_held_until_its_renewal_plus_its_own_duration() {
    let renewed = Timestamp::from_second(1_800_000_000).unwrap();
    let default = Duration::from_secs(900);
    let at = |secs: i64| Some(renewed.checked_add(SignedDuration::from_secs(secs)).unwrap());
    let cases = [
        ("no holder", lease(None, Some(renewed), Some(60)), None),
        ("an empty holder (released)", lease(Some(""), Some(renewed), Some(60)), None),
        ("never renewed", lease(Some("rp"), None, Some(60)), None),
        ("its own duration", lease(Some("rp"), Some(renewed), Some(60)), at(60)),
        ("no duration: ours", lease(Some("rp"), Some(renewed), None), at(900)),
        ("a negative duration counts as zero", lease(Some("rp"), Some(renewed), Some(-5)), at(0)),
    ];
    for (case, lease, expected) in cases {
        assert_eq!(held_until(&lease, default), expected, "{case}");
    }
}

#[test]
fn the_replica_identity_is_the_given_one_else_the_pod_or_host_name_with_a_random_suffix() {
    let env = |pod: Option<&'static str>, host: Option<&'static str>| {
        move |name: &str| match name {
            "POD_NAME" => pod.map(str::to_owned),
            "HOSTNAME" => host.map(str::to_owned),
            _ => None,
        }
    };
    assert_eq!(replica_identity(Some("given"), env(Some("pod"), None)), "given");
    let cases = [(Some("pod"), Some("host"), "pod_"), (None, Some("host"), "host_"), (None, None, "clb-host_")];
    for (pod, host, prefix) in cases {
        let (one, two) = (replica_identity(None, env(pod, host)), replica_identity(Some(""), env(pod, host)));
        assert!(one.starts_with(prefix) && two.starts_with(prefix), "{one} {two} start with {prefix}");
        assert_eq!(one.len(), prefix.len() + 16, "{one}");
        assert_ne!(one, two, "two processes on one host get two identities");
    }
}

#[test]
fn election_settings_need_an_identity_and_retry_period_below_renew_deadline_below_lease_duration() {
    let secs = Duration::from_secs;
    let cases = [
        ("the defaults", "a", secs(15), secs(10), secs(2), true),
        ("no identity", "", secs(15), secs(10), secs(2), false),
        ("deadline = duration", "a", secs(10), secs(10), secs(2), false),
        ("retry = deadline", "a", secs(15), secs(10), secs(10), false),
        ("no retry period", "a", secs(15), secs(10), Duration::ZERO, false),
    ];
    for (case, identity, lease_duration, renew_deadline, retry_period, valid) in cases {
        let config = ElectionConfig { lease_duration, renew_deadline, retry_period, ..ElectionConfig::new(identity) };
        assert_eq!(config.validate().is_ok(), valid, "{case}");
    }
}
