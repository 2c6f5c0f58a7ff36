"""The integrator API of the Python host.

Values go in and come out as plain Python data in the canonical JSON shape of docs/traces.md,
with two differences that make them pleasant in Python: ``u64``/``s64`` are ``int`` (the JSON
text has decimal strings) and ``list<u8>`` is ``bytes`` (the text has base64). So:

* a record is a ``dict`` with **every** field, kebab-case keys (``"wake-at-ms"``);
* a variant or a result is ``{"tag": "case"}`` or ``{"tag": "case", "val": payload}``;
* an enum is its case name (``"warning"``); an option is ``None`` or the value;
* a tuple is a list (``[id, outcome]``); a list is a list.

Inputs are checked strictly against the schema before the guest sees them (a missing field or an
integer out of range raises :class:`~clb_reconciler.codec.DecodeError`). ``codec.dumps`` of
``Type.to_json`` gives the canonical text of any value (see :meth:`Component.encode`).

Each :class:`Tracker` and :class:`PoolQueue` lives in its own wasmtime store and instance, so a
trap costs only that one; the pure functions (``validate_config``, ``admit_service``,
``place_service``) run in another instance, which is replaced after a trap.

Example::

    from clb_reconciler import Component, Tracker
    logic = Component.load("clb_guest.wasm")
    config = {"backend-pool-type": "podIP", "load-balancer-sku": "standardV2", "multiple-standard-load-balancers": [], "write-budgets": None}
    tracker = Tracker.create(logic, config)
    step = tracker.observe(0, [{"tag": "lists-complete"}])
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

from .codec import DecodeError, Function, Schema, dumps, load_schema
from .sandbox import (
    DEFAULT_DEADLINE_MS,
    DEFAULT_FUEL,
    DEFAULT_MEMORY_MIB,
    GuestTrap,
    Limits,
    LoadedComponent,
    LoadError,
    Session,
    load_component,
)

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
    "Limits",
]


class Refused(Exception):
    """The logic answered ``err``: ``error`` is the error value (API shape)."""

    def __init__(self, call: str, error: Any) -> None:
        super().__init__(f"`{call}` refused: {dumps(_jsonish(error))}")
        self.call = call
        self.error = error


class ConfigRefused(Refused):
    """``tracker.create`` refused the configuration; ``error`` is a ``config-error`` record
    (``{"field": …, "reason": …, "message": …}``)."""


class StateRefused(Refused):
    """``tracker.import-state`` refused the state; ``error`` is a ``state-error`` variant
    (``unsupported-version``, ``corrupt`` or ``invalid-config``)."""


def _jsonish(v: Any) -> Any:
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    if isinstance(v, dict):
        return {k: _jsonish(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonish(x) for x in v]
    return v


class Component:
    """A loaded version of the logic: compiled once, checked against the schema and the import
    allow-list, instantiated per tracker / pool queue."""

    def __init__(self, loaded: LoadedComponent) -> None:
        self._loaded = loaded
        self._pure: Optional[Session] = None

    @classmethod
    def load(
        cls,
        path: "str | os.PathLike[str]",
        *,
        fuel: int = DEFAULT_FUEL,
        deadline_ms: int = DEFAULT_DEADLINE_MS,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        schema: "str | os.PathLike[str] | None" = None,
    ) -> "Component":
        """Compiles and checks the component at ``path``.

        ``fuel`` is the budget of one call (default 20,000,000,000, as ``clb-host``),
        ``deadline_ms`` its wall-clock bound (default 10,000), ``memory_mib`` the cap on an
        instance's linear memory (default 512). ``schema`` overrides where the schema is read
        (default: see :mod:`clb_reconciler.codec`). Raises :class:`LoadError`.
        """
        limits = Limits(fuel=fuel, deadline_ms=deadline_ms, memory_mib=memory_mib)
        sch = load_schema(schema) if schema is not None else None
        return cls(load_component(os.fspath(path), limits, sch))

    # -- what it is ---------------------------------------------------------------------------

    @property
    def sha256(self) -> str:
        """The hex SHA-256 of the component's bytes."""
        return self._loaded.sha256

    @property
    def package(self) -> Optional[str]:
        """The package the component exports, e.g. ``clb:reconciler@0.14.0``."""
        return self._loaded.package

    @property
    def path(self) -> Optional[str]:
        return self._loaded.path

    @property
    def limits(self) -> Limits:
        return self._loaded.limits

    @property
    def schema(self) -> Schema:
        return self._loaded.schema

    @property
    def loaded(self) -> LoadedComponent:
        return self._loaded

    def function(self, call: str) -> Function:
        """The schema's function named ``call`` (``tracker.observe``, …)."""
        return self._loaded.schema[call]

    def encode(self, call: str, value: Any, *, param: Optional[str] = None) -> str:
        """The canonical text of ``value`` as the result of ``call`` (or as its parameter
        ``param``). Handles must be numbers here."""
        fn = self.function(call)
        ty = fn.result if param is None else next(p.type for p in fn.params if p.name == param)
        assert ty is not None
        return ty.encode(value)

    # -- pure functions -----------------------------------------------------------------------

    def _call_pure(self, call: str, args: Sequence[Any]) -> Any:
        fn = self.function(call)
        if self._pure is None or self._pure.poisoned:
            self._pure = self._loaded.session()
        return self._pure.call(fn, args)

    def validate_config(self, config: Dict[str, Any]) -> Dict[str, Any]:
        """``validate-config``: ``{"tag": "ok", "val": mode}`` (``container-load-balancer``,
        ``multi-slb-local-services`` or ``inactive``) or ``{"tag": "err", "val": config-error}``."""
        return self._call_pure("validate-config", [config])

    def admit_service(self, config: Dict[str, Any], service: Dict[str, Any]) -> Dict[str, Any]:
        """``admit-service``: the admission, ``{"verdict": …, "warnings": [str, …]}``, whose verdict is
        ``{"tag": "admitted"}``, ``{"tag": "ignored", "val": why}``,
        ``{"tag": "rejected", "val": {"reason": …, "message": …}}``, …"""
        return self._call_pure("admit-service", [config, service])

    def place_service(
        self, configurations: List[Dict[str, Any]], service: Dict[str, Any], facts: Dict[str, Any]
    ) -> Dict[str, Any]:
        """``place-service`` (upstream's placement): ``{"tag": "not-local", "val": [left-pool, …]}``,
        ``{"tag": "at", "val": service-placement}`` or ``{"tag": "refused", "val": why}``.
        ``configurations`` are ``slb-configuration`` records, ``facts`` a ``placement-facts``
        record (``namespace-labels``, ``current-load-balancer``, ``load-balancers`` with their
        rules, pools and frontends, ``public-ips``, ``resource-group``, ``cluster-name``), as
        ``wit/clb.wit`` defines them."""
        return self._call_pure("place-service", [configurations, service, facts])


def _own(value: Any) -> Any:
    """The resource inside a constructor's API result (``own`` or ``result<own, E>``)."""
    if isinstance(value, dict) and "tag" in value:
        return value.get("val") if value["tag"] == "ok" else None
    return value


class _Handle:
    """A resource in its own instance."""

    _resource_name = ""

    def __init__(self, component: Component, session: Session, resource: Any) -> None:
        self.component = component
        self._session = session
        self._resource = resource

    def _call(self, call: str, *args: Any) -> Any:
        fn = self.component.function(call)
        return self._session.call(fn, [self._resource, *args])

    @property
    def poisoned(self) -> bool:
        """True once a call trapped: the instance is unusable; make a new one (for a tracker,
        from an earlier :meth:`Tracker.export_state`)."""
        return self._session.poisoned

    def fuel_left(self) -> int:
        """Fuel the last call left unused."""
        return self._session.fuel_left()


class Tracker(_Handle):
    """The stateful core (``clb:reconciler/reconciler`` ``tracker``): observations and outcomes
    in, commands out. Every step method (``observe``, ``complete``, ``tick``) returns a ``step``:
    ``{"commands": [{"id": int, "command": {"tag": …, "val": …}}, …], "wake-at-ms": int|None, "idle": bool}``.
    """

    _resource_name = "tracker"

    def __init__(self, component: Component, session: Session, resource: Any, config: Dict[str, Any]) -> None:
        super().__init__(component, session, resource)
        self.config = config

    @classmethod
    def create(cls, component: Component, config: Dict[str, Any]) -> "Tracker":
        """``tracker.create``: a tracker with empty state. Raises :class:`ConfigRefused`."""
        session = component.loaded.session()
        result = session.call(component.function("tracker.create"), [config])
        if result["tag"] != "ok":
            raise ConfigRefused("tracker.create", result["val"])
        return cls(component, session, result["val"], config)

    @classmethod
    def import_state(cls, component: Component, config: Dict[str, Any], state: Dict[str, Any]) -> "Tracker":
        """``tracker.import-state``: a tracker from ``{"version": int, "payload": bytes}`` (what
        :meth:`export_state` returned, maybe from another version of the logic). Raises
        :class:`StateRefused`."""
        session = component.loaded.session()
        result = session.call(component.function("tracker.import-state"), [config, state])
        if result["tag"] != "ok":
            raise StateRefused("tracker.import-state", result["val"])
        return cls(component, session, result["val"], config)

    def observe(self, now_ms: int, batch: List[Dict[str, Any]]) -> Dict[str, Any]:
        """``tracker.observe``: what the watchers saw since the last call, in order
        (``observation`` variants: ``service-upserted``, ``slice-upserted``, ``lists-complete``, …)."""
        return self._call("tracker.observe", now_ms, batch)

    def complete(
        self, now_ms: int, results: List[Sequence[Any]], arm_remaining_writes: Optional[int] = None
    ) -> Dict[str, Any]:
        """``tracker.complete``: outcomes by command id, ``[[id, {"tag": "ok"}], …]``, with what
        ARM's ``x-ms-ratelimit-remaining-subscription-writes`` said on the latest of their
        answers that carried it (``None``: none did)."""
        return self._call("tracker.complete", now_ms, [list(r) for r in results], arm_remaining_writes)

    def tick(self, now_ms: int) -> Dict[str, Any]:
        """``tracker.tick``: time passed (at ``wake-at-ms`` or on the periodic resync)."""
        return self._call("tracker.tick", now_ms)

    def export_state(self) -> Dict[str, Any]:
        """``tracker.export-state``: ``{"version": int, "payload": bytes}``."""
        return self._call("tracker.export-state")

    def state_version(self) -> int:
        """``tracker.state-version``: the schema version :meth:`export_state` writes."""
        return self._call("tracker.state-version")

    def stats(self, now_ms: int) -> Dict[str, Any]:
        """``tracker.stats``: what the tracker is doing, for dashboards (a ``tracker-stats``
        record: ``{"service-gateway-enabled": bool, "pending": [{"state", "service-type",
        "count", "oldest-began-ms"}, …], …, "budgets": [{"bucket", "tokens", "per-minute"}, …]}``).
        Reads only: calling it or not changes no later answer. ``now_ms`` is when the write
        budgets' levels are taken."""
        return self._call("tracker.stats", now_ms)

    def swap(self, component: Component) -> "Tracker":
        """A hot swap as ``clb-host`` records it: this tracker's :meth:`export_state` imported
        into a fresh instance of ``component`` with the same configuration. This tracker stays
        usable. (No self-check tick and no state-version check: the Rust supervisor's.)"""
        return Tracker.import_state(component, self.config, self.export_state())


class PoolQueue(_Handle):
    """The backend-pool updater's queue (``clb:reconciler/backend-pools`` ``pool-queue``)."""

    _resource_name = "pool-queue"

    @classmethod
    def create(cls, component: Component, max_retries: int) -> "PoolQueue":
        """``pool-queue.create``: an empty queue; a failed group is retried at most
        ``max_retries`` times."""
        session = component.loaded.session()
        resource = session.call(component.function("pool-queue.create"), [max_retries])
        return cls(component, session, resource)

    def enqueue(self, operations: List[Dict[str, Any]]) -> None:
        """``pool-queue.enqueue``: ``pool-operation`` records
        (``{"service", "load-balancer", "pool", "kind": "add"|"remove"|"delete-pool"|"ensure-pool", "node-ips"}``)."""
        self._call("pool-queue.enqueue", operations)

    def remove_operations(self, service: str) -> int:
        """``pool-queue.remove-operations``: how many queued operations of ``namespace/name`` were removed."""
        return self._call("pool-queue.remove-operations", service)

    def status(self, now_ms: int) -> Dict[str, Any]:
        """``pool-queue.status``: ``{"queued": int, "ready": bool, "wake-at-ms": int|None}``."""
        return self._call("pool-queue.status", now_ms)

    def drain_and_group(self, now_ms: int, assignment: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """``pool-queue.drain-and-group``: ``pool-group`` records, one per pool, sorted by key."""
        return self._call("pool-queue.drain-and-group", now_ms, assignment)

    def report(self, now_ms: int, group: int, outcome: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """``pool-queue.report``: the ``group-report``, or ``None`` for an unknown group."""
        return self._call("pool-queue.report", now_ms, group, outcome)
