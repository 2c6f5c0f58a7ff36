//! What a swap moves and checks, apart from the serving supervisor: the report, the staged import
//! (on any thread, while the supervisor serves on), and the self-check of a new version's first
//! tick against the old one's.

use super::instance::{Input, Running, SupervisorError, guest};
use super::version::LogicRef;
use crate::bindings::clb::reconciler::types as wit;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a swap did.
#[derive(Clone, Debug, Serialize)]
pub struct SwapReport {
    pub from: String,
    pub to: String,
    /// The state the new version imported: its version and size as the old version exported
    /// it. For a staged swap, the checkpoint, which [`Self::replayed`] and the inputs the
    /// import replayed bring up to date (after a restart it is the empty start-up state).
    pub state_from: (u32, usize),
    /// The state version the new version holds (what its `export-state` would write, by its
    /// `state-version`) and the size of the state moved: for a staged swap, the new version's
    /// own export after the import's replay, else the state it imported.
    pub state_to: (u32, usize),
    /// The new version's first step: what its self-check `tick` at the swap's `now_ms` asked
    /// for. The caller must carry it out as it would the step of [`super::Supervisor::tick`] (execute
    /// its commands, feed back their outcomes, wake at its `wake_at_ms`): the new version holds
    /// those commands in flight. Usually empty in steady state.
    #[serde(skip)]
    pub first_step: wit::Step,
    /// For a swap staged with [`super::Supervisor::stage`]: how many inputs the switch replayed into
    /// the new version; `None` when the state moved whole (every plain swap, and a staged one
    /// that fell back).
    pub replayed: Option<usize>,
    /// The whole swap, and the part of it spent moving state (exporting, when the checkpoint
    /// was not fresh, and importing). For [`super::Supervisor::swap_staged`], `took` is the switch
    /// alone, the pause inputs see, and `state_move` the import done beforehand off the
    /// serving path (unless the switch fell back to a whole state move).
    #[serde(skip)]
    pub took: Duration,
    #[serde(skip)]
    pub state_move: Duration,
}

impl std::fmt::Display for SwapReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} → {}, state v{} ({} bytes) → v{} ({} bytes)",
            self.from, self.to, self.state_from.0, self.state_from.1, self.state_to.0, self.state_to.1
        )
    }
}

/// A staged swap before its state move: [`Staging::import`] may run on any thread.
pub struct Staging<'a> {
    pub(super) new: LogicRef<'a>,
    pub(super) config: wit::Config,
    pub(super) checkpoint: Arc<wit::VersionedState>,
    /// The journal at [`super::Supervisor::stage`], and the digest of the step each input got.
    pub(super) journal: Vec<Input>,
    pub(super) steps: Vec<Option<u64>>,
}

impl<'a> Staging<'a> {
    /// Imports the checkpoint into a fresh instance of the new version and replays the journal
    /// staged with it. A failure of the import is the refusal [`super::Supervisor::swap`] would give
    /// (the old version was never touched); a replay answered differently (or a trap in it) is
    /// not a refusal: the switch then moves the whole state, as a plain swap decides.
    ///
    /// After the replay the new version exports its state, here off the serving path: the
    /// switch adopts it as the checkpoint, so the size a swap reports and the next rebuild are
    /// those of the state moved, not of an old checkpoint and its journal (after a restart, the
    /// empty start-up state). A version that cannot export what it imported is refused now rather
    /// than at its first checkpoint.
    pub fn import(self) -> Result<Staged<'a>, SupervisorError> {
        let started = Instant::now();
        let mut running = Running::rebuild(&self.new, &self.config, &self.checkpoint, &[])?;
        let same = self.journal.iter().zip(&self.steps).all(|(input, expected)| {
            // What the replay issues was handed out by the serving version: it is dropped.
            running.call(input).is_ok_and(|step| expected.is_some_and(|e| e == digest(&step)))
        });
        let prefix = match same {
            true => {
                let state =
                    running.session.tracker_export(running.tracker).map_err(guest("export-state (new version)"))?;
                Some(StagedPrefix { steps: self.steps, state: Arc::new(state) })
            }
            false => None,
        };
        Ok(Staged { new: self.new, checkpoint: self.checkpoint, running, import: started.elapsed(), prefix })
    }
}

/// A new version holding a checkpoint of the serving one, ready for [`super::Supervisor::swap_staged`].
pub struct Staged<'a> {
    pub(super) new: LogicRef<'a>,
    pub(super) checkpoint: Arc<wit::VersionedState>,
    pub(super) running: Running,
    pub(super) import: Duration,
    /// When the new version answered the whole journal replayed by the import as the serving
    /// one did.
    pub(super) prefix: Option<StagedPrefix>,
}

/// The journal a staged import replayed: the step of each input, and the new version's state
/// after them.
pub(super) struct StagedPrefix {
    pub(super) steps: Vec<Option<u64>>,
    pub(super) state: Arc<wit::VersionedState>,
}

impl Staged<'_> {
    /// How long the import and its replay took (off the serving path).
    pub fn import_took(&self) -> Duration {
        self.import
    }
}

/// A digest of a step, to compare the steps of two versions without keeping them.
pub(super) fn digest(step: &wit::Step) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    step.hash(&mut hasher);
    hasher.finish()
}

/// A swap ready to switch: the instance that will serve, its first step (a tick at `now_ms`),
/// the state version it holds, and the time the state move took.
pub(super) struct PreparedSwap {
    pub(super) running: Running,
    pub(super) first_step: wit::Step,
    pub(super) now_ms: u64,
    pub(super) state_version: u32,
    pub(super) state_move: Duration,
    pub(super) replayed: Option<usize>,
    /// A staged swap's new checkpoint.
    pub(super) adopt: Option<Adopt>,
}

/// The new version's own export, taken by a staged import after it replayed the journal up to
/// `journal_from`: the switch makes it the checkpoint, and the journal the inputs after it.
pub(super) struct Adopt {
    pub(super) state: Arc<wit::VersionedState>,
    pub(super) journal_from: usize,
}

/// The self-check's verdict on the ticks of the old and the new version at the same state and
/// time: refused when the new one proposes a destructive command the old one does not. Counted
/// as a multiset, so that the new version deleting the same thing twice is not hidden by the old
/// one deleting it once. Separate from the swap so that it can be tested on any pair of steps;
/// end to end, `tests/next-guest` built with `destructive-tick` is refused by it.
pub fn self_check(old_tick: &wit::Step, new_tick: &wit::Step) -> Result<(), SupervisorError> {
    let mut allowed = destructive(old_tick);
    let extra: Vec<String> = destructive(new_tick)
        .into_iter()
        .filter(|d| match allowed.iter().position(|a| a == d) {
            Some(i) => {
                allowed.swap_remove(i);
                false
            }
            None => true,
        })
        .collect();
    if extra.is_empty() { Ok(()) } else { Err(SupervisorError::SwapSelfCheck { destructive: extra }) }
}

/// The destructive parts of a step's commands, as comparable text: resources deleted, services
/// unregistered or unlinked, addresses unbound and locations removed.
pub(super) fn destructive(step: &wit::Step) -> Vec<String> {
    let mut found = Vec::new();
    for issued in &step.commands {
        match &issued.command {
            wit::Command::DeleteResource(r) => found.push(format!("delete {:?} {}", r.kind, r.name)),
            wit::Command::UpdateServices(u) => {
                for s in &u.services {
                    if s.is_delete {
                        found.push(format!("unregister {}", s.name));
                    } else if s.backend_pools.is_empty() {
                        found.push(format!("unlink {}", s.name));
                    }
                }
            }
            wit::Command::UpdateAddressLocations(u) => {
                for l in &u.locations {
                    if l.addresses.is_empty() {
                        found.push(format!("remove location {}", l.location));
                    }
                    for a in l.addresses.iter().filter(|a| a.services.is_empty()) {
                        found.push(format!("unbind {} at {}", a.address, l.location));
                    }
                }
            }
            _ => {}
        }
    }
    found
}
