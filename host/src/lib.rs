//! The thin host of the CLB reconciler: the live controller and the command line, on top of the
//! crates that hold its parts.
//!
//! Below it: the sandbox the logic — a WebAssembly component — runs in, kept alive across traps
//! and swaps by its supervisor, with traces of its calls (`clb-sandbox`); the Azure API in host
//! terms (`clb-azure`) and its HTTP client (`clb-arm`); the Azure emulator (`clb-emulator`); what
//! both drivers share — the executor that carries out what the logic asks, the records copied from
//! Kubernetes objects, the operator's files, the backend-pool updater (`clb-executor`); the
//! Kubernetes side of the live controller — the client the executor writes through, the Leases
//! (`clb-kube`); and the simulator, which replays scenario files on virtual time against the
//! emulator and an in-memory cluster (`clb-simulator`). Here: the [`live`] controller, which runs
//! those pieces on real time against a cluster (watchers, the metrics endpoint, hot swaps), and
//! [`cli`], the command line; and [`admission`], the logic's rules served as an admission webhook. It decides nothing about load balancers: every rule a reviewer
//! could argue about lives in the guest (`clb-guest`).
//!
//! Crates and modules form layers, no module importing one above it (ARCHITECTURE.md,
//! invariant 12).

pub mod admission;
pub mod cli;
pub mod clock;
pub mod live;
pub mod logging;
