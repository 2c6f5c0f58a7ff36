//! The simulator, `clb-host simulate`: the same logic and executor on virtual time, against the
//! in-process Azure emulator and an in-memory cluster. In layers, lowest first:
//!
//! * [`cluster`] — the in-memory cluster: objects, watch events, the writes the executor makes;
//! * [`scenario`] — the scenario file format and its checks;
//! * [`perturbation`] — the faults `explore` injects into a run, their classes and their text;
//! * [`simulate`] — the driver: a scenario's steps on virtual time, expectations checked;
//! * [`explore`] — fault exploration: a scenario perturbed at every point, each run's world
//!   compared with the unperturbed one's.

pub mod cluster;
pub mod explore;
#[cfg(feature = "native")]
pub mod native;
pub mod perturbation;
pub mod scenario;
pub mod simulate;
