//! What an import checks before it trusts a payload: the bookkeeping the tracker keeps of its
//! commands in flight against the commands, and every lifecycle with work left where the tracker
//! looks for work.

use crate::keyed::{Map, Set};
use crate::lifecycle::Op;

use super::super::nrp::*;
use super::super::outbox::*;
use super::super::state::*;

/// The largest next command id an imported state may hold (see [`check`]).
pub(super) const MAX_NEXT_COMMAND_ID: u64 = 1 << 63;

/// What an import cannot take on trust, checked cheaply (a pass over the commands in flight
/// and one over the lifecycles): the counters of commands in flight, which `complete`
/// decrements, against the commands themselves; each Service command against the lifecycle
/// that waits for it (and no lifecycle waiting for a command that is not in flight: it would
/// never run again); the one read and the batches in flight against their flags (at most [`MAX_BATCHES_IN_FLIGHT`], no location in two); and every
/// id in flight below the next id (a new command would take it); and every lifecycle with work
/// left in a work set (a pass over the timers and one over the lifecycles): the tracker only
/// ever looks at those sets for work, so a lifecycle outside them would never run again. The
/// DiffTracker's own counts are not re-derived: that would cost a pass over every address.
pub(super) fn check(tracker: &Tracker) -> Result<(), String> {
    let (outbox, lifecycles, work) = (&tracker.outbox, &tracker.inbound.lifecycles, &tracker.inbound.work);
    let (nrp, arm, reconciled) = (&tracker.nrp.sync, &tracker.startup.arm, tracker.startup.reconciled);
    let (outbound, pods) = (&tracker.egress.outbound, &tracker.egress.finalizers);
    // One id per command, counting up: no real state comes near the end of u64, and
    // refusing the upper half keeps `issue` from ever overflowing.
    if outbox.next_command_id > MAX_NEXT_COMMAND_ID {
        return Err(format!("the next command id {} is past {MAX_NEXT_COMMAND_ID}", outbox.next_command_id));
    }
    let (mut service_commands, mut nrp_writes, mut reads, mut arm_reads, mut batches) =
        (0usize, 0u32, 0usize, 0usize, Vec::new());
    let mut pod_commands = Map::new();
    for (&id, what) in &outbox.in_flight {
        if id >= outbox.next_command_id {
            return Err(format!("command {id} is in flight, but the next command id is {}", outbox.next_command_id));
        }
        match what {
            InFlight::Service { identity, step } => {
                service_commands += 1;
                nrp_writes += u32::from(step.writes_nrp());
                if lifecycles.get(identity).and_then(|l| l.attempt.in_flight) != Some((id, *step)) {
                    return Err(format!(
                        "command {id} ({step:?}) is in flight for {identity}, whose lifecycle does not wait for it"
                    ));
                }
            }
            InFlight::Outbound { identity, step } => {
                service_commands += 1;
                nrp_writes += u32::from(step.writes_nrp());
                if outbound.lifecycles.get(identity).and_then(|l| l.attempt.in_flight) != Some((id, *step)) {
                    return Err(format!(
                        "command {id} ({step:?}) is in flight for egress identity {identity}, whose outbound \
                         lifecycle does not wait for it"
                    ));
                }
            }
            InFlight::PodFinalizer { key, .. } => {
                pod_commands.insert(id, key);
            }
            InFlight::Locations(_) => batches.push(id),
            InFlight::ReadNrp => reads += 1,
            InFlight::ReadArm => arm_reads += 1,
            InFlight::Event => {}
        }
    }
    pods.check(&pod_commands)?;
    let waiting = lifecycles.values().filter(|l| l.attempt.in_flight.is_some()).count()
        + outbound.lifecycles.values().filter(|l| l.attempt.in_flight.is_some()).count();
    let counts = [
        ("Service commands counted", outbox.service_commands_in_flight, "Service commands", service_commands),
        ("lifecycles wait for a command", waiting, "Service commands", service_commands),
        ("NRP writes counted", nrp.service_writes_in_flight as usize, "NRP writes", nrp_writes as usize),
        ("reads of NRP flagged", usize::from(nrp.read_in_flight), "reads of NRP", reads),
        ("reads of ARM flagged", usize::from(arm.read_in_flight), "reads of ARM", arm_reads),
    ];
    if arm.settled && arm.read_in_flight {
        return Err("the ARM inventory is settled, but a read of it is in flight".into());
    }
    if reconciled && !arm.settled {
        return Err("start-up reconciliation ran, but the ARM inventory is not settled".into());
    }
    for (what, counted, which, in_flight) in counts {
        if counted != in_flight {
            return Err(format!("{counted} {what} in flight, but {in_flight} {which} are in flight"));
        }
    }
    if !batches.iter().eq(nrp.batches_in_flight.keys()) {
        return Err(format!(
            "address-location batches in flight {batches:?}, but the batches counted in flight are {:?}",
            nrp.batches_in_flight.keys().collect::<Vec<_>>()
        ));
    }
    if batches.len() > MAX_BATCHES_IN_FLIGHT {
        return Err(format!("{} address-location batches in flight, over {MAX_BATCHES_IN_FLIGHT}", batches.len()));
    }
    // No location in two batches in flight: their answers could arrive in either order.
    let mut locations = Set::new();
    if let Some(twice) = location_batches(&nrp.batches_in_flight, &outbox.in_flight)
        .flatten()
        .find(|l| !locations.insert(l.location.as_str()))
    {
        return Err(format!("location {:?} is in more than one batch in flight", twice.location));
    }
    // Where the tracker looks for each lifecycle's work: a pending deletion waits in
    // `draining` (and only one does, or the tracker would never be idle), any other work left
    // is in flight, runnable or on a timer.
    work.check(lifecycles, "lifecycle")
}
