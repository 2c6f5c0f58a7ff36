use super::*;

#[test]
fn durations_read_in_milliseconds_seconds_minutes_and_hours_and_print_back() {
    for (text, ms) in [("250ms", 250), ("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000)] {
        assert_eq!(VirtualDuration::parse(text), Some(VirtualDuration(ms)));
        assert_eq!(VirtualDuration(ms).to_string(), text);
    }
    for bad in ["", "5", "m", "1.5s", "3d", "-1s"] {
        assert_eq!(VirtualDuration::parse(bad), None, "{bad}");
    }
    assert_eq!(VirtualDuration(1_500).to_string(), "1.500s");
    // Regression: a scenario could advance for 10^12 hours.
    assert_eq!(VirtualDuration::parse("168h"), Some(VirtualDuration(MAX_DURATION_MS)));
    assert_eq!(VirtualDuration::parse("169h"), None);
    assert_eq!(VirtualDuration::parse("1000000000000h"), None);
}

fn scenario_with(azure: &str, step: &str) -> Result<Scenario, ScenarioError> {
    let text =
        format!("name: arm limits\nconfig:\n  loadBalancerSku: standardV2\nazure:\n{azure}\nsteps:\n  - {step}\n");
    parse(Path::new("arm.yaml"), &text)
}

#[test]
fn arm_limits_default_to_arms_published_sizes_and_each_field_given_replaces_only_itself() {
    let default = scenario_with("  outboundServices: []", "settle:").expect("valid");
    assert_eq!(default.azure.arm_limits, ArmLimitsSetting(Some(ArmLimits::default())));
    let partial =
        scenario_with("  armLimits: {writes: {burst: 20}, otherClientWritesPerSecond: 3}", "settle:").expect("valid");
    let want = ArmLimits {
        writes: BucketLimits { burst: 20, per_second: 10 },
        reads: BucketLimits { burst: 250, per_second: 25 },
        other_client_writes_per_second: 3,
        report_remaining: true,
    };
    assert_eq!(partial.azure.arm_limits, ArmLimitsSetting(Some(want)));
    let unlimited = scenario_with("  armLimits: unlimited", "settle:").expect("valid");
    assert_eq!(unlimited.azure.arm_limits, ArmLimitsSetting(None));
}

#[test]
fn an_unknown_arm_limits_key_a_zero_refill_or_another_word_is_an_invalid_scenario_with_its_line() {
    for azure in [
        "  armLimits: {writes: {size: 1}}",
        "  armLimits: {reads: {perSecond: 0}}",
        "  armLimits: none",
        "  armLimits: {burst: 1}",
    ] {
        let error = scenario_with(azure, "settle:").expect_err(azure).to_string();
        assert!(error.contains("arm.yaml:5"), "{azure}: {error}");
    }
}

#[test]
fn an_arm_spend_step_reads_its_writes_and_reads_with_zero_for_the_one_not_given() {
    let scenario = scenario_with("  armLimits: {}", "arm-spend: {writes: 150}").expect("valid");
    assert_eq!(scenario.steps, vec![Step::ArmSpend(ArmSpendStep { writes: 150, reads: 0 })]);
    assert!(scenario_with("  armLimits: {}", "arm-spend: {write: 1}").is_err());
}

#[test]
fn a_scenario_names_a_perturbation_as_explore_writes_it_and_a_malformed_one_is_refused_with_the_forms() {
    let text = |p: &str| {
        format!("name: repro\nconfig:\n  loadBalancerSku: standardV2\nsteps:\n  - settle:\nperturbation: {p}\n")
    };
    let read = parse(Path::new("repro.yaml"), &text("stale:4:1")).expect("valid");
    assert_eq!(read.perturbation, Some(Perturbation::Stale { at: 4, listed_at: 1 }));
    let error = parse(Path::new("repro.yaml"), &text("crash:4")).expect_err("not a perturbation").to_string();
    assert!(error.contains("perturbation: \"crash:4\" is not a perturbation: crash-before:N"), "{error}");
}
