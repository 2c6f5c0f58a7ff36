//! Probation: what a swapped-in version must serve before the version it replaced is released,
//! when it is rolled back, and what a rollback delivers to the previous version.

use super::instance::Input;
use super::version::LogicRef;
use crate::bindings::clb::reconciler::types as wit;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Inputs quarantined within its probation that roll a swapped-in version back, by default,
/// whatever it served between them ([`super::Supervisor::with_probation_quarantines`]).
pub const PROBATION_QUARANTINES: u32 = 3;

/// Ticks quarantined within its probation that roll it back (fewer, when the quarantines
/// allowed are fewer): a tick has no object to quarantine, only the time it was called at.
pub const PROBATION_TICK_QUARANTINES: u32 = 2;

/// Inputs a swapped-in version serves before the previous one is released, by default; until
/// then a rollback replays them into the previous version. Only the new version's own inputs
/// count: the journal a probation keeps also holds those from before the swap.
pub const PROBATION_INPUTS: usize = 1_000;

/// The version a swap replaced, kept ready for a rollback while the new one is on probation.
pub(super) struct Probation<'a> {
    pub(super) previous: LogicRef<'a>,
    /// The state the previous version exported at the swap.
    pub(super) state: Arc<wit::VersionedState>,
    /// The inputs since that state: the previous version's journal at the swap, then every
    /// input the new version took.
    pub(super) journal: Vec<Input>,
    /// Of those, the new version's.
    pub(super) served: usize,
    /// The inputs the new version quarantined, in order, each with the length `journal` had
    /// when it came: a rollback delivers them.
    pub(super) quarantined: Vec<(usize, Input)>,
}

impl Probation<'_> {
    /// Why the new version is to be rolled back now, if it is, by the rules of the module
    /// documentation.
    pub(super) fn failed(&self, allowed: u32) -> Option<String> {
        let quarantined = self.quarantined.len();
        let ticks = self.quarantined.iter().filter(|(_, input)| matches!(input, Input::Tick { .. })).count();
        let ticks_allowed = PROBATION_TICK_QUARANTINES.min(allowed) as usize;
        if ticks >= ticks_allowed {
            Some(format!("{ticks} ticks were quarantined within its probation"))
        } else if quarantined >= allowed as usize {
            Some(format!(
                "{quarantined} inputs were quarantined within its probation (of {} it served)",
                self.served + quarantined
            ))
        } else {
            None
        }
    }
}

/// Of the inputs a rolled-back version quarantined (each with the length the journal had when
/// it came), those the previous version is to be delivered (see [`super::Supervisor::rollback`]): not
/// a tick, and not an observation of an object that an input after it, in `journal` or among
/// the quarantined, observes again.
pub(super) fn to_deliver(quarantined: Vec<(usize, Input)>, journal: &[Input]) -> Vec<Input> {
    let mut observed_after: BTreeSet<(&'static str, String)> = BTreeSet::new();
    let mut journal_from = journal.len();
    let mut deliver = Vec::new();
    for (at, input) in quarantined.into_iter().rev() {
        for later in &journal[at.min(journal_from)..journal_from] {
            observed_after.extend(later.objects());
        }
        journal_from = journal_from.min(at);
        let objects = input.objects();
        if !matches!(input, Input::Tick { .. }) && !objects.iter().any(|o| observed_after.contains(o)) {
            deliver.push(input);
        }
        observed_after.extend(objects);
    }
    deliver.reverse();
    deliver
}

/// An input that trapped and was dropped so the rest could go on.
#[derive(Clone, Debug)]
pub struct Quarantined {
    pub input: Input,
    /// The version it trapped on.
    pub version: String,
    pub error: String,
}
