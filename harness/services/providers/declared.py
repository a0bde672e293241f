"""Services a workload declares: a side-effecting HTTP service described by a small spec,
run by the harness like the built-in providers, so any team can declare
the services its workload calls.

A team's tools call their own services (a ticketing API, a CRM), not the harness's
payment and mail fakes. A workload declares each one as a :class:`ServiceSpec` in its
``services`` and lists its name in ``providers``; the harness then starts it in a
process of its own (:mod:`.server` with ``--service``), with a durable SQLite ledger
(:mod:`.ledger`), per-worker in-flight counting, ``GET /ledger`` (so the oracle's
``provider.<name>.ledger_equal`` compares it), ``POST /admin/delay`` (so the probe
certifier's sandbox can slow it), and reachable through the fault proxy for ``net``
cases (a link named after the service). Example (``scenarios/ticketing.py``)::

    TICKETS = ServiceSpec("ticketing", routes=(
        EffectRoute("POST", "/v2/tickets", op="ticket", key="header:Idempotency-Key",
                    same_effect=("queue", "subject", "body"),
                    answer={"state": "open"}, id_field="ticket_id", id_prefix="TCK-",
                    status_path="/v2/tickets/by-key/{key}"),
    ))

**Fields of a request** are named by a *selector*: ``"header:NAME"`` (an HTTP header,
case-insensitive), ``"path:NAME"`` (a ``{NAME}`` segment of the route's path),
``"body:NAME"`` or a bare ``"NAME"`` (a top-level field of the JSON object body).

**What a request does**, in order (the same contract as the built-in providers):
its body must be a JSON object, its key a non-empty string of at most 255 characters,
its run id (``run_id`` selector, default ``body:metadata.run_id``) a non-empty string,
every ``same_effect`` field present, else 400 ``{"error": "<selector>: ...", "field":
"<selector>"}`` and no row. Then the service's delay (``POST /admin/delay``), then, with
no await between the look-up and the insert: the first request with a key is applied
(a ledger row, the canned answer); a repeat with the same run id and the same
``same_effect`` values gets the stored answer again (``Idempotent-Replayed: true``); a
repeat with other values or from another run gets 409 (a conflict, as the built-in
providers answer) and changes nothing but the row's ``attempts``.

**The canned answer** is ``answer``, plus the ``same_effect`` body fields when ``echo``
is true, plus ``id_field``: ``id_prefix + sha256(key)`` in 64 hex digits. The id is
derived from the key, so every repeat gets the same answer and the oracle renames the
digest like a key. ``status_path`` (a path with ``{key}``): ``GET`` answers 200 with the
stored answer, or 404 ``{"error": "not_found"}``: the route a probe reads (see
:func:`.clients.get_status`).

A spec is plain data: it crosses to the server process as JSON (:meth:`ServiceSpec.to_json`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crashmatrix.harness.errors import InvalidArgument

__all__ = ["EffectRoute", "ServiceSpec", "derive_service_id", "workload_services", "BUILTIN_KINDS"]

BUILTIN_KINDS = ("payment", "mail", "model", "docstore")
"""The harness's own provider kinds; a declared service may not take one of their names."""

_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")
_OP_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
_PATH_RE = re.compile(r"(/[A-Za-z0-9_.~-]+|/\{[A-Za-z_][A-Za-z0-9_]*\})+")
_SEGMENT_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER_RE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_BODY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
METHODS = ("POST", "PUT", "PATCH")


def derive_service_id(prefix: str, key: str) -> str:
    """The id a declared service derives from an idempotency key:
    ``prefix + sha256(key)`` as 64 hex digits."""
    return prefix + hashlib.sha256(key.encode("utf-8")).hexdigest()


def _selector(value: Any, what: str, path_names: set[str], *, dotted_body: bool = False) -> str:
    """``value`` as a normalised selector (``header:``/``path:``/``body:`` + name)."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what}={value!r} must be a selector: 'header:NAME', 'path:NAME' or a body field name")
    source, sep, name = value.partition(":")
    if not sep:
        source, name = "body", value
    if source == "header" and _HEADER_RE.fullmatch(name):
        return f"header:{name}"
    if source == "path" and name in path_names:
        return f"path:{name}"
    if source == "path":
        raise InvalidArgument(f"{what}={value!r} names no {{segment}} of the route's path (it has: "
                              f"{', '.join(sorted(path_names)) or 'none'})")
    if source == "body" and all(_BODY_RE.fullmatch(part) for part in name.split(".")) and (
            dotted_body or "." not in name):
        return f"body:{name}"
    raise InvalidArgument(f"{what}={value!r} must be 'header:NAME', 'path:NAME' or a top-level body field name")


@dataclass(frozen=True)
class EffectRoute:
    """One side-effecting route of a declared service (module docstring for the rules).

    ``method``: ``POST``, ``PUT`` or ``PATCH``; ``path``: e.g. ``/v2/tickets`` or
    ``/records/{ref}`` (``{NAME}`` segments match one path segment); ``op``: the ledger
    rows' ``op`` (``[a-z][a-z0-9_]*``, unique within the service); ``key``: the
    selector of the idempotency key; ``same_effect``: the selectors whose values make
    two requests with one key the same effect; ``answer``: the canned answer's fixed
    fields (JSON); ``id_field`` / ``id_prefix``: the derived id's field and prefix (the
    prefix must end in a character that is not a letter, digit or ``_``, so that the
    oracle sees the digest as an identifier); ``status``: the ledger row's status word;
    ``http_status``: 200 or 201; ``echo``: the answer repeats the ``same_effect`` body
    fields; ``status_path``: the probe's ``GET`` route, with ``{key}``, or None;
    ``run_id``: the selector of the run id (body fields may be dotted here).

    Raises :class:`~crashmatrix.harness.errors.InvalidArgument` naming the field."""

    method: str
    path: str
    op: str
    key: str
    same_effect: tuple[str, ...]
    answer: Mapping[str, Any] = field(default_factory=dict)
    id_field: str = "id"
    id_prefix: str = "id-"
    status: str = "created"
    http_status: int = 200
    echo: bool = True
    status_path: str | None = None
    run_id: str = "body:metadata.run_id"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidArgument(f"method={self.method!r} must be one of {', '.join(METHODS)}")
        if not isinstance(self.path, str) or not _PATH_RE.fullmatch(self.path):
            raise InvalidArgument(f"path={self.path!r} must be an absolute path like '/v2/tickets' or '/docs/{{ref}}'")
        if self.path in ("/health", "/inflight", "/ledger") or self.path.startswith("/admin/"):
            raise InvalidArgument(f"path={self.path!r} is one of the harness's own routes")
        if not isinstance(self.op, str) or not _OP_RE.fullmatch(self.op):
            raise InvalidArgument(f"op={self.op!r} must match [a-z][a-z0-9_]* (at most 40 characters)")
        names = set(_SEGMENT_RE.findall(self.path))
        object.__setattr__(self, "key", _selector(self.key, "key", names))
        if isinstance(self.same_effect, str) or not isinstance(self.same_effect, Iterable):
            raise InvalidArgument(f"same_effect={self.same_effect!r} must be a tuple of selectors")
        same = tuple(_selector(s, f"same_effect[{i}]", names) for i, s in enumerate(self.same_effect))
        if len(set(same)) != len(same) or self.key in same:
            raise InvalidArgument(f"same_effect={self.same_effect!r} must be distinct selectors other than the key")
        object.__setattr__(self, "same_effect", same)
        object.__setattr__(self, "run_id", _selector(self.run_id, "run_id", names, dotted_body=True))
        try:
            answer = json.loads(json.dumps(dict(self.answer)))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"answer={self.answer!r} must be a JSON object ({exc})") from None
        object.__setattr__(self, "answer", answer)
        if not isinstance(self.id_field, str) or not _BODY_RE.fullmatch(self.id_field):
            raise InvalidArgument(f"id_field={self.id_field!r} must be a field name")
        if not isinstance(self.id_prefix, str):
            raise InvalidArgument(f"id_prefix={self.id_prefix!r} must be a string (e.g. 'TCK-')")
        if not isinstance(self.status, str) or not self.status:
            raise InvalidArgument(f"status={self.status!r} must be a non-empty word")
        if self.http_status not in (200, 201):
            raise InvalidArgument(f"http_status={self.http_status!r} must be 200 or 201")
        if self.status_path is not None and (
                not isinstance(self.status_path, str) or not _PATH_RE.fullmatch(self.status_path)
                or _SEGMENT_RE.findall(self.status_path) != ["key"]):
            raise InvalidArgument(f"status_path={self.status_path!r} must be a path with one {{key}} segment, "
                                  "e.g. '/v2/tickets/by-key/{key}'")

    @property
    def body_fields(self) -> tuple[str, ...]:
        """The ``same_effect`` fields that come from the body, by name."""
        return tuple(s.removeprefix("body:") for s in self.same_effect if s.startswith("body:"))

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "op": self.op, "key": self.key,
                "same_effect": list(self.same_effect), "answer": dict(self.answer), "id_field": self.id_field,
                "id_prefix": self.id_prefix, "status": self.status, "http_status": self.http_status,
                "echo": self.echo, "status_path": self.status_path, "run_id": self.run_id}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EffectRoute:
        return cls(**{**d, "same_effect": tuple(d["same_effect"])})


@dataclass(frozen=True)
class ServiceSpec:
    """A declared service: ``name`` (``[a-z][a-z0-9_-]*``, at most 40 characters, not a
    built-in kind; the link name of ``net`` cases and the ``<name>`` of
    ``provider.<name>.ledger_equal``) and its ``routes`` (at least one
    :class:`EffectRoute`; methods and paths distinct, ops distinct). Raises
    :class:`~crashmatrix.harness.errors.InvalidArgument` naming the field."""

    name: str
    routes: tuple[EffectRoute, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise InvalidArgument(f"name={self.name!r} must match [a-z][a-z0-9_-]* (at most 40 characters)")
        if self.name in BUILTIN_KINDS:
            raise InvalidArgument(f"name={self.name!r} is a built-in provider kind; pick another name")
        routes = tuple(self.routes) if isinstance(self.routes, Iterable) else ()
        if not routes or not all(isinstance(r, EffectRoute) for r in routes):
            raise InvalidArgument(f"routes={self.routes!r} must be a non-empty tuple of EffectRoute")
        object.__setattr__(self, "routes", routes)
        seen: set[tuple[str, str]] = set()
        for r in routes:
            for route in ((r.method, r.path), *((("GET", r.status_path),) if r.status_path else ())):
                if route in seen:
                    raise InvalidArgument(f"routes: {route[0]} {route[1]} is declared twice in service {self.name!r}")
                seen.add(route)
        ops = [r.op for r in routes]
        if len(set(ops)) != len(ops):
            raise InvalidArgument(f"routes: op names {ops} must be distinct in service {self.name!r}")

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON-ready data (what the server process reads back)."""
        return {"name": self.name, "routes": [r.to_json() for r in self.routes]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServiceSpec:
        """Inverse of :meth:`to_json`; raises InvalidArgument (or KeyError/TypeError on a
        malformed document)."""
        return cls(d["name"], tuple(EffectRoute.from_json(r) for r in d["routes"]))

    def route(self, op: str) -> EffectRoute:
        """The route whose ledger op is ``op``; KeyError naming the known ones."""
        for r in self.routes:
            if r.op == op:
                return r
        raise KeyError(f"op={op!r} is not one of service {self.name!r}'s ({', '.join(r.op for r in self.routes)})")


def workload_services(workload: Any) -> dict[str, ServiceSpec]:
    """The services ``workload`` declares (its ``services`` attribute, default none), by
    name. Raises :class:`InvalidArgument` when one is not a :class:`ServiceSpec`, two
    share a name, or one is missing from ``workload.providers`` (which lists what the
    harness starts, reads and proxies)."""
    declared = getattr(workload, "services", ()) or ()
    out: dict[str, ServiceSpec] = {}
    for i, spec in enumerate(declared):
        if not isinstance(spec, ServiceSpec):
            raise InvalidArgument(f"workload.services[{i}]={spec!r} must be a ServiceSpec")
        if spec.name in out:
            raise InvalidArgument(f"workload.services: {spec.name!r} is declared twice")
        if spec.name not in tuple(getattr(workload, "providers", ())):
            raise InvalidArgument(f"workload.services: {spec.name!r} must also be listed in workload.providers "
                                  f"({', '.join(getattr(workload, 'providers', ())) or 'empty'})")
        out[spec.name] = spec
    return out
