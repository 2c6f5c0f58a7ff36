//! The integration tests: one binary. Fixtures live in `tests/fixtures/`; the test-only guests
//! are built by `tests/build.rs`.

mod admission;
mod azure;
mod backend_pools;
mod cli;
mod conformance;
mod examples;
mod explore;
mod hosts;
mod image;
mod kube;
mod layers;
mod lease;
mod manifests;
mod metrics;
mod oci;
mod operations;
mod page;
mod sandbox;
mod scenarios;
mod shadow;
mod signatures;
mod supervisor;
mod traces;
mod tracker;
mod webhook;
