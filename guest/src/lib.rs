//! The CLB reconcile logic, sans IO.
//!
//! This crate is the whole of the product's policy: which configurations run, which Services are
//! admitted, and (as later parts land) what to tell Azure. It is a plain Rust library first —
//! unit tests, property tests and differential runs use it natively — and second a WebAssembly
//! component, through the thin adapter in `component` that exists only on `wasm32`.
//!
//! Invariants (see `ARCHITECTURE.md`):
//! * no IO: no clock, randomness, environment, file or socket; time is an argument;
//! * deterministic: ordered collections only (`clippy.toml` forbids `HashMap`/`HashSet`);
//! * WIT types never appear outside `component`.
#![deny(clippy::disallowed_types)]

pub mod admission;
pub mod backend_pools;
pub mod budget;
pub mod config;
pub mod difftracker;
/// The P1–P6 model and checker (`properties.rs` and the fuzz crate share it).
#[cfg(any(test, feature = "invariants"))]
pub mod invariants;
pub mod ip;
pub mod keyed;
pub mod lifecycle;
pub mod model;
pub mod name;
pub mod pinning;
pub mod placement;
#[cfg(test)]
mod properties;
pub mod selector;
pub mod tracker;

#[cfg(target_arch = "wasm32")]
mod component;
// The WIT <-> model conversions, one macro for the adapter above and for clb-host's native view.
mod wit_convert;
// On wasm32 it replaces the toolchain's byte-loop `memcmp`; natively only its tests run (the
// functions are not exported there: the C library's stay in use).
#[cfg(any(target_arch = "wasm32", test))]
mod wasm_mem;

pub use admission::{Rejection, Verdict, admit_service};
pub use config::{Config, ConfigError, Mode, validate_config};
