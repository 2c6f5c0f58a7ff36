//! How a candidate's answer differs from the serving version's: a step's commands compared by
//! content (their ids aside), its wake-up and idleness ([`differences`]), and what `/status`
//! shows of a difference ([`Divergence`], [`Answer`]).

use crate::bindings::clb::reconciler::types as wit;
use crate::command_name;
use serde::Serialize;
use std::collections::BTreeSet;

/// Commands shown per side of a divergence in `/status`.
const SHOWN_COMMANDS: usize = 8;

/// One input the two versions answered differently.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Divergence {
    /// The input, as the logs describe it.
    pub input: String,
    pub kinds: Vec<String>,
    pub serving: Answer,
    pub candidate: Answer,
    /// The trace it was written to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

/// One side of a [`Divergence`]: the commands only it proposed (the first few, by content in the
/// canonical JSON of WIT values' serde form), and its wake-up and idleness; of an
/// [`ADMISSION`](super::ADMISSION) divergence, its verdict (or its trap) alone in `only`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    pub only: Vec<serde_json::Value>,
    /// Commands only it proposed beyond those shown.
    pub more: usize,
    pub wake_at_ms: Option<u64>,
    /// `None` for a verdict, which has no idleness.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<bool>,
}

/// A step's commands keyed by content, sorted.
fn keyed(step: &wit::Step) -> Vec<(String, u64, &wit::Command)> {
    let mut keyed: Vec<_> = step
        .commands
        .iter()
        .map(|issued| {
            let key = serde_json::to_string(&issued.command).expect("bindgen types serialize");
            (key, issued.id, &issued.command)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    keyed
}

/// The kinds by which two steps differ; empty when they agree (see the module documentation).
pub fn differences(serving: &wit::Step, candidate: &wit::Step) -> (Vec<String>, Answer, Answer) {
    let (ours, theirs) = (keyed(serving), keyed(candidate));
    // A multiset difference over the sorted keys.
    let (mut only_serving, mut only_candidate) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    let mut same_ids = true;
    while i < ours.len() || j < theirs.len() {
        match (ours.get(i), theirs.get(j)) {
            (Some(a), Some(b)) if a.0 == b.0 => {
                same_ids &= a.1 == b.1;
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a.0 < b.0 => {
                only_serving.push(a.2);
                i += 1;
            }
            (Some(_), Some(b)) => {
                only_candidate.push(b.2);
                j += 1;
            }
            (Some(a), None) => {
                only_serving.push(a.2);
                i += 1;
            }
            (None, Some(b)) => {
                only_candidate.push(b.2);
                j += 1;
            }
            (None, None) => break,
        }
    }
    let mut kinds: BTreeSet<String> =
        only_serving.iter().chain(&only_candidate).map(|c| command_name(c).to_owned()).collect();
    if only_serving.is_empty() && only_candidate.is_empty() && !same_ids {
        kinds.insert("command-order".into());
    }
    if serving.wake_at_ms != candidate.wake_at_ms {
        kinds.insert("wake-at".into());
    }
    if serving.idle != candidate.idle {
        kinds.insert("idle".into());
    }
    let answer = |only: Vec<&wit::Command>, step: &wit::Step| Answer {
        more: only.len().saturating_sub(SHOWN_COMMANDS),
        only: only
            .into_iter()
            .take(SHOWN_COMMANDS)
            .map(|c| serde_json::to_value(c).expect("bindgen types serialize"))
            .collect(),
        wake_at_ms: step.wake_at_ms,
        idle: Some(step.idle),
    };
    (kinds.into_iter().collect(), answer(only_serving, serving), answer(only_candidate, candidate))
}
