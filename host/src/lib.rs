//! The thin host of the CLB reconciler.
//!
//! It loads the logic — a WebAssembly component — into a sandbox ([`sandbox`]), copies
//! Kubernetes objects into the records the logic reads ([`records`]), reads the operator's files
//! ([`inputs`]), and carries out what the logic asks — on Azure through [`azure`], against real
//! ARM or the local [`emulator`] — through the [`executor`]; [`simulate`] replays [`scenario`]
//! files against the emulator and an in-memory [`cluster`]; [`run`] drives the same pieces on real
//! time against a cluster (watchers, and writes through [`kube`]) and ARM or the emulator, with
//! leader election and the Azure resource lock on Kubernetes Leases ([`lease`]); in multi-SLB
//! local-service mode both also run the backend-pool updater ([`backend_pools`]) and its
//! producer ([`pool_producer`]). The
//! [`supervisor`] keeps the logic's state across traps and swaps; [`metrics`] serves its
//! counters, the health probes and `/status`; [`control`] carries swap requests — from that
//! endpoint or the watched [`sources`] — into the run loop and reports each result as an Event. It
//! decides nothing about load balancers: every rule a reviewer could argue about lives in the
//! guest (`clb-guest`).

pub mod azure;
pub mod backend_pools;
pub mod bounded;
pub mod cli;
pub mod cluster;
pub mod compression;
pub mod control;
pub mod emulator;
pub mod endpoint;
pub mod executor;
pub mod inputs;
pub mod kube;
pub mod lease;
#[cfg(unix)]
pub mod linear_memory;
pub mod logging;
pub mod metrics;
#[cfg(feature = "native")]
pub mod native;
pub mod pool_producer;
pub mod records;
pub mod run;
mod run_pools;
pub mod sandbox;
pub mod scenario;
pub mod simulate;
pub mod sources;
pub mod supervisor;
pub mod swap;
pub mod trace;

/// The logic this host was built with, used when no other component is given.
pub const BUILTIN_GUEST: &[u8] = include_bytes!(env!("CLB_BUILTIN_GUEST"));
