//! The live controller, `clb-host run`: the reconciler against a real cluster and a real (or
//! emulated) Azure, on real time. In layers, lowest first — no module imports one above it:
//!
//! * [`clb_kube::lease`] (below this crate) — leader election and the Azure resource lock on
//!   Kubernetes Leases;
//! * [`swap`] — the swap protocol's records;
//! * [`clb_sandbox::figures`] (outside this folder: `simulate` reads it too) — the logic's own figures;
//! * [`metrics`] — the registry the supervisor publishes into, and its exposition;
//! * [`page`] — the operator page (`GET /`): HTML rendered from what [`metrics`] holds;
//! * [`control`] — swap requests carried into the loop, results reported as Events;
//! * [`sources`] — the watched file or ConfigMap that offers new versions;
//! * [`endpoint`] — `/` (the page), `/metrics`, `/healthz`, `/readyz`, `/status`, `POST /swap`;
//! * [`settings`] — what `run` is given, why it stops;
//! * `pools` — the backend-pool updater's term (multi-SLB local-service mode);
//! * [`run`] — the loop: watchers, the supervisor, commands, terms;
//! * [`operations`] — all of it assembled around the loop.

pub mod control;
pub mod endpoint;
pub mod metrics;
pub mod operations;
pub mod page;
mod pools;
pub mod run;
pub mod settings;
pub mod sources;
pub mod swap;
