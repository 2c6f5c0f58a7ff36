"""The Python host of the CLB reconciler component (``clb:reconciler@0.14.0``).

* :mod:`clb_reconciler.codec`: the canonical JSON encoding of WIT values, driven by the schema.
* :mod:`clb_reconciler.host`: the integrator API (:class:`Component`, :class:`Tracker`,
  :class:`PoolQueue`).
* :mod:`clb_reconciler.replay`: ``python -m clb_reconciler replay`` (docs/traces.md).
"""

from .codec import DecodeError, Schema, SchemaError, dumps, load_schema
from .host import Component, ConfigRefused, PoolQueue, Refused, StateRefused, Tracker
from .sandbox import DEFAULT_DEADLINE_MS, DEFAULT_FUEL, DEFAULT_MEMORY_MIB, GuestTrap, Limits, LoadError

__version__ = "0.1.0"

__all__ = [
    "Component",
    "Tracker",
    "PoolQueue",
    "GuestTrap",
    "LoadError",
    "Refused",
    "ConfigRefused",
    "StateRefused",
    "DecodeError",
    "Schema",
    "SchemaError",
    "Limits",
    "DEFAULT_FUEL",
    "DEFAULT_DEADLINE_MS",
    "DEFAULT_MEMORY_MIB",
    "dumps",
    "load_schema",
]
