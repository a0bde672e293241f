"""Provider servers: payment, mail, a scripted, billed model, a document store, and the
services workloads declare (:mod:`.declared`), each in its own process.

Run one with::

    python -m crashmatrix.harness.services.providers.server --kind payment|mail|model|docstore \\
        --ledger PATH [--host 127.0.0.1] [--port 0] [--delay-ms N] [--synchronous NORMAL]
    python -m crashmatrix.harness.services.providers.server --service SPEC.json --ledger PATH ...

(``SPEC.json``: a :class:`~.declared.ServiceSpec` as :meth:`~.declared.ServiceSpec.to_json`
writes it; the launcher writes it next to the ledger.)

It prints exactly one line ``READY <port>`` on stdout once it listens (stdout is then
pointed at /dev/null, so nothing else can ever appear there), logs to stderr, and exits
0 on SIGTERM or SIGINT after letting in-flight requests finish (at most 2 s).

Endpoints common to every kind:

- ``GET /health`` -> ``{"status": "ok", "kind": KIND}``
- ``GET /inflight`` -> ``{"inflight": total, "workers": {ID: n}}``;
  ``GET /inflight?worker=ID`` -> ``{"worker": ID, "inflight": n}``. Requests are counted
  per ``X-Crashmatrix-Worker`` header from the moment their headers are parsed until
  their handler returns. Handler cancellation is off, so a request whose client died
  keeps running (and keeps counting) until it has applied. The endpoint first yields a
  few event-loop turns so that requests already in the socket buffers are counted.
- ``GET /ledger[?run_id=R]`` -> ``{"rows": [...]}`` in insertion order (row shape in
  :mod:`.ledger`).
- ``GET /refusals[?run_id=R]`` -> ``{"rows": [{"seq", "run_id", "method", "path",
  "http_status", "error"}, ...]}``: every POST or PUT answered 4xx or 5xx (bad input,
  a declined card, a key reused, a script that raised), ``run_id`` from the body's
  metadata (None when it had none), in arrival order.

Payment: ``POST /charges``, ``POST /refunds``, ``GET /charges/by-key/{key}``,
``GET /refunds/by-key/{key}``. Mail: ``POST /messages``, ``GET /messages/by-key/{key}``.
Model: ``POST /v1/complete``. Docstore (a document store whose rows the client
names, for the probe certifier's read-back example): ``PUT
/collections/{collection}/docs/{doc_id}``, ``GET /collections/{collection}/docs/{doc_id}``.
Bodies and answers are documented on the handlers. A declared service: the routes of
its spec (:mod:`.declared`), with the same deduplication, conflicts and bad-input rules.

``POST /admin/delay`` ``{"delay_ms": int}`` -> ``{"delay_ms": int}`` sets the default
delay (``--delay-ms``) of later requests, so a certifier can make a running provider
slow and fast again without restarting it.

Every POST body carries ``"metadata": {"run_id": str, "delay_ms": int (optional)}``.
The delay (default ``--delay-ms``) is slept *before* the request is applied, so a test
can hold a request in flight. Keyed requests are deduplicated on the idempotency key:
the check and the insert happen with no await between them, so two requests with one
key, even concurrent ones, apply once and get the same answer (header
``Idempotent-Replayed: true`` on the repeats). A key reused with different fields gets
409. Bad input gets 400 ``{"error": "<field>: ...", "field": "<field>"}`` and never
leaves a row; the server never answers 500 to junk.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import fcntl
import hashlib
import importlib
import inspect
import json
import logging
import os
import re
import signal
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from .declared import BUILTIN_KINDS, EffectRoute, ServiceSpec, derive_service_id
from .ledger import Decision, Ledger, NotRecorded

__all__ = ["KINDS", "WORKER_HEADER", "build_app", "serve", "main", "derive_id"]

KINDS = BUILTIN_KINDS
WORKER_HEADER = "X-Crashmatrix-Worker"
MAX_KEY_LEN = 255
MAX_AMOUNT = 10**12  # minor units; far above any realistic charge, far below int64
MAX_DELAY_MS = 600_000
SHUTDOWN_GRACE_S = 2.0
CLIENT_MAX_SIZE = 32 * 1024 * 1024  # model requests carry the whole transcript

log = logging.getLogger("crashmatrix.providers")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # docstore collection and document ids
_SCRIPT_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def derive_id(prefix: str, key: str) -> str:
    """Provider-side id derived from an idempotency key: ``prefix + sha256(key)[:16]``."""
    return prefix + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


class BadRequest(Exception):
    """Invalid input: answered 400 ``{"error": "<field>: <message>", "field": field}``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


# -- validation ---------------------------------------------------------------------


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


async def _read_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadRequest("body", f"invalid JSON ({type(exc).__name__}: {_short(str(exc))})") from None
    if not isinstance(body, dict):
        raise BadRequest("body", f"must be a JSON object, got {type(body).__name__}")
    return body


def _str(body: dict[str, Any], field: str, *, max_len: int | None = None) -> str:
    if field not in body:
        raise BadRequest(field, "missing")
    value = body[field]
    if not isinstance(value, str) or not value:
        raise BadRequest(field, f"must be a non-empty string, got {_short(value)}")
    if max_len is not None and len(value) > max_len:
        raise BadRequest(field, f"must be at most {max_len} characters, got {len(value)}")
    return value


def _text(body: dict[str, Any], field: str) -> str:
    """A string that may be empty (a mail body)."""
    return _typed(body, field, str, "a string")


def _typed(body: dict[str, Any], field: str, kind: type, label: str) -> Any:
    """``body[field]``, which must be an instance of ``kind`` (``label`` names it)."""
    if field not in body:
        raise BadRequest(field, "missing")
    value = body[field]
    if not isinstance(value, kind):
        raise BadRequest(field, f"must be {label}, got {_short(value)}")
    return value


def _amount(body: dict[str, Any], field: str = "amount") -> int:
    if field not in body:
        raise BadRequest(field, "missing")
    value = body[field]
    if type(value) is not int or value < 0:
        raise BadRequest(
            field, f"must be a non-negative integer in minor units, got {_short(value)}"
        )
    if value > MAX_AMOUNT:
        raise BadRequest(field, f"must be at most {MAX_AMOUNT}, got {value}")
    return value


def _key(body: dict[str, Any]) -> str:
    return _str(body, "idempotency_key", max_len=MAX_KEY_LEN)


def _metadata(body: dict[str, Any], default_delay_ms: int) -> tuple[str, int]:
    """Return ``(run_id, delay_ms)`` from ``body["metadata"]``."""
    if "metadata" not in body:
        raise BadRequest("metadata", "missing (must carry run_id)")
    meta = body["metadata"]
    if not isinstance(meta, dict):
        raise BadRequest("metadata", f"must be an object, got {_short(meta)}")
    run_id = meta.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise BadRequest("metadata.run_id", f"must be a non-empty string, got {_short(run_id)}")
    delay = meta.get("delay_ms", default_delay_ms)
    if type(delay) is not int or not 0 <= delay <= MAX_DELAY_MS:
        raise BadRequest(
            "metadata.delay_ms", f"must be an integer in 0..{MAX_DELAY_MS}, got {_short(delay)}"
        )
    return run_id, delay


async def _delay(delay_ms: int) -> None:
    if delay_ms > 0:
        await asyncio.sleep(delay_ms / 1000)


def _answer(applied: Any) -> web.Response:
    headers = {"Idempotent-Replayed": "true"} if applied.replayed else None
    return _json(applied.body, status=applied.http_status, headers=headers)


# -- the application ------------------------------------------------------------------


class _Provider:
    def __init__(self, kind: str, ledger: Ledger, default_delay_ms: int) -> None:
        self.kind = kind
        self.ledger = ledger
        self.default_delay_ms = default_delay_ms
        self.inflight: collections.Counter[str | None] = collections.Counter()
        self.scripts: dict[str, Callable[..., Any]] = {}

    # middlewares ---------------------------------------------------------------

    @web.middleware
    async def count_inflight(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path == "/inflight":
            return await handler(request)
        worker = request.headers.get(WORKER_HEADER)
        self.inflight[worker] += 1
        try:
            return await handler(request)
        finally:
            self.inflight[worker] -= 1
            if self.inflight[worker] <= 0:
                del self.inflight[worker]

    @web.middleware
    async def record_refusals(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Keep every POST or PUT answered >= 400 in the ledger's refusals (after
        :meth:`json_errors` made the answer), with the run id of its metadata."""
        response = await handler(request)
        if response.status >= 400 and request.method in ("POST", "PUT") and not request.path.startswith("/admin/"):
            run_id, error = None, ""
            with contextlib.suppress(Exception):  # the body may be what was refused
                meta = json.loads(await request.read()).get("metadata") or {}
                run_id = meta.get("run_id") if isinstance(meta.get("run_id"), str) else None
            with contextlib.suppress(Exception):
                body = json.loads(response.body)  # type: ignore[attr-defined,arg-type]
                error = str(body.get("error") or body)
            self.ledger.refuse(run_id, request.method, request.path, response.status, error or f"HTTP {response.status}")
        return response

    async def get_refusals(self, request: web.Request) -> web.Response:
        return _json({"rows": self.ledger.refusals(request.query.get("run_id"))})

    @web.middleware
    async def json_errors(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as exc:
            return _json({"error": str(exc), "field": exc.field}, status=400)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            # Never "not_found": that word is reserved for a probe's "no such key".
            reason = "no_such_route" if exc.status == 404 else exc.reason.lower().replace(" ", "_")
            return _json(
                {"error": f"{reason}: {request.method} {request.path}"},
                status=exc.status,
                headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"},
            )
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # a bug in the server, never the client's input
            log.exception("internal error on %s %s", request.method, request.path)
            return _json({"error": f"internal: {type(exc).__name__}: {exc}"}, status=500)

    # common endpoints ------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return _json({"status": "ok", "kind": self.kind})

    async def get_inflight(self, request: web.Request) -> web.Response:
        # Let requests whose bytes are already in a socket buffer (a just-killed
        # worker's) be parsed and enter count_inflight before we answer.
        for _ in range(3):
            await asyncio.sleep(0)
        worker = request.query.get("worker")
        if worker is not None:
            return _json({"worker": worker, "inflight": self.inflight.get(worker, 0)})
        return _json(
            {
                "inflight": sum(self.inflight.values()),
                "workers": {w: n for w, n in self.inflight.items() if w is not None},
            }
        )

    async def post_admin_delay(self, request: web.Request) -> web.Response:
        """``{"delay_ms": int in 0..MAX_DELAY_MS}`` -> ``{"delay_ms": int}``: the default
        delay of requests parsed from now on (a request already sleeping keeps its own)."""
        body = await _read_object(request)
        delay = body.get("delay_ms")
        if type(delay) is not int or not 0 <= delay <= MAX_DELAY_MS:
            raise BadRequest("delay_ms", f"must be an integer in 0..{MAX_DELAY_MS}, got {_short(delay)}")
        self.default_delay_ms = delay
        return _json({"delay_ms": delay})

    async def get_ledger(self, request: web.Request) -> web.Response:
        run_id = request.query.get("run_id")
        return _json({"rows": self.ledger.rows(run_id)})

    def probe(self, op: str) -> _Handler:
        async def handler(request: web.Request) -> web.Response:
            key = request.match_info["key"]
            row = self.ledger.get(op, key)
            if row is None:
                return _json({"error": "not_found", "key": key}, status=404)
            return _json(row["result"])

        return handler

    # payment ---------------------------------------------------------------------

    async def post_charge(self, request: web.Request) -> web.Response:
        """``{"idempotency_key", "amount": int minor units, "currency": "eur", "card",
        "metadata"}`` -> 200 ``{"charge_id", "status": "succeeded", "amount",
        "currency", "card"}``; a card ending in 0002 -> 402 ``{"error":
        "card_declined", "charge_id", "status": "declined", ...}`` (recorded, deduped)."""
        body = await _read_object(request)
        key = _key(body)
        amount = _amount(body)
        currency = _str(body, "currency")
        if not re.fullmatch(r"[a-z]{3}", currency):
            raise BadRequest("currency", f"must be a lowercase ISO 4217 code, got {_short(currency)}")
        card = _str(body, "card", max_len=64)
        run_id, delay_ms = _metadata(body, self.default_delay_ms)
        await _delay(delay_ms)
        fields = {"amount": amount, "currency": currency, "card": card}
        charge_id = derive_id("ch_", key)

        def decide() -> Decision:
            result = {"charge_id": charge_id, "amount": amount, "currency": currency, "card": card}
            if card.endswith("0002"):
                result.update(error="card_declined", status="declined")
                return Decision("declined", 402, result, ref=charge_id, amount=amount)
            result["status"] = "succeeded"
            return Decision("succeeded", 200, result, ref=charge_id, amount=amount)

        # No await between here and the return: check-and-insert is atomic.
        return _answer(self.ledger.apply_once("charge", key, run_id, fields, decide))

    async def post_refund(self, request: web.Request) -> web.Response:
        """``{"idempotency_key", "charge_id", "amount", "metadata"}`` -> 200
        ``{"refund_id", "status": "succeeded", "charge_id", "amount", "currency"}``;
        unknown charge -> 404, declined charge or amount above what is left -> 400
        (neither recorded)."""
        body = await _read_object(request)
        key = _key(body)
        charge_id = _str(body, "charge_id", max_len=64)
        amount = _amount(body)
        run_id, delay_ms = _metadata(body, self.default_delay_ms)
        await _delay(delay_ms)
        fields = {"charge_id": charge_id, "amount": amount}
        refund_id = derive_id("re_", key)

        def decide() -> Decision:
            charge = self.ledger.get_by_ref("charge", charge_id)
            if charge is None:
                raise NotRecorded(
                    404, {"error": "no_such_charge", "field": "charge_id", "charge_id": charge_id}
                )
            if charge["status"] != "succeeded":
                raise NotRecorded(
                    400,
                    {
                        "error": f"charge_id: charge {charge_id} is {charge['status']}, not refundable",
                        "field": "charge_id",
                    },
                )
            left = charge["amount"] - self.ledger.sum_amount("refund", charge_id, "succeeded")
            if amount > left:
                raise NotRecorded(
                    400,
                    {"error": f"amount: {amount} exceeds the refundable {left}", "field": "amount"},
                )
            result = {
                "refund_id": refund_id,
                "status": "succeeded",
                "charge_id": charge_id,
                "amount": amount,
                "currency": charge["request"]["currency"],
            }
            return Decision("succeeded", 200, result, ref=refund_id, parent=charge_id, amount=amount)

        return _answer(self.ledger.apply_once("refund", key, run_id, fields, decide))

    # mail ------------------------------------------------------------------------

    async def post_message(self, request: web.Request) -> web.Response:
        """``{"idempotency_key", "to", "subject", "body", "metadata"}`` -> 200
        ``{"message_id", "status": "sent", "to", "subject"}``."""
        body = await _read_object(request)
        key = _key(body)
        to = _str(body, "to", max_len=320)
        if "@" not in to:
            raise BadRequest("to", f"must be an email address, got {_short(to)}")
        subject = _text(body, "subject")
        text = _text(body, "body")
        run_id, delay_ms = _metadata(body, self.default_delay_ms)
        await _delay(delay_ms)
        fields = {"to": to, "subject": subject, "body": text}
        message_id = derive_id("msg_", key)

        def decide() -> Decision:
            result = {"message_id": message_id, "status": "sent", "to": to, "subject": subject}
            return Decision("sent", 200, result, ref=message_id)

        return _answer(self.ledger.apply_once("message", key, run_id, fields, decide))

    # docstore --------------------------------------------------------------------

    async def put_document(self, request: web.Request) -> web.Response:
        """``PUT /collections/{collection}/docs/{doc_id}`` ``{"document": {...},
        "metadata"}`` -> 200 ``{"collection", "doc_id", "document", "rev": "1-<16 hex>"}``.

        Create-only: the client names the row, so ``collection/doc_id`` is the
        idempotency key (as a CouchDB ``PUT`` or a Firestore ``create``). A repeat with
        the same document answers the stored row (``Idempotent-Replayed: true``); the
        same id with another document (or from another run) answers 409 and changes
        nothing. ``rev`` is derived from the document, so the answer is deterministic."""
        collection = _path_name(request.match_info["collection"], "collection")
        doc_id = _path_name(request.match_info["doc_id"], "doc_id")
        body = await _read_object(request)
        document = _typed(body, "document", dict, "a JSON object")
        run_id, delay_ms = _metadata(body, self.default_delay_ms)
        await _delay(delay_ms)
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
        fields = {"collection": collection, "doc_id": doc_id, "document": document}

        def decide() -> Decision:
            rev = "1-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
            result = {"collection": collection, "doc_id": doc_id, "document": document, "rev": rev}
            return Decision("created", 200, result, ref=doc_id)

        return _answer(self.ledger.apply_once("document", f"{collection}/{doc_id}", run_id, fields, decide))

    async def get_document(self, request: web.Request) -> web.Response:
        """``GET /collections/{collection}/docs/{doc_id}`` -> 200 the row as the create
        answered it, or 404 ``{"error": "not_found"}``: the read-back a probe uses."""
        collection = _path_name(request.match_info["collection"], "collection")
        doc_id = _path_name(request.match_info["doc_id"], "doc_id")
        row = self.ledger.get("document", f"{collection}/{doc_id}")
        if row is None:
            return _json({"error": "not_found", "collection": collection, "doc_id": doc_id}, status=404)
        return _json(row["result"])

    # a declared service ----------------------------------------------------------

    def declared(self, route: EffectRoute) -> _Handler:
        """The handler of one route of a declared service (rules in :mod:`.declared`)."""

        async def handler(request: web.Request) -> web.Response:
            body = await _read_object(request)
            key = _selected(request, body, route.key)
            if not isinstance(key, str) or not key or len(key) > MAX_KEY_LEN:
                raise BadRequest(route.key, f"must be a non-empty string of at most {MAX_KEY_LEN} characters, "
                                            f"got {_short(key)}")
            fields = {s.removeprefix("body:"): _selected(request, body, s) for s in route.same_effect}
            run_id = _selected(request, body, route.run_id)
            if not isinstance(run_id, str) or not run_id:
                raise BadRequest(route.run_id, f"must be a non-empty string (the run id), got {_short(run_id)}")
            await _delay(self.default_delay_ms)
            ref = derive_service_id(route.id_prefix, key)

            def decide() -> Decision:
                result = dict(route.answer)
                if route.echo:
                    result.update({name: body[name] for name in route.body_fields})
                result[route.id_field] = ref
                return Decision(route.status, route.http_status, result, ref=ref)

            # No await between here and the return: check-and-insert is atomic.
            return _answer(self.ledger.apply_once(route.op, key, run_id, fields, decide))

        return handler

    # model -----------------------------------------------------------------------

    def load_script(self, name: str) -> Callable[..., Any]:
        fn = self.scripts.get(name)
        if fn is not None:
            return fn
        if not _SCRIPT_RE.match(name):
            raise BadRequest("script", f"must be 'package.module:function', got {_short(name)}")
        module_name, _, attr_path = name.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for attr in attr_path.split("."):
                obj = getattr(obj, attr)
        except Exception as exc:  # ImportError, AttributeError, or the module raising
            raise BadRequest(
                "script", f"cannot import {name!r} ({type(exc).__name__}: {exc})"
            ) from None
        if not callable(obj):
            raise BadRequest("script", f"{name!r} is not callable")
        self.scripts[name] = obj
        return obj

    async def post_complete(self, request: web.Request) -> web.Response:
        """``{"script": "pkg.mod:fn", "conversation", "node_id", "messages": [...],
        "metadata"}`` -> 200 ``{"id": "cmpl_...", "content", "tool_calls": [{"id":
        "call_...", "name", "arguments"}], "usage": {"tokens": n}}``.

        ``fn(conversation, messages)`` (sync or async) returns ``{"content": str,
        "tool_calls": [{"name": str, "arguments": {...}}]}``; every tool call gets a
        fresh id on every request. Every request is billed (a ledger row, no dedup),
        tokens = len(content) + 10. A script that raises or returns a malformed answer
        -> 500 and no row."""
        body = await _read_object(request)
        script = _str(body, "script", max_len=300)
        conversation = _str(body, "conversation")
        node_id = _str(body, "node_id")
        messages = _typed(body, "messages", list, "a list")
        run_id, delay_ms = _metadata(body, self.default_delay_ms)
        fn = self.load_script(script)
        await _delay(delay_ms)
        try:
            out = fn(conversation, messages)
            if inspect.isawaitable(out):
                out = await out
            content, calls = _check_script_output(out)
        except Exception as exc:
            log.exception("script %s failed", script)
            return _json(
                {"error": f"script_error: {script} raised {type(exc).__name__}: {exc}"}, status=500
            )
        tokens = len(content) + 10
        result = {
            "id": "cmpl_" + uuid.uuid4().hex[:12],
            "content": content,
            "tool_calls": [
                {"id": "call_" + uuid.uuid4().hex[:12], "name": c["name"], "arguments": c["arguments"]}
                for c in calls
            ],
            "usage": {"tokens": tokens},
        }
        digest = hashlib.sha256(
            json.dumps(messages, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        fields = {
            "script": script,
            "conversation": conversation,
            "node_id": node_id,
            "n_messages": len(messages),
            "messages_sha256": digest,
        }
        self.ledger.bill(run_id, node_id, fields, result, tokens, ref=result["id"])
        return _json(result)


def _selected(request: web.Request, body: dict[str, Any], selector: str) -> Any:
    """The value a declared route's selector names (``header:``, ``path:``, ``body:``
    with dots for nested fields); BadRequest naming the selector when it is missing."""
    source, _, name = selector.partition(":")
    if source == "header":
        value: Any = request.headers.get(name)
    elif source == "path":
        value = request.match_info.get(name)
    else:
        value = body
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        raise BadRequest(selector, "missing")
    return value


def _path_name(value: str, field: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise BadRequest(field, f"must be 1-128 characters of [A-Za-z0-9_.-], got {_short(value)}")
    return value


def _check_script_output(out: Any) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(out, dict):
        raise TypeError(f"must return a dict, got {type(out).__name__}")
    content = out.get("content", "")
    if not isinstance(content, str):
        raise TypeError(f"content must be a str, got {type(content).__name__}")
    calls = out.get("tool_calls") or []
    if not isinstance(calls, list):
        raise TypeError("tool_calls must be a list")
    for i, call in enumerate(calls):
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or not isinstance(call.get("arguments", {}), dict)
        ):
            raise TypeError(f"tool_calls[{i}] must be {{'name': str, 'arguments': dict}}")
    calls = [{"name": c["name"], "arguments": c.get("arguments", {})} for c in calls]
    json.dumps(calls)  # arguments must be JSON-serialisable
    return content, calls


def build_app(kind: str, ledger: Ledger, *, delay_ms: int = 0, service: ServiceSpec | None = None) -> web.Application:
    """The aiohttp application for provider ``kind`` over ``ledger``; for a declared
    service, ``service`` is its spec and ``kind`` its name."""
    if service is not None and kind != service.name:
        raise ValueError(f"kind={kind!r} must be the declared service's name {service.name!r}")
    if service is None and kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}")
    p = _Provider(kind, ledger, delay_ms)
    app = web.Application(
        middlewares=[p.count_inflight, p.record_refusals, p.json_errors], client_max_size=CLIENT_MAX_SIZE
    )
    app["provider"] = p
    r = app.router
    r.add_get("/health", p.health)
    r.add_get("/inflight", p.get_inflight)
    r.add_get("/ledger", p.get_ledger)
    r.add_get("/refusals", p.get_refusals)
    r.add_post("/admin/delay", p.post_admin_delay)
    if kind == "payment":
        r.add_post("/charges", p.post_charge)
        r.add_post("/refunds", p.post_refund)
        r.add_get("/charges/by-key/{key:.+}", p.probe("charge"))
        r.add_get("/refunds/by-key/{key:.+}", p.probe("refund"))
    elif kind == "mail":
        r.add_post("/messages", p.post_message)
        r.add_get("/messages/by-key/{key:.+}", p.probe("message"))
    elif kind == "docstore":
        r.add_put("/collections/{collection}/docs/{doc_id}", p.put_document)
        r.add_get("/collections/{collection}/docs/{doc_id}", p.get_document)
    elif service is not None:
        for route in service.routes:
            r.add_route(route.method, route.path, p.declared(route))
            if route.status_path is not None:
                r.add_get(route.status_path.replace("{key}", "{key:.+}"), p.probe(route.op))
    else:
        r.add_post("/v1/complete", p.post_complete)
    return app


def _lock_ledger(path: Path) -> int:
    """Hold an exclusive lock next to the ledger for the life of the process."""
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"provider ledger {path} is in use by another provider process") from None
    return fd


async def serve(
    kind: str,
    ledger_path: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    delay_ms: int = 0,
    synchronous: str = "NORMAL",
    ready: Callable[[int], None] | None = None,
    service: ServiceSpec | None = None,
) -> None:
    """Serve provider ``kind`` (a declared ``service``: its name) until SIGTERM/SIGINT;
    call ``ready(port)`` once listening."""
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock_ledger(ledger_path)
    ledger = Ledger(ledger_path, synchronous=synchronous)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # handler_cancellation=False (aiohttp's default since 3.9, set explicitly): a
    # handler keeps running after its client disconnects, so a dead worker's charge
    # still lands and is still counted in flight until it has.
    runner = web.AppRunner(
        build_app(kind, ledger, delay_ms=delay_ms, service=service),
        handle_signals=False,
        handler_cancellation=False,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        site = web.SockSite(runner, sock)
        await site.start()
        if ready is not None:
            ready(sock.getsockname()[1])
        await stop.wait()
    finally:
        await runner.cleanup()
        sock.close()
        ledger.close()
        os.close(lock_fd)


def _announce(port: int) -> None:
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()
    # Keep stdout quiet from now on, whatever else gets printed.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crashmatrix.harness.services.providers.server",
        description="Run one crashmatrix provider (payment, mail, model, docstore, or a declared service).",
    )
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--kind", choices=KINDS)
    kind.add_argument("--service", type=Path, help="a declared service's spec (JSON, ServiceSpec.to_json)")
    parser.add_argument("--ledger", type=Path, required=True, help="SQLite ledger file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--delay-ms", type=int, default=0, help="default delay before applying")
    parser.add_argument(
        "--synchronous", default="NORMAL", choices=("NORMAL", "FULL", "EXTRA"), type=str.upper
    )
    args = parser.parse_args(argv)
    if not 0 <= args.delay_ms <= MAX_DELAY_MS:
        parser.error(f"--delay-ms={args.delay_ms} must be in 0..{MAX_DELAY_MS}")
    service = None
    if args.service is not None:
        try:
            service = ServiceSpec.from_json(json.loads(args.service.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--service={str(args.service)!r}: {type(exc).__name__}: {exc}")
    name = service.name if service is not None else args.kind
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format=f"[provider {name}] %(levelname)s %(message)s"
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve(
                name,
                args.ledger,
                host=args.host,
                port=args.port,
                delay_ms=args.delay_ms,
                synchronous=args.synchronous,
                ready=_announce,
                service=service,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
