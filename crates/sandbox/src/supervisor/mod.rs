//! The supervisor: owns the running logic (a [`Session`] and its tracker) and keeps its state
//! safe across traps and version changes (docs/design.md §2.5, §7).
//!
//! * **Checkpoints and the journal.** The supervisor keeps the last `export-state` of the
//!   tracker and every input delivered since (observations and completions with their `now`,
//!   ticks). A checkpoint is taken every [`CheckpointPolicy::every_inputs`] inputs or when the
//!   journal holds [`CheckpointPolicy::journal_items`] observations and outcomes, whichever
//!   comes first.
//! * **Trap recovery.** When a call traps (a panic, exhausted fuel, the deadline, the memory
//!   cap), the instance is dropped — wasmtime leaves it unusable — and a fresh instance of the
//!   same logic imports the checkpoint and replays the journal. The guest is deterministic, so
//!   the rebuilt tracker is the one that was lost; what the replay issues again was already
//!   handed out and is discarded. Then the failed input is delivered again one observation (or
//!   outcome) at a time, so that only the parts that trap are lost: each is *quarantined* —
//!   logged, counted and kept for [`Supervisor::take_quarantined`] — and the caller gets a
//!   normal [`wit::Step`] with whatever the rest produced.
//! * **Probation and rollback.** A version that came from a swap serves a probation
//!   ([`PROBATION_INPUTS`] of its own inputs); the version it replaced is kept until then. It
//!   is rolled back when it quarantines [`PROBATION_QUARANTINES`] inputs within its probation,
//!   whatever it served between them (a busy controller always serves something between), or
//!   [`PROBATION_TICK_QUARANTINES`] ticks: a tick carries no object or outcome to blame, so a
//!   version that traps on one traps on time itself. The previous version is rebuilt from its
//!   state at the swap with every input the new version took replayed, and is then *delivered*
//!   the inputs the new version quarantined, not dropped: their steps go to the caller, so no
//!   Service is left unreconciled by a rollback. Ticks, and observations of an object a later
//!   input observed again, are not delivered; what traps the previous version too is
//!   quarantined again.
//! * **Hot swap.** [`Supervisor::swap`] moves the state of the running version into a new one
//!   (old `export-state` → new `import-state`, which owns migrations), requires that the new
//!   version hold a state version no older than the one it imported (else it would lose state),
//!   and runs a self-check: a `tick` of the new version at the current time must propose no
//!   destructive command that a `tick` of the old one would not. Only then does it switch; on
//!   any failure the old version keeps serving with its state, and the reason is a
//!   [`SupervisorError`].
//!
//!   One swap moves the state once, into the instance that will serve (on 30,000 pods a state
//!   move costs tens of milliseconds, so every extra one counted; BENCHMARKS.md):
//!   * the export is the checkpoint itself when nothing was delivered since it was taken;
//!   * the version check asks the new instance for its `state-version` instead of exporting
//!     from it (the guest's word, as the payload is: a guest that lies there can lie in the
//!     payload too; the check is against a version that forgot a migration, not against malice);
//!   * the new version's self-check tick runs on the instance that then serves, and is its
//!     first input: [`SwapReport::first_step`] goes back to the caller to be carried out like
//!     any tick's step, and the journal starts with that tick, so a rebuild of the new version
//!     replays it onto the checkpoint;
//!   * the old version's tick is needed only when the new one proposes something destructive
//!     (else nothing can fail the comparison). It then runs on the serving instance, which is
//!     the checkpoint's state; if the swap is refused, the serving instance is rebuilt from the
//!     checkpoint, so a refusal costs one import more than an acceptance.
//!
//!   That import is still most of a swap (~0.1–0.2 s on 30,000 pods), and inputs wait through
//!   it. A **staged swap** takes it off the serving path: [`Supervisor::stage`] hands out the
//!   checkpoint and a copy of the journal since, [`Staging::import`] imports the one and
//!   replays the other into the new version on any thread while this supervisor serves on, and
//!   [`Supervisor::swap_staged`] replays only the inputs delivered since `stage`, then checks
//!   the new version as a plain swap does. A replay is trusted only when the new version
//!   answers every journaled input with the step the old one gave (compared by digest):
//!   otherwise its in-flight commands would not be the ones handed out, and the switch falls
//!   back to a whole state move — as it does when a checkpoint was taken since staging, since
//!   the journal no longer reaches back to it, or when a rollback replaced the journal.
//!
//! Every method takes `&mut self`, so no input can interleave with a swap or a recovery: an
//! input that arrives meanwhile waits for the call to return, and is then delivered to
//! whichever version is serving.
//!
//! The parts that hold no instance are files of their own: [`journal`] (when a checkpoint is
//! taken), [`probation`] (a probation's rules and what a rollback delivers), [`swap`] (the
//! report, the staged import, the self-check), [`report`] (what is published), [`version`] (a
//! version held), [`instance`] (an instance and its rebuild), [`shadow`] (a candidate). This
//! file is longer than 800 lines on purpose: every call that may replace the serving instance —
//! delivery, recovery, quarantine, rollback, a swap's switch — is here, on the one struct that
//! owns it, so that no two of them can interleave and none reaches into another's fields.

mod instance;
mod journal;
mod probation;
mod report;
pub mod shadow;
mod swap;
mod version;

use crate::bindings::clb::reconciler::types as wit;
use crate::trace::{Arg, ComponentRef, Ended, Recorder, arg, lazy};
use crate::{GuestError, Limits, LoadedLogic, Runtime};
use instance::{EXPORT_STAGE, Running, guest, record_input};
pub use instance::{Input, SupervisorError, describe_observation, observed_object};
pub use journal::CheckpointPolicy;
pub use probation::{PROBATION_INPUTS, PROBATION_QUARANTINES, PROBATION_TICK_QUARANTINES, Quarantined};
use probation::{Probation, to_deliver};
pub use report::{ProbationSnapshot, Publish, Snapshot, SupervisorStats, VersionSnapshot};
pub use shadow::{ADMISSION, ShadowError, ShadowEvent, ShadowHandle, ShadowOptions, ShadowState, ShadowStatus};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use swap::{Adopt, PreparedSwap, StagedPrefix, destructive, digest};
pub use swap::{Staged, Staging, SwapReport, self_check};
pub use version::{LogicRef, version_name};

/// Owns the running logic; see the module documentation.
pub struct Supervisor<'a> {
    logic: LogicRef<'a>,
    config: Option<wit::Config>,
    running: Option<Running>,
    /// Shared with [`Probation`] after a swap, which keeps the same state for a rollback.
    checkpoint: Arc<wit::VersionedState>,
    journal: Vec<Input>,
    /// A digest of the step each journaled input got (`None`: not known, after a rollback),
    /// for a staged swap to check that the new version answers the journal the same way.
    journal_steps: Vec<Option<u64>>,
    journal_items: usize,
    probation: Option<Probation<'a>>,
    probation_inputs: usize,
    probation_quarantines: u32,
    policy: CheckpointPolicy,
    /// `wake-at-ms` and `idle` of the last step: what a quarantined input leaves unchanged.
    last_wake: Option<u64>,
    last_idle: bool,
    quarantined: Vec<Quarantined>,
    /// Whether a step has said `idle` since the last start: readiness (`/readyz`).
    idle_seen: bool,
    /// See [`Snapshot::state_version`]. Not the checkpoint's own version: after a swap the
    /// checkpoint may still be the previous version's export.
    state_version: Option<u32>,
    stats: SupervisorStats,
    publisher: Option<Arc<dyn Publish>>,
    trace: Option<Traced>,
    /// A candidate in shadow ([`shadow`]).
    shadow: Option<shadow::Tap>,
    /// The last shadow's handle, kept after it stops.
    last_shadow: Option<ShadowHandle>,
}

/// The trace this supervisor records into (`docs/traces.md`): the serving tracker's calls as
/// the logic saw them — inputs with their steps, traps and the rebuilds after them, swaps and
/// rollbacks — and none of the calls it makes only to keep the state safe (checkpoints, journal
/// replays, refused swaps), which leave the serving state as it was.
struct Traced {
    recorder: Arc<Recorder>,
    /// The serving tracker's handle in the trace; `None` before a tracker exists.
    handle: Option<u64>,
    /// How the host names components, by sha256, for the `swap` lines.
    names: BTreeMap<String, String>,
}

impl<'a> Supervisor<'a> {
    pub fn new(logic: impl Into<LogicRef<'a>>) -> Self {
        Self::with_policy(logic, CheckpointPolicy::default())
    }

    pub fn with_policy(logic: impl Into<LogicRef<'a>>, policy: CheckpointPolicy) -> Self {
        Self {
            logic: logic.into(),
            config: None,
            running: None,
            checkpoint: Arc::new(wit::VersionedState { version: 0, payload: Vec::new() }),
            journal: Vec::new(),
            journal_steps: Vec::new(),
            journal_items: 0,
            probation: None,
            probation_inputs: PROBATION_INPUTS,
            probation_quarantines: PROBATION_QUARANTINES,
            policy,
            last_wake: None,
            last_idle: false,
            quarantined: Vec::new(),
            idle_seen: false,
            state_version: None,
            stats: SupervisorStats::default(),
            publisher: None,
            trace: None,
            shadow: None,
            last_shadow: None,
        }
    }

    /// How many inputs a swapped-in version serves on probation (default [`PROBATION_INPUTS`];
    /// at least 1).
    pub fn with_probation_inputs(mut self, inputs: usize) -> Self {
        self.probation_inputs = inputs.max(1);
        self
    }

    /// How many inputs a swapped-in version may quarantine within its probation before it is
    /// rolled back (default [`PROBATION_QUARANTINES`]; at least 1).
    pub fn with_probation_quarantines(mut self, quarantines: u32) -> Self {
        self.probation_quarantines = quarantines.max(1);
        self
    }

    /// Records every call of the serving tracker into `recorder`.
    pub fn with_recorder(mut self, recorder: Arc<Recorder>) -> Self {
        self.record_into(recorder);
        self
    }

    /// [`Self::with_recorder`] in place; from the next `start` on.
    pub fn record_into(&mut self, recorder: Arc<Recorder>) {
        self.trace = Some(Traced { recorder, handle: None, names: BTreeMap::new() });
    }

    /// The trace being recorded, if any.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        self.trace.as_ref().map(|t| &t.recorder)
    }

    /// The name a trace gives the component with this sha256 (`--swap-component NAME=FILE`
    /// on replay); without one, its short sha256.
    pub fn name_component(&mut self, sha256: &str, name: &str) {
        if let Some(trace) = &mut self.trace {
            trace.names.insert(sha256.to_owned(), name.to_owned());
        }
    }

    fn component_ref(&self, logic: &LoadedLogic) -> ComponentRef {
        let name = self.trace.as_ref().and_then(|t| t.names.get(&logic.info().sha256));
        ComponentRef::of(logic, name.map(String::as_str))
    }

    fn trace_input(&self, input: &Input, result: Result<&wit::Step, &GuestError>) {
        let Some(Traced { recorder, handle: Some(handle), .. }) = &self.trace else { return };
        let ended = match result {
            Ok(step) => Ended::Returned(lazy(step.clone())),
            Err(error) => Ended::Trapped(error.to_string()),
        };
        record_input(recorder, *handle, input, ended);
    }

    fn trace_rebuild(&self) {
        if let Some(Traced { recorder, handle: Some(handle), .. }) = &self.trace {
            recorder.rebuild(*handle);
        }
    }

    /// Before an input: when the trace lost lines or its file is full, it goes on from the
    /// state now, under a new handle.
    fn trace_resync(&mut self) {
        let due = self.trace.as_ref().is_some_and(|t| t.handle.is_some() && t.recorder.needs_state());
        if !due || self.checkpoint_now().is_err() {
            return;
        }
        let (Some(config), Some(trace)) = (self.config.clone(), self.trace.as_ref()) else { return };
        let component = self.component_ref(&self.logic);
        let state = wit::VersionedState::clone(&self.checkpoint);
        if let Some(handle) = trace.recorder.resync(lazy(config), lazy(state), &component) {
            self.trace.as_mut().expect("checked above").handle = Some(handle);
        }
    }

    /// Publishes the counters to `metrics` after every call, so that a scrape sees them
    /// without taking the supervisor's `&mut` (it is busy serving).
    pub fn with_metrics(mut self, metrics: Arc<dyn Publish>) -> Self {
        metrics.publish(self.snapshot());
        self.publisher = Some(metrics);
        self
    }

    /// The version a rollback would return to, while the serving one is on probation.
    pub fn previous_logic(&self) -> Option<&LoadedLogic> {
        self.probation.as_ref().map(|p| &*p.previous)
    }

    /// Whether a tracker is running (it is from a successful start until the process ends).
    pub fn is_serving(&self) -> bool {
        self.running.is_some()
    }

    /// Whether the tracker has reported `idle` since the last start.
    pub fn has_been_idle(&self) -> bool {
        self.idle_seen
    }

    /// What `/metrics` shows: the counters of the versions held and of the supervisor.
    pub fn snapshot(&self) -> Snapshot {
        let mut versions = vec![VersionSnapshot {
            memory_bytes: self.running.as_ref().map(|r| r.session.memory_bytes() as u64),
            ..VersionSnapshot::of(&self.logic)
        }];
        versions.extend(self.previous_logic().map(VersionSnapshot::of));
        Snapshot {
            serving: self.is_serving().then(|| versions[0].clone()),
            versions,
            supervisor: self.stats.clone(),
            ready: self.idle_seen,
            shadow: self.shadow.as_ref().map(shadow::Tap::handle).or_else(|| self.last_shadow.clone()),
            state_version: self.state_version,
            probation: self.probation.as_ref().map(|p| ProbationSnapshot {
                served: p.served,
                inputs: self.probation_inputs,
                quarantined: p.quarantined.len(),
                quarantines: self.probation_quarantines,
            }),
        }
    }

    fn publish(&self) {
        if let Some(metrics) = &self.publisher {
            metrics.publish(self.snapshot());
        }
    }

    /// The version serving now.
    pub fn logic(&self) -> &LoadedLogic {
        &self.logic
    }

    pub fn stats(&self) -> &SupervisorStats {
        &self.stats
    }

    /// The inputs quarantined since the last call.
    pub fn take_quarantined(&mut self) -> Vec<Quarantined> {
        std::mem::take(&mut self.quarantined)
    }

    /// Runs `candidate` in shadow beside the serving version ([`shadow`]), replacing any shadow
    /// running. It starts from the serving state now, or from the next start's.
    pub fn shadow(&mut self, candidate: LoadedLogic, options: ShadowOptions) -> Result<ShadowHandle, ShadowError> {
        self.stop_shadow();
        let tap = shadow::Tap::start(candidate, options)?;
        let handle = tap.handle();
        self.shadow = Some(tap);
        self.sync_shadow(shadow::Resync::Start);
        self.drain_shadow();
        self.publish();
        Ok(handle)
    }

    /// Stops the shadow, if one runs; its handle keeps what it did.
    pub fn stop_shadow(&mut self) -> Option<ShadowHandle> {
        let handle = self.shadow.take()?.stop(ShadowState::Stopped, Some("stopped".into()));
        self.last_shadow = Some(handle.clone());
        self.publish();
        Some(handle)
    }

    /// The shadow running, or the last one.
    pub fn shadow_handle(&self) -> Option<ShadowHandle> {
        self.shadow.as_ref().map(shadow::Tap::handle).or_else(|| self.last_shadow.clone())
    }

    /// When the shadow's promotion is due: ends the shadow (as promoted) and gives its candidate,
    /// for the caller to swap in.
    pub fn take_promotion(&mut self) -> Option<LoadedLogic> {
        if !self.shadow.as_ref().is_some_and(|tap| tap.handle().promotion_due()) {
            return None;
        }
        let handle = self.shadow.take()?.stop(ShadowState::Promoted, None);
        let candidate = handle.candidate().clone();
        self.last_shadow = Some(handle);
        Some(candidate)
    }

    /// The serving state now, for the shadow.
    fn sync_point(&self, reason: shadow::Resync) -> Option<shadow::SyncPoint> {
        Some(shadow::SyncPoint {
            reason,
            config: self.config.clone()?,
            serving: LoadedLogic::clone(&self.logic),
            checkpoint: self.checkpoint.clone(),
            journal: self.journal.clone(),
        })
    }

    fn sync_shadow(&mut self, reason: shadow::Resync) {
        if self.running.is_none() {
            return;
        }
        if let Some(mut tap) = self.shadow.take() {
            tap.sync_now(reason, |reason| self.sync_point(reason));
            self.shadow = Some(tap);
        }
    }

    fn drain_shadow(&mut self) {
        if let Some(tap) = &mut self.shadow {
            tap.drain();
        }
    }

    /// A fresh tracker with empty state (at start and on every restart). The version serving
    /// keeps serving; a pending rollback is forgotten, as the state it would replay is gone.
    pub fn start(&mut self, config: &wit::Config) -> Result<(), SupervisorError> {
        let result = self.start_inner(config);
        self.publish();
        result
    }

    fn start_inner(&mut self, config: &wit::Config) -> Result<(), SupervisorError> {
        self.running = None;
        self.probation = None;
        self.idle_seen = false;
        self.state_version = None;
        let mut session = self.logic.session().map_err(guest("instantiating"))?;
        let created = session.tracker_create(config);
        if let Some(trace) = &mut self.trace {
            trace.handle = None;
            let (ended, handle) = match &created {
                Ok(Ok(_)) => {
                    let handle = trace.recorder.new_handle();
                    (Ended::Returned(Box::new(move || serde_json::json!({ "Ok": handle }))), Some(handle))
                }
                Ok(Err(refused)) => (Ended::Returned(lazy(Err::<(), _>(refused.clone()))), None),
                Err(error) => (Ended::Trapped(error.to_string()), None),
            };
            trace.recorder.call("tracker.create", vec![arg(config.clone())], ended);
            trace.handle = handle;
        }
        let tracker = created.map_err(guest("tracker.create"))?.map_err(|e| SupervisorError::ConfigRefused {
            field: e.field,
            reason: e.reason,
            message: e.message,
        })?;
        self.config = Some(config.clone());
        self.running = Some(Running { session, tracker });
        self.checkpoint_now()?;
        self.sync_shadow(shadow::Resync::Start);
        Ok(())
    }

    pub fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, SupervisorError> {
        self.deliver(Input::Observe { now_ms, batch: Arc::from(batch) })
    }

    /// [`Self::complete_paced`] with no figure from ARM.
    pub fn complete(&mut self, now_ms: u64, results: &[(u64, wit::Outcome)]) -> Result<wit::Step, SupervisorError> {
        self.complete_paced(now_ms, results, None)
    }

    /// The outcomes of commands, with ARM's remaining-writes figure on the latest of their
    /// answers that carried one (`tracker.complete`).
    pub fn complete_paced(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, SupervisorError> {
        self.deliver(Input::Complete { now_ms, results: Arc::from(results), arm_remaining_writes })
    }

    pub fn tick(&mut self, now_ms: u64) -> Result<wit::Step, SupervisorError> {
        self.deliver(Input::Tick { now_ms })
    }

    /// The tracker's state now (a checkpoint is taken to read it).
    pub fn export_state(&mut self) -> Result<wit::VersionedState, SupervisorError> {
        self.checkpoint_now()?;
        Ok(wit::VersionedState::clone(&self.checkpoint))
    }

    /// What the serving logic is doing (`tracker.stats`). Changes nothing in the logic; a trap
    /// rebuilds the instance from its checkpoint (a trapped instance cannot be called again) and
    /// is returned, the inputs' journal untouched.
    pub fn logic_stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, SupervisorError> {
        let running = self.running.as_mut().ok_or(SupervisorError::NotStarted)?;
        let answered = running.session.tracker_stats(running.tracker, now_ms);
        if let Some(trace) = &self.trace
            && let Some(handle) = trace.handle
        {
            let ended = match &answered {
                Ok(stats) => Ended::Returned(lazy(stats.clone())),
                Err(error) => Ended::Trapped(error.to_string()),
            };
            trace.recorder.call("tracker.stats", vec![Arg::Handle(handle), arg(now_ms)], ended);
        }
        match answered {
            Ok(stats) => Ok(stats),
            Err(error) => {
                tracing::warn!(version = %version_name(&self.logic), %error, "tracker.stats trapped; rebuilding the logic from its checkpoint");
                self.stats.recoveries += 1;
                self.rebuild()?;
                self.trace_rebuild();
                Err(SupervisorError::Guest { stage: "tracker.stats", source: error })
            }
        }
    }

    fn deliver(&mut self, input: Input) -> Result<wit::Step, SupervisorError> {
        let result = self.deliver_inner(input);
        if let Some(tap) = &mut self.shadow {
            tap.drain();
        }
        self.publish();
        result
    }

    fn deliver_inner(&mut self, input: Input) -> Result<wit::Step, SupervisorError> {
        self.trace_resync();
        let running = self.running.as_mut().ok_or(SupervisorError::NotStarted)?;
        let started = Instant::now();
        let called = running.call(&input);
        if let Some(publisher) = &self.publisher {
            publisher.guest_call(&self.logic.info().sha256, started.elapsed());
        }
        match called {
            Ok(step) => {
                self.trace_input(&input, Ok(&step));
                self.accept(input, &step)?;
                Ok(step)
            }
            Err(error) => {
                self.trace_input(&input, Err(&error));
                self.recover(input, error)
            }
        }
    }

    /// Journals a delivered input; checkpoints when the policy says so.
    fn accept(&mut self, input: Input, step: &wit::Step) -> Result<(), SupervisorError> {
        self.stats.inputs += 1;
        self.last_wake = step.wake_at_ms;
        self.last_idle = step.idle;
        self.idle_seen |= step.idle;
        self.journal_items += input.items();
        if let Some(probation) = &mut self.probation {
            probation.journal.push(input.clone());
            probation.served += 1;
            if probation.served >= self.probation_inputs {
                tracing::info!(version = %version_name(&self.logic), inputs = probation.served, "swapped-in version served its probation; the previous one is released");
                self.probation = None;
            }
        }
        let shadowed = self.shadow.is_some().then(|| input.clone());
        self.journal.push(input);
        self.journal_steps.push(Some(digest(step)));
        if let (Some(input), Some(mut tap)) = (shadowed, self.shadow.take()) {
            tap.input(&input, step, |reason| self.sync_point(reason));
            self.shadow = Some(tap);
        }
        if self.journal.len() >= self.policy.every_inputs || self.journal_items >= self.policy.journal_items {
            self.checkpoint_now()?;
        }
        Ok(())
    }

    /// Replaces the checkpoint with the state now and empties the journal. A failed export is
    /// tried again at the next input.
    fn checkpoint_now(&mut self) -> Result<(), SupervisorError> {
        match self.try_checkpoint() {
            Err(SupervisorError::Guest { stage: EXPORT_STAGE, .. }) => Ok(()),
            other => other,
        }
    }

    /// [`Self::checkpoint_now`] for a swap, which must not go on from an older checkpoint: a
    /// failed export is an error (stage [`EXPORT_STAGE`]) once the instance is rebuilt.
    fn try_checkpoint(&mut self) -> Result<(), SupervisorError> {
        let running = self.running.as_mut().ok_or(SupervisorError::NotStarted)?;
        let started = Instant::now();
        match running.session.tracker_export(running.tracker) {
            Ok(state) => {
                self.stats.checkpoints += 1;
                self.stats.checkpoint_bytes += state.payload.len() as u64;
                self.stats.last_checkpoint_bytes = state.payload.len();
                self.stats.checkpoint_time += started.elapsed();
                self.state_version = Some(state.version);
                self.checkpoint = Arc::new(state);
                self.clear_journal();
                Ok(())
            }
            Err(error) => {
                // The old checkpoint and the journal still describe the state: rebuild from them.
                tracing::warn!(version = %version_name(&self.logic), %error, "checkpoint failed; rebuilding from the previous one");
                self.stats.recoveries += 1;
                self.rebuild()?;
                Err(SupervisorError::Guest { stage: EXPORT_STAGE, source: error })
            }
        }
    }

    fn clear_journal(&mut self) {
        self.journal.clear();
        self.journal_steps.clear();
        self.journal_items = 0;
    }

    fn rebuild(&mut self) -> Result<(), SupervisorError> {
        self.running = None;
        let config = self.config.as_ref().ok_or(SupervisorError::NotStarted)?;
        self.running = Some(Running::rebuild(&self.logic, config, &self.checkpoint, &self.journal)?);
        Ok(())
    }

    /// After `input` trapped: rebuild, then deliver it piece by piece, quarantining what traps.
    fn recover(&mut self, input: Input, error: GuestError) -> Result<wit::Step, SupervisorError> {
        self.stats.recoveries += 1;
        tracing::warn!(version = %version_name(&self.logic), input = %input.describe(), %error, "the logic trapped; rebuilding it from its checkpoint");
        self.rebuild()?;
        self.trace_rebuild();
        let parts = input.split();
        let mut step = wit::Step { commands: Vec::new(), wake_at_ms: self.last_wake, idle: self.last_idle };
        if parts.len() <= 1 {
            self.quarantine(input, &error, &mut step)?;
        } else {
            for part in parts {
                self.deliver_part(part, &mut step)?;
            }
        }
        Ok(step)
    }

    /// Delivers one part of an input (one observation, one outcome, a tick), its step joining
    /// `step`; quarantines it if it traps.
    fn deliver_part(&mut self, part: Input, step: &mut wit::Step) -> Result<(), SupervisorError> {
        let running = self.running.as_mut().ok_or(SupervisorError::NotStarted)?;
        match running.call(&part) {
            Ok(part_step) => {
                self.trace_input(&part, Ok(&part_step));
                self.accept(part.clone(), &part_step)?;
                step.commands.extend(part_step.commands);
                step.wake_at_ms = part_step.wake_at_ms;
                step.idle = part_step.idle;
            }
            Err(error) => {
                self.trace_input(&part, Err(&error));
                self.stats.recoveries += 1;
                self.rebuild()?;
                self.trace_rebuild();
                self.quarantine(part, &error, step)?;
            }
        }
        Ok(())
    }

    /// Sets `input` aside as one the serving version traps on. On probation it is kept for the
    /// previous version, and may roll the new one back, in which case what the previous version
    /// answers the inputs it is delivered joins `step`.
    fn quarantine(&mut self, input: Input, error: &GuestError, step: &mut wit::Step) -> Result<(), SupervisorError> {
        let version = version_name(&self.logic);
        tracing::error!(%version, input = %input.describe(), %error, "input quarantined: the logic traps on it");
        self.stats.quarantined += 1;
        let failed = self.probation.as_mut().and_then(|probation| {
            probation.quarantined.push((probation.journal.len(), input.clone()));
            probation.failed(self.probation_quarantines)
        });
        self.quarantined.push(Quarantined { input, version, error: error.to_string() });
        match failed {
            Some(reason) => self.rollback(reason, step),
            None => Ok(()),
        }
    }

    /// Back to the version the last swap replaced: its state at the swap, and every input the
    /// new version took replayed into it. Then it is delivered what the new version quarantined
    /// (their steps join `step`; what traps it too is quarantined again), but for what it need
    /// not be told: an observation of an object that a later input observed again (that one
    /// holds the object as it is now, and the older one must not undo it) and a tick (the next
    /// one comes). On failure the current version stays.
    fn rollback(&mut self, reason: String, step: &mut wit::Step) -> Result<(), SupervisorError> {
        let Some(probation) = self.probation.take() else { return Ok(()) };
        let Some(config) = self.config.as_ref() else { return Ok(()) };
        let (from, to) = (version_name(&self.logic), version_name(&probation.previous));
        let running = match Running::rebuild(&probation.previous, config, &probation.state, &probation.journal) {
            Ok(running) => running,
            Err(error) => {
                tracing::error!(%from, %to, %reason, %error, "rolling back failed; the current version keeps serving");
                self.stats.rollbacks_failed += 1;
                self.stats.last_rollback = Some(reason);
                return Ok(());
            }
        };
        let Probation { previous, state, journal, quarantined, .. } = probation;
        let deliver = to_deliver(quarantined, &journal);
        tracing::error!(%from, %to, %reason, delivered = deliver.len(), "rolled back to the previous version");
        self.stats.rollbacks += 1;
        self.stats.last_rollback = Some(reason);
        if let Some(Traced { recorder, handle: Some(handle), .. }) = &mut self.trace {
            let new = recorder.new_handle();
            recorder.rollback(*handle, new);
            *handle = new;
        }
        self.logic = previous;
        self.running = Some(running);
        // Known again at the next checkpoint: the state at the swap may be older than the
        // previous version's own schema.
        self.state_version = None;
        self.checkpoint = state;
        self.journal_items = journal.iter().map(Input::items).sum();
        // What the previous version answered them is not known.
        self.journal_steps = vec![None; journal.len()];
        self.journal = journal;
        self.sync_shadow(shadow::Resync::ServingChanged);
        for input in deliver {
            self.deliver_part(input, step)?;
        }
        Ok(())
    }

    /// Loads `bytes` (checked and compiled by [`Runtime::load`]) and swaps to it.
    pub fn swap_bytes(
        &mut self,
        runtime: &Runtime,
        bytes: &[u8],
        limits: Limits,
        now_ms: u64,
    ) -> Result<SwapReport, SupervisorError> {
        match runtime.load(bytes, limits) {
            Ok(logic) => self.swap(logic, now_ms),
            Err(error) => {
                let error = self.refused(SupervisorError::SwapLoad(error));
                self.publish();
                Err(error)
            }
        }
    }

    /// Moves the state into `new`, checks it, and switches; see the module documentation.
    pub fn swap(&mut self, new: impl Into<LogicRef<'a>>, now_ms: u64) -> Result<SwapReport, SupervisorError> {
        let result = self.swap_inner(new.into(), now_ms, Instant::now());
        self.publish();
        result
    }

    /// A plain swap; `started` is when the caller's swap began (a staged swap's fallback).
    fn swap_inner(&mut self, new: LogicRef<'a>, now_ms: u64, started: Instant) -> Result<SwapReport, SupervisorError> {
        match self.prepare_swap(&new, now_ms) {
            Ok(prepared) => self.switch(new, prepared, started),
            Err(error) => Err(self.refused(error)),
        }
    }

    /// Starts a staged swap: what [`Staging::import`] needs to move the state into `new` off the
    /// serving path (on another thread; the engine is shared, stores are independent), while
    /// this supervisor keeps serving. [`Self::swap_staged`] then switches with a short pause.
    /// The journal since the checkpoint goes with it: [`Staging::import`] replays it too, off
    /// the serving path, so that the switch replays only what is delivered after this call and
    /// no checkpoint (an export, tens of milliseconds on a large cluster) is taken here. Only a
    /// journal whose steps are not all known (after a rollback), which no replay could be
    /// checked against, is checkpointed first.
    ///
    /// The staging borrows nothing from this supervisor (its lifetime is the new version's), so
    /// an owned version can be staged on a `'static` thread.
    pub fn stage<'n>(&mut self, new: impl Into<LogicRef<'n>>) -> Result<Staging<'n>, SupervisorError> {
        let config = self.config.clone().ok_or(SupervisorError::NotStarted)?;
        if self.journal_steps.iter().any(Option::is_none) {
            self.try_checkpoint()?;
        }
        Ok(Staging {
            new: new.into(),
            config,
            checkpoint: self.checkpoint.clone(),
            journal: self.journal.clone(),
            steps: self.journal_steps.clone(),
        })
    }

    /// Switches to a version staged with [`Self::stage`] and [`Staging::import`]: replays the
    /// inputs delivered since its checkpoint into it, then checks it as [`Self::swap`] does.
    /// The replay must give, input by input, the steps the serving version gave (else the new
    /// version's state would not match the commands actually handed out); when it does not,
    /// or a checkpoint was taken since staging, the swap falls back to a whole state move, as
    /// [`Self::swap`]. Refusals are those of [`Self::swap`], the old version serving on.
    pub fn swap_staged(&mut self, staged: Staged<'a>, now_ms: u64) -> Result<SwapReport, SupervisorError> {
        let result = self.swap_staged_inner(staged, now_ms);
        self.publish();
        result
    }

    /// Records a staged swap whose [`Staging::import`] failed as the refusal it is (counted and
    /// published like one of [`Self::swap`]'s); the old version was never touched.
    pub fn refuse_staged(&mut self, error: SupervisorError) -> SupervisorError {
        let error = self.refused(error);
        self.publish();
        error
    }

    fn swap_staged_inner(&mut self, staged: Staged<'a>, now_ms: u64) -> Result<SwapReport, SupervisorError> {
        let started = Instant::now();
        let Staged { new, checkpoint, mut running, import, prefix } = staged;
        if !Arc::ptr_eq(&checkpoint, &self.checkpoint) {
            tracing::info!(version = %version_name(&new), "a checkpoint was taken since staging; moving the whole state");
            return self.swap_inner(new, now_ms, started);
        }
        // The import replayed the journal as it was at `stage`; it must still begin this
        // journal (a rollback since replaced it, with steps no longer known).
        let Some(StagedPrefix { steps, state }) =
            prefix.filter(|prefix| self.journal_steps.get(..prefix.steps.len()) == Some(&prefix.steps[..]))
        else {
            tracing::info!(version = %version_name(&new), "the staged version answered the journal differently, or it changed since staging; moving the whole state");
            return self.swap_inner(new, now_ms, started);
        };
        let done = steps.len();
        for (input, expected) in self.journal.iter().zip(&self.journal_steps).skip(done) {
            // A trap is a different answer too: a plain swap does not replay, so it decides.
            let same = running.call(input).is_ok_and(|step| expected.is_some_and(|e| e == digest(&step)));
            if !same {
                tracing::info!(version = %version_name(&new), input = %input.describe(), "the staged version answers the journal differently; moving the whole state");
                return self.swap_inner(new, now_ms, started);
            }
        }
        match self.check_new(running, import, now_ms) {
            Ok(prepared) => {
                let adopt = Adopt { state, journal_from: done };
                let prepared =
                    PreparedSwap { replayed: Some(self.journal.len() - done), adopt: Some(adopt), ..prepared };
                self.switch(new, prepared, started)
            }
            Err(error) => Err(self.refused(error)),
        }
    }

    /// Makes `new` serve, once prepared and checked.
    fn switch(
        &mut self,
        new: LogicRef<'a>,
        prepared: PreparedSwap,
        started: Instant,
    ) -> Result<SwapReport, SupervisorError> {
        let size = self.checkpoint.payload.len();
        let moved = prepared.adopt.as_ref().map_or(size, |adopt| adopt.state.payload.len());
        let report = SwapReport {
            from: version_name(&self.logic),
            to: version_name(&new),
            state_from: (self.checkpoint.version, size),
            state_to: (prepared.state_version, moved),
            first_step: prepared.first_step.clone(),
            replayed: prepared.replayed,
            took: started.elapsed(),
            state_move: prepared.state_move,
        };
        tracing::info!(swap = %report, took = ?report.took, state_move = ?report.state_move, "swapped the logic");
        *self.stats.swaps.entry("accepted").or_default() += 1;
        let to = self.component_ref(&new);
        if let Some(Traced { recorder, handle: Some(handle), .. }) = &mut self.trace {
            let new_handle = recorder.new_handle();
            recorder.swap(*handle, &to, Box::new(move || serde_json::json!({ "Ok": new_handle })));
            *handle = new_handle;
        }
        self.trace_input(&Input::Tick { now_ms: prepared.now_ms }, Ok(&prepared.first_step));
        let previous = std::mem::replace(&mut self.logic, new);
        // The previous version rebuilds, on a rollback, from the same checkpoint and journal.
        let journal = self.journal.clone();
        self.probation =
            Some(Probation { previous, state: self.checkpoint.clone(), journal, served: 0, quarantined: Vec::new() });
        self.running = Some(prepared.running);
        self.state_version = Some(prepared.state_version);
        // Else the checkpoint and the journal stay: the new version took them, so it rebuilds
        // from them. Its first input is the self-check tick.
        if let Some(Adopt { state, journal_from }) = prepared.adopt {
            // Not counted with the checkpoints: those are the serving instance's exports.
            self.stats.last_checkpoint_bytes = state.payload.len();
            self.checkpoint = state;
            self.journal.drain(..journal_from);
            self.journal_steps.drain(..journal_from);
            self.journal_items = self.journal.iter().map(Input::items).sum();
        }
        if let Some(tap) = &mut self.shadow {
            tap.serving_changed();
        }
        self.accept(Input::Tick { now_ms: prepared.now_ms }, &prepared.first_step)?;
        Ok(report)
    }

    fn refused(&mut self, error: SupervisorError) -> SupervisorError {
        tracing::warn!(kind = error.kind(), %error, "swap refused; the running version keeps serving");
        *self.stats.swaps.entry(error.kind()).or_default() += 1;
        error
    }

    /// Everything a swap does before switching: the state move into a fresh instance of `new`,
    /// then [`Self::check_new`].
    fn prepare_swap(&mut self, new: &LoadedLogic, now_ms: u64) -> Result<PreparedSwap, SupervisorError> {
        let config = self.config.clone().ok_or(SupervisorError::NotStarted)?;
        let move_started = Instant::now();
        // With nothing delivered since the checkpoint, it is the state now.
        if !self.journal.is_empty() {
            self.try_checkpoint()?;
        }
        let running = Running::rebuild(new, &config, &self.checkpoint, &[])?;
        self.check_new(running, move_started.elapsed(), now_ms)
    }

    /// The checks of a new version holding the state now. The serving instance is touched only
    /// by the old version's self-check tick, and is rebuilt from the checkpoint and journal
    /// when the swap is then refused.
    fn check_new(
        &mut self,
        mut running: Running,
        state_move: Duration,
        now_ms: u64,
    ) -> Result<PreparedSwap, SupervisorError> {
        // The new version must hold a state at least as new as the one it took.
        let imported = self.checkpoint.version;
        let state_version =
            running.session.tracker_state_version(running.tracker).map_err(guest("state-version (new version)"))?;
        if state_version < imported {
            return Err(SupervisorError::SwapStateRegression { imported, exported: state_version });
        }
        let first_step = running.call(&Input::Tick { now_ms }).map_err(guest("self-check tick (new version)"))?;
        // A new tick with nothing destructive passes whatever the old one says.
        if !destructive(&first_step).is_empty() {
            let old = self.running.as_mut().ok_or(SupervisorError::NotStarted)?;
            let verdict = match old.call(&Input::Tick { now_ms }) {
                Ok(old_tick) => self_check(&old_tick, &first_step),
                Err(error) => Err(guest("self-check tick (old version)")(error)),
            };
            if let Err(refusal) = verdict {
                // The serving instance took a tick nobody carries out: back to its state before.
                self.rebuild()?;
                return Err(refusal);
            }
        }
        Ok(PreparedSwap { running, first_step, now_ms, state_version, state_move, replayed: None, adopt: None })
    }
}

/// The supervisor is the way every driver of the component calls it (`clb-host run` and the
/// simulator's `ComponentReconciler`): the four calls and the figures of [`crate::logic::Logic`],
/// each journalled, checked and recovered as the methods above say.
impl crate::logic::Logic for Supervisor<'_> {
    type Error = SupervisorError;

    fn start(&mut self, config: &wit::Config) -> Result<(), SupervisorError> {
        Supervisor::start(self, config)
    }

    fn observe(&mut self, now_ms: u64, batch: &[wit::Observation]) -> Result<wit::Step, SupervisorError> {
        Supervisor::observe(self, now_ms, batch)
    }

    fn complete(
        &mut self,
        now_ms: u64,
        results: &[(u64, wit::Outcome)],
        arm_remaining_writes: Option<u32>,
    ) -> Result<wit::Step, SupervisorError> {
        self.complete_paced(now_ms, results, arm_remaining_writes)
    }

    fn tick(&mut self, now_ms: u64) -> Result<wit::Step, SupervisorError> {
        Supervisor::tick(self, now_ms)
    }

    fn stats(&mut self, now_ms: u64) -> Result<wit::TrackerStats, SupervisorError> {
        self.logic_stats(now_ms)
    }
}
