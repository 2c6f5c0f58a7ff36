"""Speed-ups of wasmtime-py's component value conversions, for the pinned ``wasmtime==50.0.1``.

wasmtime-py re-reads every type over FFI on every conversion (a record's fields, a variant's
cases, a function's parameters, each call and each element), and converts a ``list<u8>`` one
byte at a time. This module

* caches, per type object, the answers of those properties (types do not change), and a
  function's type per ``Func`` object (one per instance and export, see ``Session.func``);
* lowers and lifts ``list<u8>`` with one ``memmove`` / ``string_at`` instead of a Python loop.

Nothing else changes: the same conversions run on the same values. :func:`install` is
idempotent and does nothing if wasmtime-py is not the version it was written against (the
struct layout it relies on is checked too).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
from typing import Any

from wasmtime import _ffi as ffi
from wasmtime.component import _func as cfunc
from wasmtime.component import _types as ctypes_mod

_INSTALLED = False
_VERSION = "50.0.1"


def _cached_property(prop: property, key: str) -> property:
    getter = prop.fget
    assert getter is not None

    @functools.wraps(getter)
    def get(self: Any) -> Any:
        d = self.__dict__
        try:
            return d[key]
        except KeyError:
            value = d[key] = getter(self)
            return value

    return property(get, doc=prop.__doc__)


def install() -> bool:
    """Installs the speed-ups; returns whether they are in place."""
    global _INSTALLED
    if _INSTALLED:
        return True
    try:
        if importlib.metadata.version("wasmtime") != _VERSION:
            return False
    except importlib.metadata.PackageNotFoundError:
        return False
    val_t = ffi.wasmtime_component_val_t
    names = [f[0] for f in val_t._fields_]
    if names != ["kind", "of"] or val_t.kind.offset != 0 or ffi.WASMTIME_COMPONENT_U8.value != 2:
        return False
    t = ctypes_mod
    for cls, attr in [
        (t.RecordType, "fields"),
        (t.TupleType, "elements"),
        (t.ListType, "element"),
        (t.VariantType, "cases"),
        (t.OptionType, "payload"),
        (t.ResultType, "ok"),
        (t.ResultType, "err"),
        (t.EnumType, "names"),
        (t.FuncType, "params"),
        (t.FuncType, "result"),
    ]:
        setattr(cls, attr, _cached_property(getattr(cls, attr), f"_clb_{attr}"))

    tagged = t.VariantLikeType._tagged

    def cached_tagged(self: Any) -> bool:
        d = self.__dict__
        try:
            return d["_clb_tagged"]
        except KeyError:
            value = d["_clb_tagged"] = tagged(self)
            return value

    t.VariantLikeType._tagged = cached_tagged  # type: ignore[method-assign]

    func_type = cfunc.Func.type

    def cached_type(self: Any, store: Any) -> Any:
        d = self.__dict__
        try:
            return d["_clb_type"]
        except KeyError:
            value = d["_clb_type"] = func_type(self, store)
            return value

    cfunc.Func.type = cached_type  # type: ignore[method-assign]

    size = ctypes.sizeof(val_t)
    offset = val_t.of.offset
    kind_u8 = ffi.WASMTIME_COMPONENT_U8.value
    to_c = t.ListType.convert_to_c
    from_c = t.ListType.convert_from_c

    def is_bytes(self: Any) -> bool:
        d = self.__dict__
        try:
            return d["_clb_is_bytes"]
        except KeyError:
            value = d["_clb_is_bytes"] = isinstance(self.element, t.U8)
            return value

    def convert_to_c(self: Any, store: Any, val: Any, ptr: Any) -> None:
        if not is_bytes(self):
            return to_c(self, store, val, ptr)
        if not isinstance(val, (bytes, bytearray)):
            raise TypeError("expected bytes value")
        n = len(val)
        raw = ffi.wasmtime_component_vallist_t()
        ffi.wasmtime_component_vallist_new_uninit(raw, n)
        if n:
            buf = bytearray(n * size)
            buf[0::size] = bytes((kind_u8,)) * n
            buf[offset::size] = val
            ctypes.memmove(raw.data, (ctypes.c_char * len(buf)).from_buffer(buf), len(buf))
        ptr.contents.kind = ffi.WASMTIME_COMPONENT_LIST
        ptr.contents.of.list = raw

    def convert_from_c(self: Any, c: Any) -> Any:
        if not is_bytes(self):
            return from_c(self, c)
        assert c.kind == ffi.WASMTIME_COMPONENT_LIST.value
        lst = c.of.list
        n = lst.size
        try:
            if not n:
                return b""
            data = ctypes.string_at(lst.data, n * size)
            if data[0::size] != bytes((kind_u8,)) * n:
                raise TypeError("a list<u8> with an element that is not a u8")
            return data[offset::size]
        finally:
            ffi.wasmtime_component_vallist_delete(ctypes.byref(c.of.list))

    t.ListType.convert_to_c = convert_to_c  # type: ignore[method-assign]
    t.ListType.convert_from_c = convert_from_c  # type: ignore[method-assign]
    t.ListType._is_bytes = is_bytes  # type: ignore[method-assign]
    _INSTALLED = True
    return True
