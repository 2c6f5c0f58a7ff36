//! A second version of the logic, for the hot-swap and trap-recovery tests: the real tracker
//! (the guest's own sources) wrapped so that it differs from the built-in logic in exactly five
//! ways:
//!
//! * **its state version is the real tracker's plus one**: an envelope around the real
//!   tracker's payload plus one new field (the next id of the commands this wrapper issues
//!   itself); it imports every version the real tracker imports and refuses newer ones;
//! * **one changed rule**: a Service carrying [`tracker::LEGACY_ANNOTATION`] gets an extra
//!   Warning Event [`tracker::LEGACY_REASON`] each time it is observed;
//! * **one changed admission rule** ([`admission`]): a Service carrying
//!   [`admission::DENIED_ANNOTATION`] is rejected, at the webhook's door and by the tracker;
//! * **two trap triggers**: observing a Service carrying [`tracker::PANIC_ANNOTATION`] panics,
//!   and so does a tick at a time from [`tracker::PANIC_TICK_FROM_MS`] (below the destructive
//!   tick's), so the host's trap recovery and rollback can be tested on inputs the real guest
//!   handles;
//! * **a destructive tick**: a tick at or after [`tracker::DESTRUCTIVE_TICK_FROM_MS`] also
//!   proposes deleting the load balancer [`tracker::DESTRUCTIVE_TICK_TARGET`], which the real
//!   guest never does, so the host's swap self-check can be tested end to end.
//!
//! With the `destructive-tick` feature every tick is destructive, whatever the time: the host's
//! swap self-check must refuse that build (`tests/build.rs` builds both).
//!
//! Why the guest's modules are included by path rather than through the `clb-guest` crate: on
//! `wasm32` that crate exports the `clb` world itself, and two crates exporting the same
//! component functions cannot be linked into one module. Including the sources also reuses the
//! real adapter (`component.rs`) unchanged, with this crate's `tracker` in place of the real one.
//!
//! `tests/wit` is a link to the workspace's `wit/`: the adapter names the WIT folder relative to
//! its crate, as `../wit`.
//!
//! Never built into the product: only `tests/build.rs` builds it.

#[path = "../../../guest/src/admission.rs"]
mod real_admission;

/// The real admission rules and the changed rule at the door: a LoadBalancer Service carrying
/// [`admission::DENIED_ANNOTATION`] is refused, by `admit-service` (the webhook) and by the
/// tracker alike, as the real tracker asks `crate::admission` what to do with a Service.
pub mod admission {
    pub use crate::real_admission::*;

    use crate::config::Config;
    use crate::model::Service;

    pub const DENIED_ANNOTATION: &str = "clb.test/denied-by-next";
    pub const DENIED_REASON: &str = "DeniedByNextGuest";

    pub fn admit_service(config: &Config, service: &Service) -> Verdict {
        let marked = service.annotations.iter().any(|(key, _)| key == DENIED_ANNOTATION);
        match crate::real_admission::admit_service(config, service) {
            Verdict::Admitted | Verdict::NothingToProvision if marked => Verdict::Rejected(Rejection {
                reason: DENIED_REASON.to_owned(),
                message: format!(
                    "service {}/{}: the annotation {DENIED_ANNOTATION} is refused by this version",
                    service.namespace, service.name
                ),
            }),
            verdict => verdict,
        }
    }
}
#[path = "../../../guest/src/backend_pools.rs"]
pub mod backend_pools;
#[path = "../../../guest/src/budget.rs"]
pub mod budget;
#[path = "../../../guest/src/config.rs"]
pub mod config;
#[path = "../../../guest/src/difftracker.rs"]
pub mod difftracker;
#[path = "../../../guest/src/ip.rs"]
pub mod ip;
#[path = "../../../guest/src/keyed.rs"]
pub mod keyed;
#[path = "../../../guest/src/lifecycle.rs"]
pub mod lifecycle;
#[path = "../../../guest/src/model.rs"]
pub mod model;
#[path = "../../../guest/src/name.rs"]
pub mod name;
#[path = "../../../guest/src/pinning.rs"]
pub mod pinning;
#[path = "../../../guest/src/placement.rs"]
pub mod placement;
#[path = "../../../guest/src/selector.rs"]
pub mod selector;
/// The real tracker (its state version is `v1::STATE_VERSION`).
#[path = "../../../guest/src/tracker/mod.rs"]
pub mod v1;

pub mod tracker;

#[cfg(target_arch = "wasm32")]
#[path = "../../../guest/src/component.rs"]
mod component;
#[cfg(target_arch = "wasm32")]
#[path = "../../../guest/src/wasm_mem.rs"]
mod wasm_mem;
#[path = "../../../guest/src/wit_convert.rs"]
mod wit_convert;
