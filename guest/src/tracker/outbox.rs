//! The outbox: the one handle through which every part of the tracker sends what it decides. A
//! command goes out with the next id and is remembered as in flight ([`InFlight`]) until its
//! answer comes; an Event is a command nobody waits for.

use super::egress::outbound::OutStep;
use crate::keyed::Map;
use crate::model::*;
use serde::{Deserialize, Serialize};

use super::service::OpStep;

/// The most Service commands (Azure or Kubernetes) in flight at once.
pub const MAX_SERVICE_COMMANDS_IN_FLIGHT: usize = 16;

/// What a command in flight was for: where its answer goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum InFlight {
    Service {
        identity: String,
        step: OpStep,
    },
    Locations(Vec<NrpLocation>),
    ReadNrp,
    Event,
    ReadArm,
    /// A command of an egress identity's outbound lifecycle (state version 6).
    Outbound {
        identity: String,
        step: OutStep,
    },
    /// The finalizer of an egress pod (state version 7): added (`present`) or released.
    PodFinalizer {
        key: ObjectKey,
        uid: String,
        present: bool,
    },
}

impl InFlight {
    /// Whether ARM counts it as a write (NRP's calls are POST actions through ARM).
    pub(super) fn writes_arm(&self) -> bool {
        use crate::lifecycle::Op;
        match self {
            InFlight::Service { step, .. } => step.write_kind().is_some(),
            InFlight::Outbound { step, .. } => step.write_kind().is_some(),
            InFlight::Locations(_) => true,
            InFlight::ReadNrp | InFlight::Event | InFlight::ReadArm | InFlight::PodFinalizer { .. } => false,
        }
    }
}

/// The commands in flight, by id, and the id the next one takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Outbox {
    pub(super) next_command_id: u64,
    pub(super) in_flight: Map<u64, InFlight>,
    /// Service and egress-identity commands (Azure or Kubernetes) in flight, at most
    /// [`MAX_SERVICE_COMMANDS_IN_FLIGHT`].
    pub(super) service_commands_in_flight: usize,
}

impl Outbox {
    /// The commands in flight, by id.
    pub(super) fn in_flight(&self) -> &Map<u64, InFlight> {
        &self.in_flight
    }

    /// The answer to command `id` came: what it was for, if it was in flight (an unknown id is a
    /// duplicate or stale answer). A Service or egress-identity command frees its room.
    pub(super) fn answered(&mut self, id: u64) -> Option<InFlight> {
        let what = self.in_flight.remove(&id)?;
        if matches!(what, InFlight::Service { .. } | InFlight::Outbound { .. }) {
            self.service_commands_in_flight -= 1;
        }
        Some(what)
    }

    /// The commands in flight that ARM counts as writes and whose answers are not among
    /// `answered`: ARM may not have counted them in the figure it just sent.
    pub(super) fn arm_writes_unanswered(&self, answered: impl Fn(&u64) -> bool) -> usize {
        self.in_flight.iter().filter(|(id, what)| what.writes_arm() && !answered(id)).count()
    }

    /// A Service or egress-identity command is in flight (the count the import check holds to
    /// the commands themselves).
    pub(super) fn has_service_command(&self) -> bool {
        self.service_commands_in_flight > 0
    }

    /// Nothing is in flight but Events (which need no answer to proceed).
    pub(super) fn only_events(&self) -> bool {
        self.in_flight.values().all(|f| matches!(f, InFlight::Event))
    }

    /// The id the next command takes.
    pub(super) fn next_id(&self) -> u64 {
        self.next_command_id
    }

    /// Whether another Service or egress-identity command may go
    /// ([`MAX_SERVICE_COMMANDS_IN_FLIGHT`]).
    pub(super) fn has_service_room(&self) -> bool {
        self.service_commands_in_flight < MAX_SERVICE_COMMANDS_IN_FLIGHT
    }

    /// Sends a Service or egress-identity command (counted against the room in flight).
    pub(super) fn issue_service(&mut self, command: Command, what: InFlight, step: &mut Step) -> u64 {
        self.service_commands_in_flight += 1;
        self.issue(command, what, step)
    }

    /// Sends `command`, remembering `what` it is for; returns its id.
    #[inline(never)] // one copy for its many callers (component size, BENCHMARKS.md)
    pub(super) fn issue(&mut self, command: Command, what: InFlight, step: &mut Step) -> u64 {
        let id = self.next_command_id;
        self.next_command_id += 1;
        self.in_flight.insert(id, what);
        step.commands.push(Issued { id, command });
        id
    }

    /// Sends an Event about `regarding`; one about an orphan found in NRP, which has no object
    /// to attach it to, is not sent.
    pub(super) fn event(
        &mut self,
        regarding: &ObjectRef,
        event_type: EventType,
        reason: &str,
        message: String,
        step: &mut Step,
    ) {
        if regarding.name.is_empty() {
            return;
        }
        let event = Event { regarding: regarding.clone(), event_type, reason: reason.to_owned(), message };
        self.issue(Command::EmitEvent(event), InFlight::Event, step);
    }
}

/// The address-location batches of `ids` (`NrpSync::batches_in_flight`) as they went out (a free
/// function, so that callers holding other fields of the outbox mutably can use it).
pub(super) fn location_batches<'a>(
    ids: &'a Map<u64, u64>,
    in_flight: &'a Map<u64, InFlight>,
) -> impl Iterator<Item = &'a [NrpLocation]> {
    ids.keys().filter_map(|id| match in_flight.get(id) {
        Some(InFlight::Locations(batch)) => Some(batch.as_slice()),
        _ => None,
    })
}
