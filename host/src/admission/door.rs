//! What the webhook judges with, and what it denied: the serving logic version and, in `run`, a
//! candidate in shadow, replaced from outside as the controller swaps ([`Door::follow`]), so that
//! admission and reconcile answer with one version; and the last denials, for the operator page.
//!
//! * **Held, not owned.** A request takes the versions as they are when it starts
//!   ([`Door::judges`]: two `Arc` clones under a read lock) and judges with them to its end; a
//!   swap meanwhile serves the next request. `run`'s loop calls [`Door::follow`] after every
//!   step, so a swap, a rollback or a promotion reaches the door within the step that made it.
//! * **Bounded.** [`MAX_DENIALS`] denials are kept, the oldest dropped.

use clb_sandbox::LoadedLogic;
use clb_sandbox::supervisor::{ShadowHandle, version_name};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError, RwLock};

/// Denials kept for the operator page.
pub const MAX_DENIALS: usize = 20;

/// The versions one request is judged with.
#[derive(Clone)]
pub struct Judges {
    pub serving: LoadedLogic,
    /// A candidate in shadow, asked after the answer is sent.
    pub shadow: Option<ShadowHandle>,
}

/// One request the logic denied, as the operator page lists it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub operation: &'static str,
    /// `namespace/name`.
    pub service: String,
    pub reason: String,
    pub message: String,
    /// The short sha256 of the version that denied it.
    pub version: String,
}

/// See the module documentation.
pub struct Door {
    judges: RwLock<Judges>,
    denials: Mutex<VecDeque<Denial>>,
}

impl Door {
    pub fn new(serving: LoadedLogic) -> Self {
        Self { judges: RwLock::new(Judges { serving, shadow: None }), denials: Mutex::new(VecDeque::new()) }
    }

    /// The versions to judge the next request with.
    pub fn judges(&self) -> Judges {
        self.judges.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The sha256 of the version serving now.
    pub fn sha256(&self) -> String {
        self.judges.read().unwrap_or_else(PoisonError::into_inner).serving.info().sha256.clone()
    }

    /// Judges with `serving` from the next request on, and with `shadow` as the candidate while
    /// it runs. Cheap when nothing changed (a read lock and two comparisons): `run` calls it
    /// after every step.
    pub fn follow(&self, serving: &LoadedLogic, shadow: Option<ShadowHandle>) {
        let shadow = shadow.filter(ShadowHandle::is_running);
        let same = |judges: &Judges| {
            judges.serving.info().sha256 == serving.info().sha256
                && judges.shadow.as_ref().map(|s| s.candidate().info().sha256.as_str())
                    == shadow.as_ref().map(|s| s.candidate().info().sha256.as_str())
        };
        if same(&self.judges.read().unwrap_or_else(PoisonError::into_inner)) {
            return;
        }
        let mut judges = self.judges.write().unwrap_or_else(PoisonError::into_inner);
        if judges.serving.info().sha256 != serving.info().sha256 {
            tracing::info!(version = %version_name(serving), "admission: judging with the version now serving");
        }
        *judges = Judges { serving: serving.clone(), shadow };
    }

    /// Keeps `denial`, dropping the oldest past [`MAX_DENIALS`].
    pub fn denied(&self, denial: Denial) {
        let mut denials = self.denials.lock().unwrap_or_else(PoisonError::into_inner);
        if denials.len() == MAX_DENIALS {
            denials.pop_front();
        }
        denials.push_back(denial);
    }

    /// The denials kept, the newest first.
    pub fn last_denials(&self) -> Vec<Denial> {
        self.denials.lock().unwrap_or_else(PoisonError::into_inner).iter().rev().cloned().collect()
    }
}
