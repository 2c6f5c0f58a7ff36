//! Replaying traces through a component and comparing every result (`docs/traces.md`, "Replay
//! and the shadow check"): the calls are made by value through the component's own types, as
//! any other host would make them, so the same code replays any component of the world.

use super::canonical::{CodecError, to_val, write_str, write_val};
use super::recorder::FORMAT_VERSION;
use super::schema::{Signature, Signatures};
use crate::{LoadedLogic, Session};
use serde::Deserialize;
use serde_json::Value as Json;
use serde_json::value::RawValue;
use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::Path;
use wasmtime::component::{ResourceAny, Type, Val};

/// The longest line a reader takes (a 30,000-pod state is ~10 MB as base64).
pub const MAX_LINE_BYTES: usize = 64 << 20;
/// Rounds of answers to commands only the replayed logic issued, after one call.
const EXTRA_ROUNDS: usize = 8;
/// Commands that `ok` answers, when only the replayed logic issued them.
const OK_ANSWERS: &[&str] = &[
    "emit-event",
    "update-services",
    "update-address-locations",
    "put-load-balancer",
    "put-nat-gateway",
    "delete-resource",
    "patch-service-status",
    "set-finalizer",
];
/// Calls whose result is a `step`, whose commands are aligned.
const STEP_CALLS: &[&str] = &["tracker.observe", "tracker.complete", "tracker.tick"];

/// A trace that cannot be read or replayed (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {why}")]
pub struct ReplayError {
    pub file: String,
    pub line: usize,
    pub why: String,
}

/// One result that differs.
#[derive(Clone, Debug)]
pub struct Divergence {
    pub line: usize,
    pub seq: u64,
    pub call: String,
    /// The arguments as recorded (canonical text).
    pub args: String,
    /// The recorded result's text, or `{"trap":…}`.
    pub recorded: String,
    /// The replayed result's canonical text (ids aligned), or `{"trap":…}`.
    pub replayed: String,
    /// What it counts under in the summary.
    pub kinds: Vec<String>,
}

/// What replaying one trace found.
#[derive(Clone, Debug, Default)]
pub struct TraceReport {
    pub file: String,
    pub calls: usize,
    /// Every divergence found (only the first when replay stops at it).
    pub divergences: Vec<Divergence>,
}

/// The components a replay uses.
pub struct Components<'a> {
    /// Replays the trace (and every `swap` whose component is not named below).
    pub primary: &'a LoadedLogic,
    /// `--swap-component NAME=FILE`: what a `swap` to NAME uses.
    pub named: &'a BTreeMap<String, LoadedLogic>,
}

/// A handle's resource, where it lives, and how to make it again.
struct Held {
    logic: LoadedLogic,
    signatures: Signatures,
    session: Session,
    resource: ResourceAny,
    /// The calls that made the resource's state: its root (no `self`) and every call since that
    /// did not trap, as this replay made them.
    lineage: Vec<Made>,
    /// Before a `swap`: the component and lineage a `rollback` returns to.
    before_swap: Option<Box<(LoadedLogic, Vec<Made>)>>,
    /// Recorded command id → the id the replayed logic gave the same command.
    ids: BTreeMap<u64, u64>,
    /// Recorded command ids the replayed logic did not issue: their outcomes are not sent.
    missing: BTreeSet<u64>,
}

#[derive(Clone)]
struct Made {
    call: String,
    /// Without `self`.
    params: Vec<Val>,
}

#[derive(Deserialize)]
struct Header {
    format: String,
    version: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    seq: u64,
    call: String,
    #[serde(borrow)]
    args: &'a RawValue,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    trap: Option<String>,
}

/// How a replayed call ended.
enum Got {
    Returned(Vec<Val>),
    Trapped(String),
}

struct Replayer<'a> {
    components: Components<'a>,
    signatures: Signatures,
    held: BTreeMap<u64, Held>,
    /// Pure functions run here; remade after a trap.
    pure: Option<Session>,
}

/// Replays the trace at `path`; `all` goes on past the first divergence.
pub fn replay_file(path: &Path, components: Components<'_>, all: bool) -> Result<TraceReport, ReplayError> {
    let file = path.display().to_string();
    let at = |line: usize, why: String| ReplayError { file: file.clone(), line, why };
    let handle = std::fs::File::open(path).map_err(|e| at(0, format!("cannot read: {e}")))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, handle);
    let mut buf = Vec::new();
    let mut report = TraceReport { file: file.clone(), ..TraceReport::default() };
    if !read_line(&mut reader, &mut buf).map_err(|why| at(1, why))? {
        return Err(at(1, "empty: no header".into()));
    }
    let header: Header = serde_json::from_slice(&buf).map_err(|e| at(1, format!("not a trace header: {e}")))?;
    if header.format != "clb-trace" || header.version != FORMAT_VERSION {
        return Err(at(
            1,
            format!(
                "format {:?} version {}; this host reads clb-trace version {FORMAT_VERSION}",
                header.format, header.version
            ),
        ));
    }
    let signatures = crate::trace::Signatures::of(components.primary);
    let mut replayer = Replayer { components, signatures, held: BTreeMap::new(), pure: None };
    let mut number = 1;
    loop {
        number += 1;
        if !read_line(&mut reader, &mut buf).map_err(|why| at(number, why))? {
            break;
        }
        let line: Line<'_> = serde_json::from_slice(&buf).map_err(|e| at(number, format!("not a trace line: {e}")))?;
        if line.seq != report.calls as u64 {
            return Err(at(number, format!("seq {} where {} was due", line.seq, report.calls)));
        }
        report.calls += 1;
        if let Some(mut divergence) = replayer.line(&line).map_err(|why| at(number, why))? {
            divergence.line = number;
            report.divergences.push(divergence);
            if !all {
                break;
            }
        }
    }
    Ok(report)
}

/// Reads one line (without its newline) into `buf`; false at the end. Never holds more than
/// [`MAX_LINE_BYTES`].
fn read_line(reader: &mut impl BufRead, buf: &mut Vec<u8>) -> Result<bool, String> {
    buf.clear();
    loop {
        let chunk = reader.fill_buf().map_err(|e| format!("cannot read: {e}"))?;
        if chunk.is_empty() {
            if buf.is_empty() {
                return Ok(false);
            }
            return Err("the last line has no newline: the trace is truncated".into());
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(end) => (end, true),
            None => (chunk.len(), false),
        };
        if buf.len() + take > MAX_LINE_BYTES {
            return Err(format!("a line over {MAX_LINE_BYTES} bytes"));
        }
        buf.extend_from_slice(&chunk[..take]);
        reader.consume(take + usize::from(done));
        if done {
            return Ok(true);
        }
    }
}

fn canonical(val: &Val, ty: &Type, handle: u64) -> Result<String, String> {
    let mut out = String::new();
    write_val(&mut out, val, ty, &mut |_| handle).map_err(|e| format!("the replayed result does not encode: {e}"))?;
    Ok(out)
}

fn trap_text(text: &str) -> String {
    let mut out = String::from("{\"trap\":");
    write_str(&mut out, text);
    out.push('}');
    out
}

fn codec(what: &str) -> impl Fn(CodecError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Calls `signature` with `params` (`self` included) in `session`.
fn invoke(session: &mut Session, signature: &Signature, params: &[Val]) -> Result<Got, String> {
    let func = session
        .export(&signature.interface, &signature.export)
        .ok_or_else(|| format!("the component does not export {}", signature.call))?;
    match session.call_dynamic("replay", func, params) {
        Ok(results) => Ok(Got::Returned(results)),
        Err(error) => Ok(Got::Trapped(error.to_string())),
    }
}

/// A fresh instance of `logic` holding the state `lineage` builds.
fn build(logic: &LoadedLogic, signatures: &Signatures, lineage: &[Made]) -> Result<(Session, ResourceAny), String> {
    let mut session = logic.session().map_err(|e| format!("instantiating: {e}"))?;
    let (root, rest) = lineage.split_first().ok_or("an empty lineage")?;
    let signature = signatures.get(&root.call).ok_or_else(|| format!("the component lacks {}", root.call))?;
    let resource = match invoke(&mut session, signature, &root.params)? {
        Got::Returned(results) => results.first().and_then(resource_in),
        Got::Trapped(text) => return Err(format!("rebuilding: {} trapped: {text}", root.call)),
    }
    .ok_or_else(|| format!("rebuilding: {} made no resource", root.call))?;
    for made in rest {
        let signature = signatures.get(&made.call).ok_or_else(|| format!("the component lacks {}", made.call))?;
        let mut params = vec![Val::Resource(resource)];
        params.extend_from_slice(&made.params);
        if let Got::Trapped(text) = invoke(&mut session, signature, &params)? {
            return Err(format!("rebuilding: {} trapped on a call it took before: {text}", made.call));
        }
    }
    Ok((session, resource))
}

impl Replayer<'_> {
    /// Replays one line; a divergence, or `None` when it matched.
    fn line(&mut self, line: &Line<'_>) -> Result<Option<Divergence>, String> {
        let args: serde_json::Map<String, Json> =
            serde_json::from_str(line.args.get()).map_err(|e| format!("args: {e}"))?;
        match line.call.as_str() {
            "rebuild" => {
                self.rebuild(self_handle(&args)?)?;
                Ok(None)
            }
            "swap" => self.swap(line, &args),
            "rollback" => self.rollback(line, &args),
            _ => self.call(line, &args),
        }
    }

    fn recorded(line: &Line<'_>) -> String {
        match (&line.trap, line.result) {
            (Some(text), _) => trap_text(text),
            (None, Some(raw)) => raw.get().to_owned(),
            (None, None) => "null".into(),
        }
    }

    /// The handle a recorded result names (`N`, or `{"tag":"ok","val":N}`).
    fn recorded_handle(line: &Line<'_>) -> Option<u64> {
        let json: Json = serde_json::from_str(line.result?.get()).ok()?;
        json.as_u64().or_else(|| if json["tag"] == "ok" { json["val"].as_u64() } else { None })
    }

    fn call(&mut self, line: &Line<'_>, args: &serde_json::Map<String, Json>) -> Result<Option<Divergence>, String> {
        let signature =
            self.signatures.get(&line.call).cloned().ok_or_else(|| format!("unknown call {:?}", line.call))?;
        if let Some(unknown) = args.keys().find(|k| !signature.params.iter().any(|(name, _)| name == *k)) {
            return Err(format!("unknown argument {unknown:?} of {}", line.call));
        }
        let method = signature.params.first().is_some_and(|(name, _)| name == "self");
        let target = if method { Some(self_handle(args)?) } else { None };
        let mut params = Vec::new();
        for (name, ty) in signature.params.iter().skip(usize::from(method)) {
            let json = args.get(name).ok_or_else(|| format!("argument {name:?} missing"))?;
            params.push(to_val(json, ty, &|_| None).map_err(codec(name))?);
        }
        let recorded = Self::recorded(line);
        let recorded_handle = Self::recorded_handle(line);
        let Some(handle) = target else {
            // A pure function, or a resource's first call (in an instance of its own).
            let root = signature.resource.is_some();
            let mut fresh = None;
            let session = if root {
                fresh.insert(self.components.primary.session().map_err(|e| format!("instantiating: {e}"))?)
            } else {
                if self.pure.is_none() {
                    self.pure = Some(self.components.primary.session().map_err(|e| format!("instantiating: {e}"))?);
                }
                self.pure.as_mut().expect("just set")
            };
            let got = invoke(session, &signature, &params)?;
            let replayed = self.encode(&got, &signature, recorded_handle)?;
            match (&got, fresh, recorded_handle) {
                (Got::Returned(results), Some(session), Some(handle)) => {
                    if let Some(resource) = results.first().and_then(resource_in) {
                        self.held.insert(
                            handle,
                            Held {
                                logic: self.components.primary.clone(),
                                signatures: self.signatures.clone(),
                                session,
                                resource,
                                lineage: vec![Made { call: line.call.clone(), params }],
                                before_swap: None,
                                ids: BTreeMap::new(),
                                missing: BTreeSet::new(),
                            },
                        );
                    }
                }
                (Got::Trapped(_), None, _) => self.pure = None,
                _ => {}
            }
            return Ok(self.verdict(line, &got, recorded, replayed));
        };
        let held =
            self.held.get_mut(&handle).ok_or_else(|| format!("handle {handle} does not exist in this replay"))?;
        if line.call == "tracker.complete" {
            params = map_outcome_ids(held, params);
        }
        let mut full = vec![Val::Resource(held.resource)];
        full.extend_from_slice(&params);
        let signature =
            held.signatures.get(&line.call).cloned().ok_or_else(|| format!("the component lacks {}", line.call))?;
        let got = invoke(&mut held.session, &signature, &full)?;
        if let Got::Returned(_) = got {
            held.lineage.push(Made { call: line.call.clone(), params: params.clone() });
        }
        let mut kinds = None;
        let replayed = match (&got, STEP_CALLS.contains(&line.call.as_str()) && line.trap.is_none()) {
            (Got::Returned(results), true) => {
                let (text, step_kinds, extra) = align(held, &signature, results, &recorded)?;
                kinds = Some(step_kinds);
                let now = params.first().cloned().unwrap_or(Val::U64(0));
                self.answer_extra(handle, now, extra)?;
                text
            }
            _ => self.encode(&got, &signature, recorded_handle)?,
        };
        if matches!(got, Got::Trapped(_)) && line.trap.is_none() {
            // The recording host's logic did not trap here: go on from the state before.
            self.rebuild(handle)?;
        }
        let mut divergence = self.verdict(line, &got, recorded, replayed);
        if let (Some(d), Some(kinds)) = (&mut divergence, kinds)
            && d.kinds != ["trap"]
        {
            d.kinds = kinds;
        }
        Ok(divergence)
    }

    fn encode(&self, got: &Got, signature: &Signature, handle: Option<u64>) -> Result<String, String> {
        Ok(match (got, &signature.result) {
            (Got::Trapped(text), _) => trap_text(text),
            (Got::Returned(results), Some(ty)) => match results.first() {
                Some(val) => canonical(val, ty, handle.unwrap_or(u64::MAX))?,
                None => "null".into(),
            },
            (Got::Returned(_), None) => "null".into(),
        })
    }

    fn verdict(&self, line: &Line<'_>, got: &Got, recorded: String, replayed: String) -> Option<Divergence> {
        let trapped = matches!(got, Got::Trapped(_));
        if trapped && line.trap.is_some() || recorded == replayed {
            return None;
        }
        let kind = if trapped != line.trap.is_some() { "trap".to_owned() } else { line.call.clone() };
        Some(Divergence {
            line: 0,
            seq: line.seq,
            call: line.call.clone(),
            args: line.args.get().to_owned(),
            recorded,
            replayed,
            kinds: vec![kind],
        })
    }

    /// Answers, with `ok`, the commands only the replayed logic issued, and what those answers
    /// make it issue, for a few rounds; nothing of it is compared.
    fn answer_extra(&mut self, handle: u64, now: Val, mut ids: Vec<u64>) -> Result<(), String> {
        for _ in 0..EXTRA_ROUNDS {
            if ids.is_empty() {
                return Ok(());
            }
            let held = self.held.get_mut(&handle).expect("the caller holds it");
            let results =
                ids.iter().map(|id| Val::Tuple(vec![Val::U64(*id), Val::Variant("ok".into(), None)])).collect();
            // No figure from ARM: these answers are not Azure's.
            let params = vec![now.clone(), Val::List(results), Val::Option(None)];
            let signature =
                held.signatures.get("tracker.complete").cloned().ok_or("the component lacks tracker.complete")?;
            let mut full = vec![Val::Resource(held.resource)];
            full.extend_from_slice(&params);
            match invoke(&mut held.session, &signature, &full)? {
                Got::Returned(results) => {
                    held.lineage.push(Made { call: "tracker.complete".into(), params });
                    ids = results
                        .first()
                        .map(commands)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|c| answered(&c.tag))
                        .map(|c| c.id)
                        .collect();
                }
                Got::Trapped(_) => return self.rebuild(handle),
            }
        }
        Ok(())
    }

    fn rebuild(&mut self, handle: u64) -> Result<(), String> {
        let held =
            self.held.get_mut(&handle).ok_or_else(|| format!("rebuild of handle {handle}, which does not exist"))?;
        let (session, resource) = build(&held.logic, &held.signatures, &held.lineage)?;
        held.session = session;
        held.resource = resource;
        Ok(())
    }

    fn swap(&mut self, line: &Line<'_>, args: &serde_json::Map<String, Json>) -> Result<Option<Divergence>, String> {
        let handle = self_handle(args)?;
        let name = args
            .get("component")
            .and_then(|c| c.get("name"))
            .and_then(Json::as_str)
            .ok_or("swap: component.name missing")?;
        let logic = self.components.named.get(name).unwrap_or(self.components.primary).clone();
        let signatures = crate::trace::Signatures::of(&logic);
        let held =
            self.held.get_mut(&handle).ok_or_else(|| format!("swap of handle {handle}, which does not exist"))?;
        let export =
            held.signatures.get("tracker.export-state").cloned().ok_or("the component lacks tracker.export-state")?;
        let state = match invoke(&mut held.session, &export, &[Val::Resource(held.resource)])? {
            Got::Returned(results) => results.into_iter().next().ok_or("export-state returned nothing")?,
            Got::Trapped(text) => return Err(format!("swap: the replayed logic trapped on export-state: {text}")),
        };
        let config = held.lineage.first().and_then(|root| root.params.first().cloned()).ok_or("swap: no config")?;
        let import =
            signatures.get("tracker.import-state").cloned().ok_or("the component lacks tracker.import-state")?;
        let mut session = logic.session().map_err(|e| format!("instantiating: {e}"))?;
        let params = vec![config, state];
        let got = invoke(&mut session, &import, &params)?;
        let recorded = Self::recorded(line);
        let new_handle = Self::recorded_handle(line);
        let replayed = self.encode(&got, &import, new_handle)?;
        if let (Got::Returned(results), Some(new_handle)) = (&got, new_handle)
            && let Some(resource) = results.first().and_then(resource_in)
        {
            let before = self.held.remove(&handle).expect("looked up above");
            self.held.insert(
                new_handle,
                Held {
                    logic,
                    signatures,
                    session,
                    resource,
                    lineage: vec![Made { call: "tracker.import-state".into(), params }],
                    before_swap: Some(Box::new((before.logic, before.lineage))),
                    ids: before.ids,
                    missing: before.missing,
                },
            );
        }
        Ok(self.verdict(line, &got, recorded, replayed))
    }

    fn rollback(
        &mut self,
        line: &Line<'_>,
        args: &serde_json::Map<String, Json>,
    ) -> Result<Option<Divergence>, String> {
        let handle = self_handle(args)?;
        let new_handle =
            line.result.and_then(|r| r.get().parse::<u64>().ok()).ok_or("rollback: the result must be a handle")?;
        let held =
            self.held.remove(&handle).ok_or_else(|| format!("rollback of handle {handle}, which does not exist"))?;
        let (logic, mut lineage) = *held.before_swap.ok_or("rollback of a handle that no swap made")?;
        lineage.extend(held.lineage.into_iter().skip(1));
        let signatures = crate::trace::Signatures::of(&logic);
        let (session, resource) = build(&logic, &signatures, &lineage)?;
        self.held.insert(
            new_handle,
            Held {
                logic,
                signatures,
                session,
                resource,
                lineage,
                before_swap: None,
                ids: held.ids,
                missing: held.missing,
            },
        );
        Ok(None)
    }
}

/// One command of a step: its id, its canonical text and its case.
struct Cmd {
    id: u64,
    text: String,
    tag: String,
}

fn field<'v>(val: &'v Val, name: &str) -> Option<&'v Val> {
    match val {
        Val::Record(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
        _ => None,
    }
}

/// The commands of a `step` value.
fn commands(step: &Val) -> Vec<Cmd> {
    let Some(Val::List(issued)) = field(step, "commands") else { return Vec::new() };
    issued
        .iter()
        .filter_map(|issued| {
            let Some(Val::U64(id)) = field(issued, "id") else { return None };
            let command = field(issued, "command")?;
            let Val::Variant(tag, _) = command else { return None };
            Some(Cmd { id: *id, text: format!("{command:?}"), tag: tag.clone() })
        })
        .collect()
}

fn answered(tag: &str) -> bool {
    OK_ANSWERS.contains(&tag)
}

/// Aligns a replayed step with the recorded one (`docs/traces.md`): the replayed step's text
/// with its matched ids replaced by the recorded ones, the summary keys of a difference, and
/// the ids of the commands only the replayed logic issued that `ok` answers.
fn align(
    held: &mut Held,
    signature: &Signature,
    results: &[Val],
    recorded: &str,
) -> Result<(String, Vec<String>, Vec<u64>), String> {
    let ty = signature.result.as_ref().ok_or("a step call without a result")?;
    let replayed = results.first().ok_or("no result")?;
    let json: Json = serde_json::from_str(recorded).map_err(|e| format!("recorded result: {e}"))?;
    let recorded_step = to_val(&json, ty, &|_| None).map_err(codec("recorded result"))?;
    let theirs = commands(&recorded_step);
    let ours = commands(replayed);
    let mut used = vec![false; ours.len()];
    let mut to_recorded = BTreeMap::new();
    let mut unmatched = Vec::new();
    for cmd in &theirs {
        match ours.iter().enumerate().find(|(j, c)| !used[*j] && c.text == cmd.text) {
            Some((j, c)) => {
                used[j] = true;
                to_recorded.insert(c.id, cmd.id);
                held.ids.insert(cmd.id, c.id);
            }
            None => {
                held.missing.insert(cmd.id);
                unmatched.push(cmd.tag.clone());
            }
        }
    }
    let extra: Vec<&Cmd> = ours.iter().zip(&used).filter(|(_, used)| !**used).map(|(c, _)| c).collect();
    unmatched.extend(extra.iter().map(|c| c.tag.clone()));
    let normalized = replace_ids(replayed, &to_recorded);
    let text = canonical(&normalized, ty, u64::MAX)?;
    let kinds = if unmatched.is_empty() { vec!["step".to_owned()] } else { distinct(unmatched) };
    Ok((text, kinds, extra.iter().filter(|c| answered(&c.tag)).map(|c| c.id).collect()))
}

/// The step with each `issued.id` found in `map` replaced.
fn replace_ids(step: &Val, map: &BTreeMap<u64, u64>) -> Val {
    let Val::Record(fields) = step else { return step.clone() };
    let fields = fields
        .iter()
        .map(|(name, val)| match (name.as_str(), val) {
            ("commands", Val::List(issued)) => {
                let issued = issued
                    .iter()
                    .map(|issued| match issued {
                        Val::Record(parts) => Val::Record(
                            parts
                                .iter()
                                .map(|(n, v)| match (n.as_str(), v) {
                                    ("id", Val::U64(id)) => (n.clone(), Val::U64(*map.get(id).unwrap_or(id))),
                                    _ => (n.clone(), v.clone()),
                                })
                                .collect(),
                        ),
                        other => other.clone(),
                    })
                    .collect();
                (name.clone(), Val::List(issued))
            }
            _ => (name.clone(), val.clone()),
        })
        .collect();
    Val::Record(fields)
}

/// `tracker.complete`'s results with recorded ids turned into the replayed logic's, and those
/// of commands it never issued left out.
fn map_outcome_ids(held: &Held, mut params: Vec<Val>) -> Vec<Val> {
    if let Some(Val::List(results)) = params.get_mut(1) {
        results.retain_mut(|result| {
            let Val::Tuple(parts) = result else { return true };
            let Some(Val::U64(id)) = parts.first_mut() else { return true };
            if held.missing.contains(id) {
                return false;
            }
            if let Some(ours) = held.ids.get(id) {
                *id = *ours;
            }
            true
        });
    }
    params
}

fn resource_in(val: &Val) -> Option<ResourceAny> {
    match val {
        Val::Resource(r) => Some(*r),
        Val::Result(Ok(Some(inner))) => resource_in(inner),
        _ => None,
    }
}

fn self_handle(args: &serde_json::Map<String, Json>) -> Result<u64, String> {
    args.get("self").and_then(Json::as_u64).ok_or_else(|| "argument \"self\" (a handle) missing".into())
}

/// Summary keys and their counts, in key order.
pub fn by_kind(reports: &[TraceReport]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for kind in reports.iter().flat_map(|r| &r.divergences).flat_map(|d| &d.kinds) {
        *counts.entry(kind.clone()).or_default() += 1;
    }
    counts
}

/// Distinct values, in the order given.
fn distinct(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    items.into_iter().filter(|i| seen.insert(i.clone())).collect()
}

/// The text report (`docs/traces.md`, "Divergence report").
pub fn text_report(reports: &[TraceReport], all: bool, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    for report in reports {
        for d in &report.divergences {
            writeln!(out, "{}:{}: seq {}: {} differs", report.file, d.line, d.seq, d.call)?;
            writeln!(out, "  args: {}", d.args)?;
            writeln!(out, "  recorded: {}", d.recorded)?;
            writeln!(out, "  replayed: {}", d.replayed)?;
        }
        match report.divergences.len() {
            0 => writeln!(out, "{}: {} calls, identical", report.file, report.calls)?,
            n => writeln!(out, "{}: {} calls, {n} divergences", report.file, report.calls)?,
        }
    }
    if all {
        let kinds: Vec<String> = by_kind(reports).into_iter().map(|(k, n)| format!("{k}={n}")).collect();
        writeln!(out, "by kind: {}", kinds.join(", "))?;
    }
    Ok(())
}

/// The `--json` report, keys in the documented order.
pub fn json_report(reports: &[TraceReport], all: bool) -> String {
    let mut out = String::from("{\"traces\":[");
    for (i, report) in reports.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"file\":");
        write_str(&mut out, &report.file);
        out.push_str(&format!(",\"calls\":{},\"divergences\":[", report.calls));
        for (j, d) in report.divergences.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str(&format!("{{\"line\":{},\"seq\":{},\"call\":", d.line, d.seq));
            write_str(&mut out, &d.call);
            out.push_str(&format!(",\"args\":{},\"recorded\":{},\"replayed\":{}}}", d.args, d.recorded, d.replayed));
        }
        out.push_str("]}");
    }
    let identical = reports.iter().all(|r| r.divergences.is_empty());
    out.push_str(&format!("],\"identical\":{identical}"));
    if all {
        out.push_str(",\"by-kind\":{");
        for (i, (kind, n)) in by_kind(reports).into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_str(&mut out, &kind);
            out.push_str(&format!(":{n}"));
        }
        out.push('}');
    }
    out.push('}');
    out
}
