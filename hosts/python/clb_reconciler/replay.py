"""``replay``: makes every call of a trace on a component and compares each result's canonical
text with the recorded one (docs/traces.md, "Replay and the shadow check").

Exit codes: 0 every result is identical, 1 a result differs, 2 a trace cannot be read or
replayed (``error: FILE:LINE: why`` on stderr, nothing on stdout).

Where docs/traces.md leaves a choice open, this follows ``clb-host replay``
(``crates/sandbox/src/trace/replay.rs``) so that the two give the same bytes and exit codes:

* the recorded side is the line's own text (its ``result`` as written, or ``{"trap":…}``);
  the replayed side is the canonical text; they are compared as text;
* handles are the numbers the recorded results give (``N`` or ``{"tag":"ok","val":N}``); a
  resource the replayed logic returns where the recorded result names none is written as
  18446744073709551615;
* a ``rebuild`` (or a ``rollback``, or the rebuild after a trap only the replayed logic had)
  whose lineage does not re-run is a trace that cannot be replayed (exit 2), as is a ``swap``
  whose ``export-state`` traps, and a call on a handle the replayed logic never made;
* ``rollback`` lines are not compared;
* the last line of a trace must end with a newline (else it is truncated: exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from json.decoder import scanstring
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .codec import DecodeError, Function, Record, SchemaError, String, Type, dumps
from .host import Component
from .sandbox import GuestTrap, LoadError, Session

EXIT_IDENTICAL = 0
EXIT_DIVERGED = 1
EXIT_UNREADABLE = 2

#: Readers refuse a line over 64 MiB (not counting its newline).
MAX_LINE_BYTES = 64 << 20
#: Rounds of extra ``tracker.complete`` for commands only the replayed logic issued.
MAX_EXTRA_ROUNDS = 8
#: The commands those extra calls answer with ``ok``; others stay unanswered.
OK_ANSWERED = frozenset(
    {
        "emit-event",
        "update-services",
        "update-address-locations",
        "put-load-balancer",
        "put-nat-gateway",
        "delete-resource",
        "patch-service-status",
        "set-finalizer",
    }
)
#: Calls whose result is a ``step``, whose commands are aligned.
STEP_CALLS = ("tracker.observe", "tracker.complete", "tracker.tick")
#: How a resource is written when the recorded result names no handle for it.
NO_HANDLE = (1 << 64) - 1

_STRING = String()
_WS = re.compile(r"[ \t\n\r]*")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


class TraceError(Exception):
    """The trace cannot be read or replayed at ``line`` (1-based; 0 when no line is involved)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Problem(Exception):
    """A reason the current line cannot be replayed (becomes a TraceError at its line)."""


def _trap_text(text: str) -> str:
    return '{"trap":' + dumps(text) + "}"


class Divergence:
    __slots__ = ("line", "seq", "call", "args", "recorded", "replayed", "kinds")

    def __init__(self, seq: int, call: str, args: str, recorded: str, replayed: str, kinds: List[str]) -> None:
        self.line = 0
        self.seq = seq
        self.call = call
        #: The arguments as recorded (their text in the trace).
        self.args = args
        #: The recorded result's text, or ``{"trap":…}``.
        self.recorded = recorded
        #: The replayed result's canonical text (ids aligned), or ``{"trap":…}``.
        self.replayed = replayed
        #: What it counts under in the summary by kind.
        self.kinds = kinds


class TraceReport:
    def __init__(self, file: str) -> None:
        self.file = file
        self.calls = 0
        self.divergences: List[Divergence] = []


class _Made:
    """One call of a lineage, as this replay made it (``params`` without ``self``)."""

    __slots__ = ("fn", "params")

    def __init__(self, fn: Function, params: List[Any]) -> None:
        self.fn = fn
        self.params = params


class _Held:
    """A handle's resource, the instance it lives in, and how to make it again."""

    def __init__(
        self,
        component: Component,
        session: Session,
        resource: Any,
        lineage: List[_Made],
        before_swap: Optional[Tuple[Component, List[_Made]]] = None,
        ids: Optional[Dict[int, int]] = None,
        missing: Optional[set] = None,
    ) -> None:
        self.component = component
        self.session = session
        self.resource = resource
        #: The call that made the resource (no ``self``), then every call on it since that did
        #: not trap, as this replay made them (aligned ids, extra completes included).
        self.lineage = lineage
        #: Before a ``swap``: the component and lineage a ``rollback`` returns to.
        self.before_swap = before_swap
        #: Recorded command id -> the id the replayed logic gave the same command.
        self.ids: Dict[int, int] = ids if ids is not None else {}
        #: Recorded command ids the replayed logic did not issue: their outcomes are not sent.
        self.missing: set = missing if missing is not None else set()


# ---------------------------------------------------------------------------------------------
# Reading


def _read_lines(path: str) -> Iterator[Tuple[int, bytes]]:
    """(line number, bytes without the newline) of each line; never holds more than 64 MiB +
    1 byte of one line. A last line without its newline is a truncated trace."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TraceError(0, f"cannot read: {e.strerror or e}") from None
    with f:
        lineno = 0
        while True:
            lineno += 1
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                raise TraceError(lineno, f"cannot read: {e.strerror or e}") from None
            if not raw:
                return
            if raw.endswith(b"\n"):
                yield lineno, raw[:-1]
                continue
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(lineno, f"a line over {MAX_LINE_BYTES} bytes")
            raise TraceError(lineno, "the last line has no newline: the trace is truncated")


def _text(lineno: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(lineno, f"not UTF-8: {e}") from None


def _scan_object(text: str) -> Dict[str, Tuple[Any, str]]:
    """A JSON object's members: key -> (value, the value's text). Raises ValueError."""
    idx = _WS.match(text, 0).end()
    if text[idx : idx + 1] != "{":
        raise ValueError("expected an object")
    idx = _WS.match(text, idx + 1).end()
    out: Dict[str, Tuple[Any, str]] = {}
    if text[idx : idx + 1] == "}":
        end = idx + 1
    else:
        while True:
            if text[idx : idx + 1] != '"':
                raise ValueError(f"expected a key at column {idx + 1}")
            key, idx = scanstring(text, idx + 1)
            idx = _WS.match(text, idx).end()
            if text[idx : idx + 1] != ":":
                raise ValueError(f"expected `:` at column {idx + 1}")
            idx = _WS.match(text, idx + 1).end()
            try:
                value, end = _DECODER.raw_decode(text, idx)
            except json.JSONDecodeError as e:
                raise ValueError(str(e)) from None
            if key in out:
                raise ValueError(f"duplicate field `{key}`")
            out[key] = (value, text[idx:end])
            idx = _WS.match(text, end).end()
            c = text[idx : idx + 1]
            if c == ",":
                idx = _WS.match(text, idx + 1).end()
                continue
            if c == "}":
                end = idx + 1
                break
            raise ValueError(f"expected `,` or `}}` at column {idx + 1}")
    if _WS.match(text, end).end() != len(text):
        raise ValueError(f"trailing characters at column {end + 1}")
    return out


class _Line:
    """One call line: ``seq``, ``call``, ``args`` (value and text), ``result`` (value and text,
    absent is null) or ``trap``."""

    __slots__ = ("seq", "call", "args", "args_text", "result", "result_text", "trap")

    def __init__(self, text: str) -> None:
        try:
            members = _scan_object(text)
        except ValueError as e:
            raise _Problem(f"not a trace line: {e}") from None
        unknown = [k for k in members if k not in ("seq", "call", "args", "result", "trap")]
        if unknown:
            raise _Problem(f"not a trace line: unknown field `{unknown[0]}`")
        for key in ("seq", "call", "args"):
            if key not in members:
                raise _Problem(f"not a trace line: missing field `{key}`")
        seq = members["seq"][0]
        if type(seq) is not int or not 0 <= seq < 1 << 64:
            raise _Problem("not a trace line: `seq` is not a number from 0")
        call = members["call"][0]
        if type(call) is not str:
            raise _Problem("not a trace line: `call` is not a string")
        self.seq: int = seq
        self.call: str = call
        self.args, self.args_text = members["args"]
        self.result, self.result_text = members.get("result", (None, "null"))
        trap = members.get("trap", (None, "null"))[0]
        if trap is not None and type(trap) is not str:
            raise _Problem("not a trace line: `trap` is not a string")
        self.trap: Optional[str] = trap

    def recorded(self) -> str:
        return _trap_text(self.trap) if self.trap is not None else self.result_text

    def recorded_handle(self) -> Optional[int]:
        """The handle a recorded result names (``N``, or ``{"tag":"ok","val":N}``)."""
        r = self.result

        def u64(v: Any) -> Optional[int]:
            return v if type(v) is int and 0 <= v < 1 << 64 else None

        if u64(r) is not None:
            return r
        if isinstance(r, dict) and r.get("tag") == "ok":
            return u64(r.get("val"))
        return None


def _self_handle(args: Any) -> int:
    h = args.get("self") if isinstance(args, dict) else None
    if type(h) is not int or not 0 <= h < 1 << 64:
        raise _Problem('argument "self" (a handle) missing')
    return h


def _resource_in(fn: Function, value: Any) -> Any:
    """The resource a constructor returned (``own`` or ``ok(own)``), or None."""
    if fn.result is None:
        return None
    found: List[Any] = []
    fn.result.map_resources(value, lambda v, t: found.append(v) or v)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# Replaying


class _Got:
    """How a replayed call ended: returned ``value``, or trapped with ``trap``."""

    __slots__ = ("value", "trap")

    def __init__(self, value: Any = None, trap: Optional[str] = None) -> None:
        self.value = value
        self.trap = trap


def _invoke(session: Session, fn: Function, params: Sequence[Any]) -> _Got:
    try:
        return _Got(session.call(fn, params))
    except GuestTrap as e:
        return _Got(trap=str(e))
    except DecodeError as e:
        raise _Problem(f"{fn.call}: an argument does not fit its type: {e}") from None


def _build(component: Component, lineage: List[_Made]) -> Tuple[Session, Any]:
    """A fresh instance of ``component`` holding the state ``lineage`` builds."""
    session = _session(component)
    if not lineage:
        raise _Problem("an empty lineage")
    root, rest = lineage[0], lineage[1:]
    got = _invoke(session, root.fn, root.params)
    if got.trap is not None:
        raise _Problem(f"rebuilding: {root.fn.call} trapped: {got.trap}")
    resource = _resource_in(root.fn, got.value)
    if resource is None:
        raise _Problem(f"rebuilding: {root.fn.call} made no resource")
    for made in rest:
        got = _invoke(session, made.fn, [resource, *made.params])
        if got.trap is not None:
            raise _Problem(f"rebuilding: {made.fn.call} trapped on a call it took before: {got.trap}")
    return session, resource


def _session(component: Component) -> Session:
    try:
        return component.loaded.session()
    except GuestTrap as e:
        raise _Problem(f"instantiating: {e}") from None


class Replayer:
    """Replays the lines of one trace."""

    def __init__(self, primary: Component, named: Dict[str, Component]) -> None:
        self.primary = primary
        self.named = named
        self.schema = primary.schema
        self.held: Dict[int, _Held] = {}
        #: Pure functions run here; remade after a trap.
        self.pure: Optional[Session] = None
        step = self.schema.get("tracker.tick")
        self.command_type: Optional[Type] = None
        if step is not None and isinstance(step.result, Record) and "commands" in step.result.by_name:
            self.command_type = step.result.field("commands").elem.field("command")  # type: ignore[attr-defined]

    # -- lines --------------------------------------------------------------------------------

    def line(self, line: _Line) -> Optional[Divergence]:
        if not isinstance(line.args, dict):
            raise _Problem("args: not an object")
        if line.call == "rebuild":
            self._rebuild(_self_handle(line.args))
            return None
        if line.call == "swap":
            return self._swap(line)
        if line.call == "rollback":
            return self._rollback(line)
        return self._call(line)

    def _encode(self, got: _Got, fn: Function, handle: Optional[int]) -> str:
        if got.trap is not None:
            return _trap_text(got.trap)
        if fn.result is None:
            return "null"
        number = NO_HANDLE if handle is None else handle
        value = fn.result.map_resources(got.value, lambda _v, _t: number)
        return dumps(fn.result.to_json(value))

    def _verdict(self, line: _Line, got: _Got, recorded: str, replayed: str) -> Optional[Divergence]:
        trapped = got.trap is not None
        if (trapped and line.trap is not None) or recorded == replayed:
            return None
        kind = "trap" if trapped != (line.trap is not None) else line.call
        return Divergence(line.seq, line.call, line.args_text, recorded, replayed, [kind])

    def _call(self, line: _Line) -> Optional[Divergence]:
        fn = self.schema.get(line.call)
        if fn is None:
            raise _Problem(f"unknown call {dumps(line.call)}")
        args = line.args
        unknown = [k for k in args if k not in fn.param_names]
        if unknown:
            raise _Problem(f"unknown argument {dumps(unknown[0])} of {fn.call}")
        method = fn.method_of is not None
        target = _self_handle(args) if method else None
        params: List[Any] = []
        for p in fn.params[1 if method else 0 :]:
            if p.name not in args:
                raise _Problem(f"argument {dumps(p.name)} missing")
            try:
                params.append(p.type.from_json(args[p.name]))
            except DecodeError as e:
                raise _Problem(f"{p.name}: {e}") from None
        recorded = line.recorded()
        recorded_handle = line.recorded_handle()

        if target is None:
            # A pure function, or a resource's first call (in an instance of its own).
            root = fn.export.startswith("[static]") or fn.export.startswith("[constructor]")
            if root:
                session = _session(self.primary)
            else:
                if self.pure is None:
                    self.pure = _session(self.primary)
                session = self.pure
            got = _invoke(session, fn, params)
            replayed = self._encode(got, fn, recorded_handle)
            if got.trap is None and root and recorded_handle is not None:
                resource = _resource_in(fn, got.value)
                if resource is not None:
                    self.held[recorded_handle] = _Held(self.primary, session, resource, [_Made(fn, params)])
            elif got.trap is not None and not root:
                self.pure = None
            return self._verdict(line, got, recorded, replayed)

        held = self.held.get(target)
        if held is None:
            raise _Problem(f"handle {target} does not exist in this replay")
        if fn.call == "tracker.complete":
            params[1] = self._map_outcome_ids(held, params[1])
        got = _invoke(held.session, fn, [held.resource, *params])
        if got.trap is None:
            held.lineage.append(_Made(fn, params))
        kinds: Optional[List[str]] = None
        if got.trap is None and fn.call in STEP_CALLS and line.trap is None and self.command_type is not None:
            replayed, kinds, extra = self._align(held, fn, got.value, line)
            self._answer_extra(target, params[0], extra)
        else:
            replayed = self._encode(got, fn, recorded_handle)
        if got.trap is not None and line.trap is None:
            # The recording host's logic did not trap here: go on from the state before.
            self._rebuild(target)
        d = self._verdict(line, got, recorded, replayed)
        if d is not None and kinds is not None and d.kinds != ["trap"]:
            d.kinds = kinds
        return d

    def _map_outcome_ids(self, held: _Held, results: List[Any]) -> List[Any]:
        """Recorded ids turned into the replayed logic's; outcomes of commands it never issued
        left out."""
        out = []
        for r in results:
            rid = r[0]
            if rid in held.missing:
                continue
            mapped = held.ids.get(rid)
            out.append([mapped, r[1]] if mapped is not None else r)
        return out

    def _align(self, held: _Held, fn: Function, replayed: Any, line: _Line) -> Tuple[str, List[str], List[int]]:
        """The replayed step's canonical text with its matched ids replaced by the recorded
        ones, the summary keys of a difference, and the ids of the commands only the replayed
        logic issued that ``ok`` answers."""
        assert fn.result is not None and self.command_type is not None
        try:
            recorded_step = fn.result.from_json(line.result)
        except DecodeError as e:
            raise _Problem(f"recorded result: {e}") from None
        ct = self.command_type
        ours = [(c["id"], ct.encode(c["command"]), c["command"]["tag"]) for c in replayed["commands"]]
        first_unused: Dict[str, List[int]] = {}
        for j, (_, text, _) in enumerate(ours):
            first_unused.setdefault(text, []).append(j)
        used = [False] * len(ours)
        to_recorded: Dict[int, int] = {}
        unmatched: List[str] = []
        for c in recorded_step["commands"]:
            text = ct.encode(c["command"])
            queue = first_unused.get(text)
            if queue:
                j = queue.pop(0)
                used[j] = True
                to_recorded[ours[j][0]] = c["id"]
                held.ids[c["id"]] = ours[j][0]
            else:
                held.missing.add(c["id"])
                unmatched.append(c["command"]["tag"])
        extra = [ours[j] for j in range(len(ours)) if not used[j]]
        unmatched.extend(tag for _, _, tag in extra)
        normalized = dict(replayed)
        normalized["commands"] = [
            {"id": to_recorded.get(c["id"], c["id"]), "command": c["command"]} for c in replayed["commands"]
        ]
        text = dumps(fn.result.to_json(normalized))
        kinds = list(dict.fromkeys(unmatched)) or ["step"]
        return text, kinds, [i for i, _, tag in extra if tag in OK_ANSWERED]

    def _answer_extra(self, handle: int, now: int, ids: List[int]) -> None:
        """Answers with ``ok`` the commands only the replayed logic issued, and what those
        answers make it issue, for at most 8 rounds; nothing of it is compared."""
        complete = self.schema["tracker.complete"]
        for _ in range(MAX_EXTRA_ROUNDS):
            if not ids:
                return
            held = self.held[handle]
            params = [now, [[i, {"tag": "ok"}] for i in ids], None]
            got = _invoke(held.session, complete, [held.resource, *params])
            if got.trap is not None:
                self._rebuild(handle)
                return
            held.lineage.append(_Made(complete, params))
            ids = [c["id"] for c in got.value["commands"] if c["command"]["tag"] in OK_ANSWERED]

    def _rebuild(self, handle: int) -> None:
        held = self.held.get(handle)
        if held is None:
            raise _Problem(f"rebuild of handle {handle}, which does not exist")
        held.session, held.resource = _build(held.component, held.lineage)

    def _swap(self, line: _Line) -> Optional[Divergence]:
        handle = _self_handle(line.args)
        target = line.args.get("component")
        name = target.get("name") if isinstance(target, dict) else None
        if type(name) is not str:
            raise _Problem("swap: component.name missing")
        component = self.named.get(name, self.primary)
        held = self.held.get(handle)
        if held is None:
            raise _Problem(f"swap of handle {handle}, which does not exist")
        export = self.schema.get("tracker.export-state")
        imp = self.schema.get("tracker.import-state")
        if export is None or imp is None:
            raise _Problem("the component lacks tracker.export-state / tracker.import-state")
        got = _invoke(held.session, export, [held.resource])
        if got.trap is not None:
            raise _Problem(f"swap: the replayed logic trapped on export-state: {got.trap}")
        state = got.value
        root = held.lineage[0] if held.lineage else None
        if root is None or not root.params:
            raise _Problem("swap: no config")
        config = root.params[0]
        session = _session(component)
        params = [config, state]
        got = _invoke(session, imp, params)
        recorded = line.recorded()
        new_handle = line.recorded_handle()
        replayed = self._encode(got, imp, new_handle)
        if got.trap is None and new_handle is not None:
            resource = _resource_in(imp, got.value)
            if resource is not None:
                before = self.held.pop(handle)
                self.held[new_handle] = _Held(
                    component,
                    session,
                    resource,
                    [_Made(imp, params)],
                    before_swap=(before.component, before.lineage),
                    ids=before.ids,
                    missing=before.missing,
                )
        return self._verdict(line, got, recorded, replayed)

    def _rollback(self, line: _Line) -> Optional[Divergence]:
        handle = _self_handle(line.args)
        new_handle = line.result if line.trap is None else None
        if type(new_handle) is not int or not 0 <= new_handle < 1 << 64 or not line.result_text.isdigit():
            raise _Problem("rollback: the result must be a handle")
        held = self.held.pop(handle, None)
        if held is None:
            raise _Problem(f"rollback of handle {handle}, which does not exist")
        if held.before_swap is None:
            raise _Problem("rollback of a handle that no swap made")
        component, lineage = held.before_swap
        lineage = list(lineage) + held.lineage[1:]
        session, resource = _build(component, lineage)
        self.held[new_handle] = _Held(component, session, resource, lineage, None, held.ids, held.missing)
        return None


def replay_file(path: str, primary: Component, named: Dict[str, Component], all_divergences: bool) -> TraceReport:
    """Replays the trace at ``path``; ``all_divergences`` goes on past the first divergence.
    Raises :class:`TraceError`."""
    report = TraceReport(path)
    lines = _read_lines(path)
    first = next(lines, None)
    if first is None:
        raise TraceError(1, "empty: no header")
    try:
        header = json.loads(_text(1, first[1]), parse_constant=_no_constant)
    except ValueError as e:
        raise TraceError(1, f"not a trace header: {e}") from None
    fmt = header.get("format") if isinstance(header, dict) else None
    version = header.get("version") if isinstance(header, dict) else None
    if type(fmt) is not str or type(version) is not int or not 0 <= version < 1 << 32:
        raise TraceError(1, "not a trace header: `format` (a string) and `version` (a number) are required")
    if fmt != "clb-trace" or version != 1:
        raise TraceError(1, f"format {dumps(fmt)} version {version}; this host reads clb-trace version 1")
    replayer = Replayer(primary, named)
    for lineno, raw in lines:
        try:
            line = _Line(_text(lineno, raw))
            del raw
            if line.seq != report.calls:
                raise _Problem(f"seq {line.seq} where {report.calls} was due")
            report.calls += 1
            divergence = replayer.line(line)
        except _Problem as e:
            raise TraceError(lineno, str(e)) from None
        if divergence is not None:
            divergence.line = lineno
            report.divergences.append(divergence)
            if not all_divergences:
                break
    return report


# ---------------------------------------------------------------------------------------------
# Reports


def by_kind(reports: Sequence[TraceReport]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for r in reports:
        for d in r.divergences:
            for k in d.kinds:
                counts[k] = counts.get(k, 0) + 1
    return {k: counts[k] for k in sorted(counts, key=lambda s: s.encode("utf-8"))}


def text_report(reports: Sequence[TraceReport], all_divergences: bool) -> str:
    out: List[str] = []
    for r in reports:
        for d in r.divergences:
            out.append(f"{r.file}:{d.line}: seq {d.seq}: {d.call} differs\n")
            out.append(f"  args: {d.args}\n")
            out.append(f"  recorded: {d.recorded}\n")
            out.append(f"  replayed: {d.replayed}\n")
        if r.divergences:
            out.append(f"{r.file}: {r.calls} calls, {len(r.divergences)} divergences\n")
        else:
            out.append(f"{r.file}: {r.calls} calls, identical\n")
    if all_divergences:
        out.append("by kind: " + ", ".join(f"{k}={n}" for k, n in by_kind(reports).items()) + "\n")
    return "".join(out)


def json_report(reports: Sequence[TraceReport], all_divergences: bool) -> str:
    """One JSON object, keys in the documented order; ``args`` and ``recorded`` are the texts
    of the trace, ``replayed`` the canonical text."""
    parts = ['{"traces":[']
    for i, r in enumerate(reports):
        if i:
            parts.append(",")
        parts.append(f'{{"file":{dumps(r.file)},"calls":{r.calls},"divergences":[')
        for j, d in enumerate(r.divergences):
            if j:
                parts.append(",")
            parts.append(
                f'{{"line":{d.line},"seq":{d.seq},"call":{dumps(d.call)},'
                f'"args":{d.args},"recorded":{d.recorded},"replayed":{d.replayed}}}'
            )
        parts.append("]}")
    identical = all(not r.divergences for r in reports)
    parts.append(f'],"identical":{"true" if identical else "false"}')
    if all_divergences:
        parts.append(',"by-kind":{' + ",".join(f"{dumps(k)}:{n}" for k, n in by_kind(reports).items()) + "}")
    parts.append("}")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# The command


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m clb_reconciler replay",
        description="Replays traces (docs/traces.md) through a component and compares every result. "
        "Exits 0 when every result is identical, 1 when one differs, 2 when a trace cannot be read or replayed.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE")
    p.add_argument("--component", metavar="FILE", help="the component to replay (required: this host has no built-in one)")
    p.add_argument(
        "--swap-component", action="append", default=[], metavar="NAME=FILE",
        help="what a `swap` line to component NAME replays into (default: the replayed component)",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--all-divergences", action="store_true", help="go on past the first divergence and summarise them by kind")
    return p


def _err(message: str) -> None:
    sys.stderr.buffer.write((message + "\n").encode("utf-8"))
    sys.stderr.flush()


def main(argv: Optional[Sequence[str]] = None) -> int:
    opts = _parser().parse_args(argv)
    if not opts.component:
        _err("error: --component FILE is required (the Python host has no built-in component)")
        return EXIT_UNREADABLE
    try:
        primary = Component.load(opts.component)
    except (LoadError, SchemaError) as e:
        _err(f"error: {e}")
        return EXIT_UNREADABLE
    named: Dict[str, Component] = {}
    loaded: Dict[str, Component] = {os.path.realpath(opts.component): primary}
    for pair in opts.swap_component:
        name, sep, file = pair.partition("=")
        if not sep:
            _err(f"error: --swap-component {dumps(pair)}: expected NAME=FILE")
            return EXIT_UNREADABLE
        key = os.path.realpath(file)
        try:
            named[name] = loaded[key] if key in loaded else Component.load(file)
        except (LoadError, SchemaError) as e:
            _err(f"error: {e}")
            return EXIT_UNREADABLE
        loaded[key] = named[name]
    reports: List[TraceReport] = []
    for path in opts.traces:
        try:
            reports.append(replay_file(path, primary, named, opts.all_divergences))
        except TraceError as e:
            _err(f"error: {path}:{e.line}: {e.message}")
            return EXIT_UNREADABLE
    if opts.json:
        text = json_report(reports, opts.all_divergences) + "\n"
    else:
        text = text_report(reports, opts.all_divergences)
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()
    return EXIT_IDENTICAL if all(not r.divergences for r in reports) else EXIT_DIVERGED
