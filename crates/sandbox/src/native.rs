//! The native library (`clb-guest`) seen through the host's WIT types (feature `native`): the
//! conversions the guest's adapter (`guest/src/component.rs`) makes, from the same macro
//! (`clb_guest::wit_conversions!`) expanded over the host's generated types (here, where those
//! types are), and the backend-pool queue spoken to in the `backend-pools` interface's records
//! (`clb_guest::pool_adapter!`). The simulator's `native` puts the library behind its traits for
//! the differential runs: the integration tests (`clb-tests`) and the fuzz crate's `differential`
//! target (`fuzz-lib/`).

use crate::bindings::clb::reconciler::types as wit;
use crate::bindings::exports::clb::reconciler::backend_pools as wit_pools;
use crate::bindings::exports::clb::reconciler::validation as wit_validation;
use clb_guest::model;

// The guest adapter's own conversions and pool adapter, expanded over the host's generated types.
clb_guest::wit_conversions!();
clb_guest::pool_adapter!();

pub fn config_to_model(c: &wit::Config) -> clb_guest::Config {
    c.clone().into()
}

pub fn service_to_model(s: &wit::Service) -> model::Service {
    s.clone().into()
}

/// A verdict as comparable text: `kind` or `rejected:Reason:message`.
pub fn native_verdict(v: &clb_guest::Verdict) -> String {
    match v {
        clb_guest::Verdict::Admitted => "admitted".into(),
        clb_guest::Verdict::NothingToProvision => "nothing-to-provision".into(),
        clb_guest::Verdict::Cleanup => "cleanup".into(),
        clb_guest::Verdict::Ignored(why) => format!("ignored:{why}"),
        clb_guest::Verdict::Rejected(r) => format!("rejected:{}:{}", r.reason, r.message),
    }
}

/// What the library answers `admit-service` with, as comparable text: [`native_verdict`], then
/// each warning on a line of its own.
pub fn native_admission(config: &clb_guest::Config, service: &model::Service) -> String {
    let verdict = native_verdict(&clb_guest::admit_service(config, service));
    let warnings = clb_guest::admission::warnings(config, service);
    std::iter::once(verdict).chain(warnings).collect::<Vec<_>>().join("\n")
}

/// The component's answer, as [`native_admission`] writes the library's.
pub fn component_admission(a: &wit_validation::Admission) -> String {
    std::iter::once(component_verdict(&a.verdict)).chain(a.warnings.iter().cloned()).collect::<Vec<_>>().join("\n")
}

pub fn component_verdict(v: &wit_validation::Verdict) -> String {
    match v {
        wit_validation::Verdict::Admitted => "admitted".into(),
        wit_validation::Verdict::NothingToProvision => "nothing-to-provision".into(),
        wit_validation::Verdict::Cleanup => "cleanup".into(),
        wit_validation::Verdict::Ignored(why) => format!("ignored:{why}"),
        wit_validation::Verdict::Rejected(r) => format!("rejected:{}:{}", r.reason, r.message),
    }
}

/// The library's step as the component would return it, for comparing command streams.
pub fn step_to_wit(step: model::Step) -> wit::Step {
    step.into()
}

pub fn command_to_wit(command: model::Command) -> wit::Command {
    command.into()
}

pub fn observation_to_model(o: &wit::Observation) -> model::Observation {
    o.clone().into()
}

pub fn outcome_to_model(o: &wit::Outcome) -> model::Outcome {
    o.clone().into()
}
