//! The thin host of the CLB reconciler.
//!
//! It loads the logic — a WebAssembly component — into a sandbox ([`sandbox`]) kept alive by the
//! [`supervisor`] across traps and swaps, copies Kubernetes objects into the records the logic
//! reads ([`records`]), reads the operator's files ([`inputs`], through [`bounded`]), and carries
//! out what the logic asks — on Azure through [`azure`], against real ARM or the local
//! [`emulator`] — through the [`executor`] (Kubernetes writes through [`kube`]); in multi-SLB
//! local-service mode also the backend-pool updater ([`backend_pools`]) and its producer
//! ([`pool_producer`]). Two drivers use those pieces: the [`simulator`] replays scenario files on
//! virtual time against the emulator and an in-memory cluster, and the [`live`] controller runs
//! them on real time against a cluster (watchers, leader election and the Azure resource lock on
//! Leases, the metrics endpoint, hot swaps). [`cli`] is the command line; [`trace`] records and
//! replays the calls into the logic. It decides nothing about load balancers: every rule a
//! reviewer could argue about lives in the guest (`clb-guest`).
//!
//! Modules form layers, no module importing one above it (ARCHITECTURE.md, invariant 12).

pub mod azure;
pub mod backend_pools;
pub mod bounded;
#[cfg(feature = "live")]
pub mod cli;
pub mod compression;
pub mod emulator;
pub mod error_text;
pub mod executor;
pub mod figures;
pub mod inputs;
#[cfg(feature = "live")]
pub mod kube;
#[cfg(feature = "live")]
pub mod live;
#[cfg(feature = "live")]
pub mod logging;
#[cfg(feature = "native")]
pub mod native;
pub mod pool_producer;
pub mod records;
pub mod sandbox;
pub mod simulator;
pub mod supervisor;
pub mod trace;

/// The logic this host was built with, used when no other component is given.
pub const BUILTIN_GUEST: &[u8] = include_bytes!(env!("CLB_BUILTIN_GUEST"));
