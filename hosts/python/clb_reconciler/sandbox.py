"""The sandbox the guest runs in: one wasmtime engine and its epoch ticker per process, one
compiled component per version of the logic, one store and instance (a :class:`Session`) per
tracker, pool queue, or run of pure calls.

Every call runs under the limits of ``clb-host`` (``crates/sandbox/src/lib.rs``, ``impl Default for
Limits``): a fuel budget of 20,000,000,000, a wall-clock deadline of 10 s (epoch interruption,
the epoch advanced every 5 ms by a background thread) and a cap of 512 MiB of linear memory
(``Store.set_limits``). The guest is granted nothing but ``clb:reconciler/diagnostics`` (logged
through :mod:`logging`, logger ``clb_guest``); a component that imports anything else is refused
at load, and so is one whose functions' types differ from the schema.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import wasmtime
import wasmtime.component as wc

from . import _fast
from .codec import Function, Schema, SchemaError, dumps, load_schema

# Cached type introspection and bulk list<u8> in wasmtime-py's conversions (see _fast);
# CLB_NO_FAST=1 leaves wasmtime-py as it is.
if not os.environ.get("CLB_NO_FAST"):
    _fast.install()

__all__ = [
    "Limits",
    "LoadError",
    "GuestTrap",
    "LoadedComponent",
    "Session",
    "DEFAULT_FUEL",
    "DEFAULT_DEADLINE_MS",
    "DEFAULT_MEMORY_MIB",
    "EPOCH_TICK_S",
]

log = logging.getLogger("clb_reconciler")
guest_log = logging.getLogger("clb_guest")

#: Defaults of ``clb-host`` (``impl Default for Limits`` in crates/sandbox/src/lib.rs).
DEFAULT_FUEL = 20_000_000_000
DEFAULT_DEADLINE_MS = 10_000
DEFAULT_MEMORY_MIB = 512
#: How often the epoch advances; deadlines are rounded up to it (as ``EPOCH_TICK`` in Rust).
EPOCH_TICK_S = 0.005

#: The package this host speaks, and the interfaces a component may import / must export.
PACKAGE = "clb:reconciler"
PACKAGE_VERSION = (0, 14, 0)
GRANTED_INTERFACES = ("diagnostics", "types")
REQUIRED_EXPORTS = ("validation", "reconciler", "backend-pools")


@dataclass(frozen=True)
class Limits:
    """Bounds on every call into the guest."""

    #: Fuel (roughly, wasm instructions) one call may use.
    fuel: int = DEFAULT_FUEL
    #: Wall-clock time one call may take, in milliseconds.
    deadline_ms: int = DEFAULT_DEADLINE_MS
    #: The most linear memory an instance may hold, in MiB.
    memory_mib: int = DEFAULT_MEMORY_MIB

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib << 20

    @property
    def epoch_ticks(self) -> int:
        ticks = max(1, -(-self.deadline_ms * 1000 // int(EPOCH_TICK_S * 1_000_000)))
        # One tick more: the ticker may advance the epoch right after the deadline is set.
        return ticks + 1


class LoadError(Exception):
    """The component could not be loaded: unreadable, not a component, a forbidden import, a
    missing export, or types that differ from the schema."""


class GuestTrap(Exception):
    """A call into the guest trapped. The host survives it; the instance does not (every later
    call on it raises a ``GuestTrap`` of kind ``poisoned``).

    ``kind`` is ``fuel`` (the fuel budget ran out), ``deadline`` (the epoch deadline passed),
    ``panic`` (the guest reported a panic through ``diagnostics.panicked``; ``message`` is its
    text), ``trap`` (any other trap, including an allocation failure at the memory cap),
    ``poisoned`` or ``instantiate``.
    """

    def __init__(self, call: str, kind: str, message: str) -> None:
        super().__init__(f"`{call}` {_KIND_TEXT.get(kind, 'trapped')}: {message}")
        self.call = call
        self.kind = kind
        self.message = message


_KIND_TEXT = {
    "fuel": "used its whole fuel budget",
    "deadline": "ran past its deadline",
    "panic": "panicked",
    "trap": "trapped",
    "poisoned": "was refused",
    "instantiate": "failed to instantiate",
}


# ---------------------------------------------------------------------------------------------
# The runtime: one engine, one ticker thread.


class _Runtime:
    def __init__(self) -> None:
        config = wasmtime.Config()
        config.wasm_component_model = True
        config.consume_fuel = True
        config.epoch_interruption = True
        self.engine = wasmtime.Engine(config)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="clb-epoch", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _tick(self) -> None:
        engine = self.engine
        while not self._stop.wait(EPOCH_TICK_S):
            engine.increment_epoch()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=1)


_RUNTIME: Optional[_Runtime] = None
_RUNTIME_LOCK = threading.Lock()


def runtime() -> _Runtime:
    global _RUNTIME
    with _RUNTIME_LOCK:
        if _RUNTIME is None:
            _RUNTIME = _Runtime()
        return _RUNTIME


# The diagnostics callbacks learn which call they belong to from this thread-local.
_CURRENT = threading.local()


def _diag_log(_store: Any, level: str, message: str) -> None:
    py_level = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}.get(
        level, logging.INFO
    )
    guest_log.log(py_level, "%s", message)


def _diag_panicked(_store: Any, message: str) -> None:
    guest_log.error("guest panic: %s", message)
    _CURRENT.panic = message


# ---------------------------------------------------------------------------------------------
# Component names and versions

_NAME = re.compile(r"^([^/@]+)/([^/@]+)@(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$")


def _split_interface(name: str) -> Optional[Tuple[str, str, Tuple[int, int, int]]]:
    m = _NAME.match(name)
    if not m:
        return None
    return m.group(1), m.group(2), (int(m.group(3)), int(m.group(4)), int(m.group(5)))


def _compatible(version: Tuple[int, int, int], host: Tuple[int, int, int] = PACKAGE_VERSION) -> bool:
    """Semver compatibility (for 0.x, the same minor version), as ``clb-host``'s ``compatible``."""
    if host[0] == 0:
        return version[0] == 0 and version[1] == host[1]
    return version[0] == host[0]


def package_compatible(package: str, other: str) -> bool:
    """Whether two ``ns:pkg@x.y.z`` names are the same package at semver-compatible versions."""

    def split(p: str) -> Optional[Tuple[str, Tuple[int, int, int]]]:
        m = re.match(r"^([^@]+)@(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$", p)
        return (m.group(1), (int(m.group(2)), int(m.group(3)), int(m.group(4)))) if m else None

    a, b = split(package), split(other)
    return a is not None and b is not None and a[0] == b[0] and _compatible(a[1], b[1])


# ---------------------------------------------------------------------------------------------
# Comparing the component's types with the schema


def _wasm_type_spec(vt: Any) -> Any:
    """A wasmtime-py value type in the schema's notation (resources named ``*``)."""
    simple = {
        wc.Bool: "bool",
        wc.U8: "u8",
        wc.U16: "u16",
        wc.U32: "u32",
        wc.U64: "u64",
        wc.S8: "s8",
        wc.S16: "s16",
        wc.S32: "s32",
        wc.S64: "s64",
        wc.String: "string",
    }
    for cls, name in simple.items():
        if isinstance(vt, cls):
            return name
    if isinstance(vt, wc.ListType):
        return {"list": _wasm_type_spec(vt.element)}
    if isinstance(vt, wc.OptionType):
        return {"option": _wasm_type_spec(vt.payload)}
    if isinstance(vt, wc.TupleType):
        return {"tuple": [_wasm_type_spec(t) for t in vt.elements]}
    if isinstance(vt, wc.RecordType):
        return {"record": [{"name": n, "type": _wasm_type_spec(t)} for n, t in vt.fields]}
    if isinstance(vt, wc.VariantType):
        return {"variant": [{"name": n, "type": None if t is None else _wasm_type_spec(t)} for n, t in vt.cases]}
    if isinstance(vt, wc.EnumType):
        return {"enum": vt.names}
    if isinstance(vt, wc.ResultType):
        ok, err = vt.ok, vt.err
        return {"result": {"ok": None if ok is None else _wasm_type_spec(ok), "err": None if err is None else _wasm_type_spec(err)}}
    if isinstance(vt, wc.OwnType):
        return {"own": "*"}
    if isinstance(vt, wc.BorrowType):
        return {"borrow": "*"}
    return {"unsupported": type(vt).__name__}


def _erase_resources(spec: Any) -> Any:
    if isinstance(spec, dict):
        if len(spec) == 1 and next(iter(spec)) in ("own", "borrow"):
            return {next(iter(spec)): "*"}
        return {k: _erase_resources(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_erase_resources(v) for v in spec]
    return spec


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if type(a) is not type(b):
        return f"{path or 'type'}: schema {dumps(a)[:120]}, component {dumps(b)[:120]}"
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{path}.{k}: only in the {'component' if k in b else 'schema'}"
            d = _first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return ""
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: schema has {len(a)} entries, component {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return ""
    return "" if a == b else f"{path}: schema {dumps(a)}, component {dumps(b)}"


# ---------------------------------------------------------------------------------------------
# A loaded component


class LoadedComponent:
    """A compiled, checked component, ready to instantiate. Cheap to share between sessions."""

    def __init__(self, path: Optional[str], wasm: bytes, limits: Limits, schema: Schema) -> None:
        rt = runtime()
        self.engine = rt.engine
        self.path = path
        self.size = len(wasm)
        self.sha256 = hashlib.sha256(wasm).hexdigest()
        self.limits = limits
        self.schema = schema
        where = path or "<bytes>"
        try:
            self.component = wc.Component(self.engine, wasm)
        except wasmtime.WasmtimeError as e:
            raise LoadError(f"{where}: not a valid WebAssembly component: {e}") from None
        ctype = self.component.type
        imports = list(ctype.imports(self.engine).keys())
        exports = ctype.exports(self.engine)
        # The import allow-list.
        granted: Dict[str, str] = {}
        for name in imports:
            parts = _split_interface(name)
            if not (parts and parts[0] == PACKAGE and parts[1] in GRANTED_INTERFACES and _compatible(parts[2])):
                raise LoadError(
                    f"{where}: the component imports `{name}`, which this host does not grant "
                    f"(it grants only {PACKAGE}/{{{','.join(GRANTED_INTERFACES)}}}@0.14.x)"
                )
            granted[parts[1]] = name
        # The exports: each schema interface, at a compatible version.
        self.interface_names: Dict[str, str] = {}
        for iface in schema.interfaces + [f"{PACKAGE}/{e}@0.14.0" for e in REQUIRED_EXPORTS]:
            want = _split_interface(iface)
            if want is None:
                raise LoadError(f"{where}: the schema names the interface `{iface}`, which is not ns:pkg/iface@x.y.z")
            found = None
            for name in exports:
                got = _split_interface(name)
                if got and got[0] == want[0] and got[1] == want[1] and _compatible(got[2], want[2]):
                    found = name
                    break
            if found is None:
                raise LoadError(
                    f"{where}: the component does not export `{iface}` or a compatible version "
                    f"(its exports: {', '.join(exports) or 'none'})"
                )
            self.interface_names[iface] = found
        self.package = None
        for name in self.interface_names.values():
            got = _split_interface(name)
            if got:
                self.package = f"{got[0]}@{got[2][0]}.{got[2][1]}.{got[2][2]}"
                break
        # Every function of the schema, with the same types.
        self.export_index: Dict[str, Any] = {}
        for fn in schema.functions.values():
            iface_name = self.interface_names[fn.interface]
            iface_ty = exports[iface_name].ty
            items = iface_ty.exports(self.engine)
            if fn.export not in items:
                raise LoadError(f"{where}: `{iface_name}` does not export `{fn.export}` (the schema's `{fn.call}`)")
            fty = items[fn.export].ty
            if not isinstance(fty, wc.FuncType):
                raise LoadError(f"{where}: `{iface_name}#{fn.export}` is not a function")
            comp_spec = {
                "params": [{"name": n, "type": _wasm_type_spec(t)} for n, t in fty.params],
                "result": None if fty.result is None else _wasm_type_spec(fty.result),
            }
            schema_spec = _erase_resources({"params": fn.spec["params"], "result": fn.spec["result"]})
            diff = _first_difference(schema_spec, comp_spec)
            if diff:
                raise LoadError(f"{where}: `{fn.call}` differs from the schema ({schema.source}): {diff}")
            iface_idx = self.component.get_export_index(iface_name)
            fn_idx = self.component.get_export_index(fn.export, instance=iface_idx) if iface_idx else None
            if fn_idx is None:
                raise LoadError(f"{where}: cannot find the export `{iface_name}#{fn.export}`")
            self.export_index[fn.call] = fn_idx
        # The linker: diagnostics as logging, types as an empty instance.
        self.linker = wc.Linker(self.engine)
        with self.linker.root() as root:
            for iface, name in granted.items():
                with root.add_instance(name) as inst:
                    if iface == "diagnostics":
                        inst.add_func("log", _diag_log)
                        inst.add_func("panicked", _diag_panicked)

    def session(self) -> "Session":
        """A fresh instance in its own store."""
        return Session(self)


def load_component(
    path: "str | Path",
    limits: Optional[Limits] = None,
    schema: Optional[Schema] = None,
) -> LoadedComponent:
    try:
        wasm = Path(path).read_bytes()
    except OSError as e:
        raise LoadError(f"{path}: cannot read the component: {e.strerror or e}") from None
    try:
        schema = schema or load_schema()
    except SchemaError as e:
        raise LoadError(str(e)) from None
    return LoadedComponent(str(path), wasm, limits or Limits(), schema)


# ---------------------------------------------------------------------------------------------
# Sessions


def _classify(err: BaseException, panic: Optional[str]) -> Tuple[str, str]:
    full = str(err)
    # wasmtime's text is "error while executing at wasm backtrace: … Caused by: wasm trap: …";
    # the cause is the last line.
    lines = [line.strip() for line in full.splitlines() if line.strip()]
    text = lines[-1] if lines else full
    if "all fuel consumed" in full or "out of fuel" in full.lower():
        return "fuel", text
    if "wasm trap: interrupt" in full:
        return "deadline", text
    if panic is not None:
        return "panic", panic
    return "trap", text


class Session:
    """A store and one instance of the component: one tracker, one pool queue, or the pure
    functions. Any trap poisons it."""

    def __init__(self, component: LoadedComponent) -> None:
        self.component = component
        self.limits = component.limits
        self.store = wasmtime.Store(component.engine)
        self.store.set_limits(memory_size=self.limits.memory_bytes)
        self.poisoned = False
        self._funcs: Dict[str, Any] = {}
        self._set_budget()
        _CURRENT.panic = None
        try:
            self.instance = component.linker.instantiate(self.store, component.component)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
            self.poisoned = True
            kind, message = _classify(e, getattr(_CURRENT, "panic", None))
            raise GuestTrap("instantiate", "instantiate" if kind == "trap" else kind, message) from None

    def _set_budget(self) -> None:
        self.store.set_fuel(self.limits.fuel)
        self.store.set_epoch_deadline(self.limits.epoch_ticks)

    def func(self, call: str) -> Any:
        f = self._funcs.get(call)
        if f is None:
            f = self.instance.get_func(self.store, self.component.export_index[call])
            if f is None:
                raise LoadError(f"the instance has no function for `{call}`")
            self._funcs[call] = f
        return f

    def call_wasm(self, fn: Function, lowered: Sequence[Any]) -> Any:
        """Calls ``fn`` with wasm-shaped arguments; returns the wasm-shaped result."""
        if self.poisoned:
            raise GuestTrap(fn.call, "poisoned", "an earlier call trapped and left this instance unusable")
        f = self.func(fn.call)
        self._set_budget()
        _CURRENT.panic = None
        try:
            result = f(self.store, *lowered)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
            self.poisoned = True
            kind, message = _classify(e, getattr(_CURRENT, "panic", None))
            raise GuestTrap(fn.call, kind, message) from None
        return result

    def call(self, fn: Function, args: Sequence[Any]) -> Any:
        """Calls ``fn`` with API-shaped arguments (resources as ``ResourceAny``); returns the
        API-shaped result (resources as ``ResourceAny``)."""
        lowered = [p.type.lower(a) for p, a in zip(fn.params, args)]
        w = self.call_wasm(fn, lowered)
        return None if fn.result is None else fn.result.lift(w)

    def fuel_left(self) -> int:
        return self.store.get_fuel()
