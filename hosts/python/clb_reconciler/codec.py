"""The canonical JSON encoding of WIT values (docs/traces.md, "Values"), driven by the schema.

Three shapes of one value, each with its own direction of conversion:

* **JSON** (``jsonable``): what ``json.loads`` gives for the canonical text. ``u64``/``s64`` are
  decimal strings, ``list<u8>`` is a base64 string, handles are numbers.
* **API** (the Python host's plain data): the JSON shape, except that ``u64``/``s64`` are ``int``
  and ``list<u8>`` is ``bytes``. Records are ``dict`` with every field, kebab-case, in WIT order;
  variants and results are ``{"tag": case}`` or ``{"tag": case, "val": payload}``; enums are the
  case name; options are ``None`` or the payload; tuples are lists; resources are whatever the
  caller put there (the replayer puts handle numbers, wasmtime gives ``ResourceAny``).
* **wasm**: what wasmtime-py's component conversions take and give (``Record`` objects with
  kebab-case attributes, ``Variant`` only where wasmtime-py tags a variant, bare payloads where it
  does not, tuples as ``tuple``, ``list<u8>`` as ``bytes``).

``Type.from_json`` is strict: a missing or unknown record field, an unknown case, a number out of
range, a ``u64`` that is not a plain decimal string, bad base64 are a :class:`DecodeError`, never
a default. ``Type.lower`` checks API values just as strictly (wasmtime-py would silently wrap an
out-of-range integer).

The schema (``hosts/schema/clb-reconciler.json``) is found, in this order: the file named by the
environment variable ``CLB_SCHEMA``; the copy the package build put inside the installed package
(``clb_reconciler/schema.json``, copied from ``hosts/schema/`` by ``setup.py`` at build time, never
kept in the source tree); ``../schema/clb-reconciler.json`` next to the source tree, for a run
from a checkout without installing.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from wasmtime.component import Record as WasmRecord
from wasmtime.component import ResourceAny, ResourceHost
from wasmtime.component import Variant as WasmVariant

__all__ = [
    "DecodeError",
    "SchemaError",
    "Type",
    "Function",
    "Schema",
    "dumps",
    "loads",
    "load_schema",
    "schema_path",
]


class DecodeError(ValueError):
    """A value that does not decode as its type says. ``path`` locates it (``batch[0].val.uid``)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def prepend(self, segment: str) -> "DecodeError":
        self.path = segment + self.path
        return self

    def __str__(self) -> str:
        where = self.path.lstrip(".")
        return f"{where}: {self.message}" if where else self.message


class SchemaError(ValueError):
    """The schema file is malformed, or describes something this host does not support."""


# ---------------------------------------------------------------------------------------------
# Canonical text


def dumps(value: Any) -> str:
    """The canonical text of a JSON-shaped value: no whitespace, keys in the dict's order,
    non-ASCII as itself, control characters as ``\\n``… or ``\\u00xx``."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False)


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {json.dumps(k, ensure_ascii=False)}")
            seen.add(k)
    return d


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str) -> Any:
    """Strict JSON: no duplicate keys, no ``NaN``/``Infinity``. Raises ``ValueError``."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


# ---------------------------------------------------------------------------------------------
# Types

_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_SIGNED_DECIMAL = re.compile(r"0|-?[1-9][0-9]*")
_RESOURCE_CLASSES = frozenset({ResourceAny, ResourceHost})


def _type_name(j: Any) -> str:
    if j is None:
        return "null"
    if isinstance(j, bool):
        return "a boolean"
    if isinstance(j, int):
        return "a number"
    if isinstance(j, float):
        return "a fractional number"
    if isinstance(j, str):
        return "a string"
    if isinstance(j, list):
        return "an array"
    if isinstance(j, dict):
        return "an object"
    return type(j).__name__


def _check_str(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise DecodeError("a string with a lone surrogate is not valid Unicode") from None


class Type:
    """One WIT type of the schema. ``spec`` is its JSON in the schema."""

    spec: Any
    #: wasmtime-py's ``add_classes``: the Python classes its conversion uses for this type.
    classes: frozenset
    #: True when a resource (``own``/``borrow``) occurs in the type.
    has_resource: bool = False

    def from_json(self, j: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_json(self, v: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def lower(self, v: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def lift(self, w: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def map_resources(self, v: Any, fn: Callable[[Any, "Type"], Any]) -> Any:
        """A copy of the API value ``v`` with every resource ``r`` replaced by ``fn(r, type)``."""
        return v

    # Convenience: text in and out.
    def encode(self, v: Any) -> str:
        """The canonical text of the API value ``v``."""
        return dumps(self.to_json(v))

    def decode(self, text: str) -> Any:
        """The API value of a JSON text (strict)."""
        try:
            j = loads(text)
        except ValueError as e:
            raise DecodeError(f"not JSON: {e}") from None
        return self.from_json(j)

    def __repr__(self) -> str:
        return f"Type({dumps(self.spec)})"


class Bool(Type):
    classes = frozenset({bool})

    def __init__(self) -> None:
        self.spec = "bool"

    def from_json(self, j: Any) -> Any:
        if type(j) is not bool:
            raise DecodeError(f"expected a boolean, found {_type_name(j)}")
        return j

    def to_json(self, v: Any) -> Any:
        return v

    def lower(self, v: Any) -> Any:
        if type(v) is not bool:
            raise DecodeError(f"expected a bool, found {type(v).__name__}")
        return v

    def lift(self, w: Any) -> Any:
        return w


class Int(Type):
    classes = frozenset({int})

    def __init__(self, name: str) -> None:
        self.spec = name
        bits = int(name[1:])
        if name[0] == "u":
            self.lo, self.hi = 0, (1 << bits) - 1
        else:
            self.lo, self.hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        self.as_string = bits == 64
        self.pattern = _DECIMAL if name[0] == "u" else _SIGNED_DECIMAL

    def from_json(self, j: Any) -> Any:
        if self.as_string:
            if type(j) is not str:
                raise DecodeError(f"expected a {self.spec} as a string of decimal digits, found {_type_name(j)}")
            if not self.pattern.fullmatch(j):
                raise DecodeError(f"expected a {self.spec} as a plain decimal string, found {dumps(j)}")
            v = int(j)
        else:
            if type(j) is not int:
                raise DecodeError(f"expected a {self.spec} number, found {_type_name(j)}")
            v = j
        if v < self.lo or v > self.hi:
            raise DecodeError(f"{v} is out of the range of {self.spec}")
        return v

    def to_json(self, v: Any) -> Any:
        return str(v) if self.as_string else v

    def lower(self, v: Any) -> Any:
        if type(v) is not int:
            raise DecodeError(f"expected an int ({self.spec}), found {type(v).__name__}")
        if v < self.lo or v > self.hi:
            raise DecodeError(f"{v} is out of the range of {self.spec}")
        return v

    def lift(self, w: Any) -> Any:
        return w


class String(Type):
    classes = frozenset({str})

    def __init__(self) -> None:
        self.spec = "string"

    def from_json(self, j: Any) -> Any:
        if type(j) is not str:
            raise DecodeError(f"expected a string, found {_type_name(j)}")
        _check_str(j)
        return j

    def to_json(self, v: Any) -> Any:
        return v

    def lower(self, v: Any) -> Any:
        if type(v) is not str:
            raise DecodeError(f"expected a str, found {type(v).__name__}")
        _check_str(v)
        return v

    def lift(self, w: Any) -> Any:
        return w


class Bytes(Type):
    """``list<u8>``: base64 in JSON, ``bytes`` in the API."""

    classes = frozenset({bytes})

    def __init__(self) -> None:
        self.spec = {"list": "u8"}

    def from_json(self, j: Any) -> Any:
        if type(j) is not str:
            raise DecodeError(f"expected a base64 string (list<u8>), found {_type_name(j)}")
        if not j.isascii():
            raise DecodeError("bad base64: a character outside the base64 alphabet")
        try:
            v = base64.b64decode(j, validate=True)
        except (binascii.Error, ValueError) as e:
            raise DecodeError(f"bad base64: {e}") from None
        if base64.b64encode(v).decode("ascii") != j:
            raise DecodeError("bad base64: not in canonical form (padding or trailing bits)")
        return v

    def to_json(self, v: Any) -> Any:
        return base64.b64encode(v).decode("ascii")

    def lower(self, v: Any) -> Any:
        if type(v) is bytes:
            return v
        if isinstance(v, (bytearray, memoryview)):
            return bytes(v)
        raise DecodeError(f"expected bytes (list<u8>), found {type(v).__name__}")

    def lift(self, w: Any) -> Any:
        return bytes(w)


class List(Type):
    classes = frozenset({list})

    def __init__(self, elem: Type) -> None:
        self.elem = elem
        self.spec = {"list": elem.spec}
        self.has_resource = elem.has_resource

    def from_json(self, j: Any) -> Any:
        if type(j) is not list:
            raise DecodeError(f"expected an array, found {_type_name(j)}")
        f = self.elem.from_json
        out = []
        i = 0
        try:
            for i, x in enumerate(j):
                out.append(f(x))
        except DecodeError as e:
            raise e.prepend(f"[{i}]")
        return out

    def to_json(self, v: Any) -> Any:
        f = self.elem.to_json
        return [f(x) for x in v]

    def lower(self, v: Any) -> Any:
        if not isinstance(v, (list, tuple)):
            raise DecodeError(f"expected a list, found {type(v).__name__}")
        f = self.elem.lower
        out = []
        i = 0
        try:
            for i, x in enumerate(v):
                out.append(f(x))
        except DecodeError as e:
            raise e.prepend(f"[{i}]")
        return out

    def lift(self, w: Any) -> Any:
        f = self.elem.lift
        return [f(x) for x in w]

    def map_resources(self, v: Any, fn: Callable[[Any, Type], Any]) -> Any:
        if not self.has_resource:
            return v
        return [self.elem.map_resources(x, fn) for x in v]


class Tuple_(Type):
    classes = frozenset({tuple})

    def __init__(self, elems: Sequence[Type]) -> None:
        self.elems = list(elems)
        self.spec = {"tuple": [e.spec for e in self.elems]}
        self.has_resource = any(e.has_resource for e in self.elems)

    def from_json(self, j: Any) -> Any:
        if type(j) is not list:
            raise DecodeError(f"expected an array (a tuple of {len(self.elems)}), found {_type_name(j)}")
        if len(j) != len(self.elems):
            raise DecodeError(f"expected a tuple of {len(self.elems)} elements, found {len(j)}")
        out = []
        for i, (t, x) in enumerate(zip(self.elems, j)):
            try:
                out.append(t.from_json(x))
            except DecodeError as e:
                raise e.prepend(f"[{i}]")
        return out

    def to_json(self, v: Any) -> Any:
        return [t.to_json(x) for t, x in zip(self.elems, v)]

    def lower(self, v: Any) -> Any:
        if not isinstance(v, (list, tuple)):
            raise DecodeError(f"expected a tuple or list, found {type(v).__name__}")
        if len(v) != len(self.elems):
            raise DecodeError(f"expected a tuple of {len(self.elems)} elements, found {len(v)}")
        out = []
        for i, (t, x) in enumerate(zip(self.elems, v)):
            try:
                out.append(t.lower(x))
            except DecodeError as e:
                raise e.prepend(f"[{i}]")
        return tuple(out)

    def lift(self, w: Any) -> Any:
        return [t.lift(x) for t, x in zip(self.elems, w)]

    def map_resources(self, v: Any, fn: Callable[[Any, Type], Any]) -> Any:
        if not self.has_resource:
            return v
        return [t.map_resources(x, fn) for t, x in zip(self.elems, v)]


class Record(Type):
    classes = frozenset({WasmRecord})

    def __init__(self, fields: Sequence[Tuple[str, Type]]) -> None:
        self.fields = list(fields)
        self.names = [n for n, _ in self.fields]
        self.by_name = dict(self.fields)
        if len(self.by_name) != len(self.fields):
            raise SchemaError(f"a record with two fields of one name: {self.names}")
        self.spec = {"record": [{"name": n, "type": t.spec} for n, t in self.fields]}
        self.has_resource = any(t.has_resource for _, t in self.fields)

    def field(self, name: str) -> Type:
        return self.by_name[name]

    def _check_keys(self, keys: Any, what: str) -> None:
        missing = [n for n in self.names if n not in keys]
        if missing:
            raise DecodeError(f"{what} lacks the field `{missing[0]}`")
        unknown = [k for k in keys if k not in self.by_name]
        if unknown:
            raise DecodeError(f"{what} has an unknown field `{unknown[0]}`")

    def from_json(self, j: Any) -> Any:
        if type(j) is not dict:
            raise DecodeError(f"expected an object (a record), found {_type_name(j)}")
        if len(j) != len(self.fields):
            self._check_keys(j, "the record")
        out = {}
        name = ""
        try:
            for name, t in self.fields:
                if name not in j:
                    self._check_keys(j, "the record")
                out[name] = t.from_json(j[name])
        except DecodeError as e:
            raise e.prepend(f".{name}")
        return out

    def to_json(self, v: Any) -> Any:
        return {n: t.to_json(v[n]) for n, t in self.fields}

    def lower(self, v: Any) -> Any:
        if not isinstance(v, dict):
            raise DecodeError(f"expected a dict (a record), found {type(v).__name__}")
        if len(v) != len(self.fields):
            self._check_keys(v, "the record")
        r = WasmRecord()
        d = r.__dict__
        name = ""
        try:
            for name, t in self.fields:
                if name not in v:
                    self._check_keys(v, "the record")
                d[name] = t.lower(v[name])
        except DecodeError as e:
            raise e.prepend(f".{name}")
        return r

    def lift(self, w: Any) -> Any:
        d = w.__dict__
        return {n: t.lift(d[n]) for n, t in self.fields}

    def map_resources(self, v: Any, fn: Callable[[Any, Type], Any]) -> Any:
        if not self.has_resource:
            return v
        return {n: t.map_resources(v[n], fn) for n, t in self.fields}


class _VariantLike(Type):
    """Variants, options and results: tagged as wasmtime-py tags them (``VariantLikeType``)."""

    cases: List[Tuple[str, Optional[Type]]]

    def _setup(self) -> None:
        self.case_by_name = {n: t for n, t in self.cases}
        if len(self.case_by_name) != len(self.cases):
            raise SchemaError(f"two cases of one name: {[n for n, _ in self.cases]}")
        self.has_resource = any(t is not None and t.has_resource for _, t in self.cases)
        # wasmtime-py's `_tagged`: tagged when the classes of two cases overlap.
        seen: set = set()
        tagged = False
        case_classes: List[frozenset] = []
        for _, t in self.cases:
            c = frozenset({object}) if t is None else t.classes
            case_classes.append(c)
            if c & seen:
                tagged = True
            seen |= c
        self.tagged = tagged
        if tagged:
            self.classes = frozenset({WasmVariant})
            return
        self.classes = frozenset(seen)
        # Untagged: wasmtime-py picks, when lowering, the first case whose classes the value is
        # an instance of, and lifts the bare payload. Refuse a type where that is ambiguous (a
        # payload that may itself be None, or a class that is a subclass of an earlier case's
        # class, as bool is of int), so that lifting can tell the case from the value's class.
        self.none_case: Optional[str] = None
        self.dispatch: Dict[type, str] = {}
        for i, ((name, t), c) in enumerate(zip(self.cases, case_classes)):
            if t is None:
                self.none_case = name
                continue
            if object in c:
                raise SchemaError(f"unsupported: the payload of case `{name}` may be none (nested option)")
            for cls in c:
                for (earlier, et), ec in zip(self.cases[:i], case_classes[:i]):
                    if et is not None and any(issubclass(cls, e) for e in ec):
                        raise SchemaError(f"unsupported: cases `{earlier}` and `{name}` cannot be told apart")
                self.dispatch[cls] = name

    def from_json(self, j: Any) -> Any:
        if type(j) is not dict:
            raise DecodeError(f"expected an object with a `tag`, found {_type_name(j)}")
        tag = j.get("tag")
        if type(tag) is not str:
            raise DecodeError("expected an object with a string `tag`")
        if tag not in self.case_by_name:
            raise DecodeError(f"unknown case {dumps(tag)}")
        t = self.case_by_name[tag]
        if t is None:
            if len(j) != 1:
                extra = [k for k in j if k != "tag"][0]
                raise DecodeError(f"the case `{tag}` has no payload, but the object has `{extra}`")
            return {"tag": tag}
        if "val" not in j:
            raise DecodeError(f"the case `{tag}` lacks its `val`")
        if len(j) != 2:
            extra = [k for k in j if k not in ("tag", "val")][0]
            raise DecodeError(f"unknown field `{extra}` beside `tag` and `val`")
        try:
            return {"tag": tag, "val": t.from_json(j["val"])}
        except DecodeError as e:
            raise e.prepend(".val")

    def to_json(self, v: Any) -> Any:
        tag = v["tag"]
        t = self.case_by_name[tag]
        if t is None:
            return {"tag": tag}
        return {"tag": tag, "val": t.to_json(v["val"])}

    def _lower_case(self, tag: Any, payload: Any, has_payload: bool) -> Any:
        if tag not in self.case_by_name:
            raise DecodeError(f"unknown case {tag!r}")
        t = self.case_by_name[tag]
        if t is None:
            if has_payload:
                raise DecodeError(f"the case `{tag}` has no payload")
            return WasmVariant(tag) if self.tagged else None
        if not has_payload:
            raise DecodeError(f"the case `{tag}` lacks its `val`")
        try:
            w = t.lower(payload)
        except DecodeError as e:
            raise e.prepend(".val")
        return WasmVariant(tag, w) if self.tagged else w

    def lower(self, v: Any) -> Any:
        if not isinstance(v, dict) or "tag" not in v:
            raise DecodeError(f"expected a dict with a `tag`, found {type(v).__name__}")
        extra = [k for k in v if k not in ("tag", "val")]
        if extra:
            raise DecodeError(f"unknown key `{extra[0]}` beside `tag` and `val`")
        return self._lower_case(v["tag"], v.get("val"), "val" in v)

    def _lift_case(self, w: Any) -> Tuple[str, Any]:
        if self.tagged:
            return w.tag, w.payload
        if w is None:
            if self.none_case is None:
                raise DecodeError("wasmtime gave no payload for a variant whose every case has one")
            return self.none_case, None
        name = self.dispatch.get(type(w))
        if name is None:
            raise DecodeError(f"wasmtime gave a {type(w).__name__}, which no case of the variant holds")
        return name, w

    def lift(self, w: Any) -> Any:
        tag, payload = self._lift_case(w)
        t = self.case_by_name[tag]
        if t is None:
            return {"tag": tag}
        return {"tag": tag, "val": t.lift(payload)}

    def map_resources(self, v: Any, fn: Callable[[Any, Type], Any]) -> Any:
        if not self.has_resource:
            return v
        t = self.case_by_name[v["tag"]]
        if t is None:
            return v
        return {"tag": v["tag"], "val": t.map_resources(v["val"], fn)}


class Variant(_VariantLike):
    def __init__(self, cases: Sequence[Tuple[str, Optional[Type]]]) -> None:
        self.cases = list(cases)
        self.spec = {"variant": [{"name": n, "type": None if t is None else t.spec} for n, t in self.cases]}
        self._setup()


class Result(_VariantLike):
    def __init__(self, ok: Optional[Type], err: Optional[Type]) -> None:
        self.ok, self.err = ok, err
        self.cases = [("ok", ok), ("err", err)]
        self.spec = {"result": {"ok": None if ok is None else ok.spec, "err": None if err is None else err.spec}}
        self._setup()


class Option(_VariantLike):
    """``option<T>``: ``null`` or the ``T`` in JSON and in the API."""

    def __init__(self, payload: Type) -> None:
        if isinstance(payload, Option):
            raise SchemaError("unsupported: nested option<option<…>>")
        self.payload = payload
        self.cases = [("none", None), ("some", payload)]
        self.spec = {"option": payload.spec}
        self._setup()

    def from_json(self, j: Any) -> Any:
        if j is None:
            return None
        return self.payload.from_json(j)

    def to_json(self, v: Any) -> Any:
        return None if v is None else self.payload.to_json(v)

    def lower(self, v: Any) -> Any:
        if v is None:
            return WasmVariant("none") if self.tagged else None
        w = self.payload.lower(v)
        return WasmVariant("some", w) if self.tagged else w

    def lift(self, w: Any) -> Any:
        tag, payload = self._lift_case(w)
        return None if tag == "none" else self.payload.lift(payload)

    def map_resources(self, v: Any, fn: Callable[[Any, Type], Any]) -> Any:
        if v is None or not self.has_resource:
            return v
        return self.payload.map_resources(v, fn)


class Enum(Type):
    classes = frozenset({str})

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.name_set = frozenset(self.names)
        if len(self.name_set) != len(self.names):
            raise SchemaError(f"an enum with two cases of one name: {self.names}")
        self.spec = {"enum": self.names}

    def from_json(self, j: Any) -> Any:
        if type(j) is not str:
            raise DecodeError(f"expected an enum case name (a string), found {_type_name(j)}")
        if j not in self.name_set:
            raise DecodeError(f"unknown case {dumps(j)}")
        return j

    def to_json(self, v: Any) -> Any:
        return v

    def lower(self, v: Any) -> Any:
        if type(v) is not str or v not in self.name_set:
            raise DecodeError(f"unknown case {v!r}")
        return v

    def lift(self, w: Any) -> Any:
        return w


class Resource(Type):
    """``own<R>`` / ``borrow<R>``: a handle number in JSON; in the API whatever the caller uses
    (``map_resources`` translates); lowered and lifted as wasmtime-py's ``ResourceAny``."""

    classes = _RESOURCE_CLASSES
    has_resource = True

    def __init__(self, kind: str, resource: str) -> None:
        self.kind = kind  # "own" or "borrow"
        self.resource = resource
        self.spec = {kind: resource}

    def from_json(self, j: Any) -> Any:
        if type(j) is not int or j < 0:
            raise DecodeError(f"expected a handle (a number from 0), found {_type_name(j) if type(j) is not int else j}")
        return j

    def to_json(self, v: Any) -> Any:
        if type(v) is not int:
            raise TypeError(f"a {self.kind}<{self.resource}> must be a handle number to encode, found {type(v).__name__}")
        return v

    def lower(self, v: Any) -> Any:
        if isinstance(v, (ResourceAny, ResourceHost)):
            return v
        raise DecodeError(f"expected a resource, found {type(v).__name__}")

    def lift(self, w: Any) -> Any:
        return w

    def map_resources(self, v: Any, fn: Callable[[Any, Type], Any]) -> Any:
        return fn(v, self)


_INT_NAMES = ("u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64")


def compile_type(spec: Any, where: str = "") -> Type:
    """The :class:`Type` of a schema type (docs/traces.md, "The schema")."""
    if isinstance(spec, str):
        if spec == "bool":
            return Bool()
        if spec in _INT_NAMES:
            return Int(spec)
        if spec == "string":
            return String()
        raise SchemaError(f"{where}: unsupported type {dumps(spec)} (the world uses no floats, char or flags)")
    if not isinstance(spec, dict) or len(spec) != 1:
        raise SchemaError(f"{where}: a type is a name or an object of one key, found {dumps(spec)}")
    (kind, arg), = spec.items()
    if kind == "list":
        if arg == "u8":
            return Bytes()
        return List(compile_type(arg, where))
    if kind == "option":
        return Option(compile_type(arg, where))
    if kind == "tuple":
        if not isinstance(arg, list):
            raise SchemaError(f"{where}: a tuple's elements are an array")
        return Tuple_([compile_type(t, where) for t in arg])
    if kind == "record":
        if not isinstance(arg, list):
            raise SchemaError(f"{where}: a record's fields are an array")
        fields = []
        for f in arg:
            if not isinstance(f, dict) or set(f) != {"name", "type"} or not isinstance(f["name"], str):
                raise SchemaError(f"{where}: a record field is {{\"name\":…,\"type\":…}}, found {dumps(f)}")
            t = compile_type(f["type"], f"{where}.{f['name']}")
            if isinstance(t, Resource):
                raise SchemaError(f"{where}: unsupported: a resource inside a record")
            fields.append((f["name"], t))
        return Record(fields)
    if kind == "variant":
        if not isinstance(arg, list):
            raise SchemaError(f"{where}: a variant's cases are an array")
        cases = []
        for c in arg:
            if not isinstance(c, dict) or set(c) != {"name", "type"} or not isinstance(c["name"], str):
                raise SchemaError(f"{where}: a variant case is {{\"name\":…,\"type\":…}}, found {dumps(c)}")
            cases.append((c["name"], None if c["type"] is None else compile_type(c["type"], f"{where}.{c['name']}")))
        return Variant(cases)
    if kind == "enum":
        if not isinstance(arg, list) or not all(isinstance(n, str) for n in arg):
            raise SchemaError(f"{where}: an enum's cases are an array of names")
        return Enum(arg)
    if kind == "result":
        if not isinstance(arg, dict) or set(arg) != {"ok", "err"}:
            raise SchemaError(f"{where}: a result is {{\"ok\":…,\"err\":…}}, found {dumps(arg)}")
        ok = None if arg["ok"] is None else compile_type(arg["ok"], f"{where}.ok")
        err = None if arg["err"] is None else compile_type(arg["err"], f"{where}.err")
        return Result(ok, err)
    if kind in ("own", "borrow"):
        if not isinstance(arg, str):
            raise SchemaError(f"{where}: a resource is named by a string")
        return Resource(kind, arg)
    raise SchemaError(f"{where}: unsupported type {dumps(spec)}")


# ---------------------------------------------------------------------------------------------
# Functions and the schema


class Param:
    __slots__ = ("name", "type")

    def __init__(self, name: str, type: Type) -> None:
        self.name = name
        self.type = type


class Function:
    """One function of the world: its trace name (``call``), where the component exports it,
    its parameters and its result type (``None`` for a function without one)."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        for key in ("call", "interface", "export", "params", "result"):
            if key not in spec:
                raise SchemaError(f"a function lacks `{key}`: {dumps(spec)[:200]}")
        self.spec = spec
        self.call: str = spec["call"]
        self.interface: str = spec["interface"]
        self.export: str = spec["export"]
        self.params: List[Param] = []
        for p in spec["params"]:
            if not isinstance(p, dict) or set(p) != {"name", "type"}:
                raise SchemaError(f"{self.call}: a parameter is {{\"name\":…,\"type\":…}}")
            self.params.append(Param(p["name"], compile_type(p["type"], f"{self.call}({p['name']})")))
        self.param_names = [p.name for p in self.params]
        self.result: Optional[Type] = None if spec["result"] is None else compile_type(spec["result"], f"{self.call}->")
        first = self.params[0] if self.params else None
        #: The resource this is a method of (``tracker``), or None.
        self.method_of: Optional[str] = (
            first.type.resource
            if first is not None and first.name == "self" and isinstance(first.type, Resource) and first.type.kind == "borrow"
            else None
        )
        #: True when the result holds an ``own`` (a constructor such as ``tracker.create``).
        self.makes_resource = self.result is not None and self.result.has_resource
        for p in self.params[1 if self.method_of else 0:]:
            if p.type.has_resource:
                raise SchemaError(f"{self.call}: unsupported: a resource parameter besides `self`")

    def args_from_json(self, j: Any) -> List[Any]:
        """The API arguments, in order, from a trace line's ``args`` object (strict)."""
        if type(j) is not dict:
            raise DecodeError(f"expected an object of arguments, found {_type_name(j)}", "args")
        for name in self.param_names:
            if name not in j:
                raise DecodeError(f"lacks the argument `{name}`", "args")
        if len(j) != len(self.params):
            unknown = [k for k in j if k not in self.param_names][0]
            raise DecodeError(f"unknown argument `{unknown}`", "args")
        out = []
        for p in self.params:
            try:
                out.append(p.type.from_json(j[p.name]))
            except DecodeError as e:
                raise e.prepend(f"args.{p.name}")
        return out

    def args_to_json(self, args: Sequence[Any]) -> Dict[str, Any]:
        return {p.name: p.type.to_json(a) for p, a in zip(self.params, args)}

    def __repr__(self) -> str:
        return f"Function({self.call})"


class Schema:
    """The functions of the world, by trace name."""

    def __init__(self, spec: Dict[str, Any], source: str = "<schema>") -> None:
        if not isinstance(spec, dict) or "package" not in spec or "functions" not in spec:
            raise SchemaError(f"{source}: the schema is {{\"package\":…,\"functions\":[…]}}")
        self.source = source
        self.package: str = spec["package"]
        self.functions: Dict[str, Function] = {}
        for f in spec["functions"]:
            fn = Function(f)
            if fn.call in self.functions:
                raise SchemaError(f"{source}: the call `{fn.call}` twice")
            self.functions[fn.call] = fn

    def __getitem__(self, call: str) -> Function:
        return self.functions[call]

    def get(self, call: str) -> Optional[Function]:
        return self.functions.get(call)

    @property
    def interfaces(self) -> List[str]:
        seen: List[str] = []
        for fn in self.functions.values():
            if fn.interface not in seen:
                seen.append(fn.interface)
        return seen


def schema_path() -> Path:
    """Where the schema is read from (see the module's docstring for the order)."""
    env = os.environ.get("CLB_SCHEMA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    packaged = here / "schema.json"
    if packaged.is_file():
        return packaged
    checkout = here.parent.parent / "schema" / "clb-reconciler.json"
    if checkout.is_file():
        return checkout
    raise SchemaError(
        f"no schema: set CLB_SCHEMA, or install the package (which copies hosts/schema/clb-reconciler.json), "
        f"or run from a checkout (looked for {packaged} and {checkout})"
    )


_SCHEMA_CACHE: Dict[str, Schema] = {}


def load_schema(path: Optional[os.PathLike] = None) -> Schema:
    """The compiled schema, from ``path`` or from :func:`schema_path`. Cached per path."""
    p = Path(path) if path is not None else schema_path()
    key = str(p.resolve())
    cached = _SCHEMA_CACHE.get(key)
    if cached is not None:
        return cached
    try:
        spec = loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SchemaError(f"{p}: cannot read the schema: {e}") from None
    schema = Schema(spec, str(p))
    _SCHEMA_CACHE[key] = schema
    return schema
