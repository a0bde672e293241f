"""Async clients for the provider servers, used by tools inside worker processes
(docs/adapters.md, "The provider client API").

Every function takes an :class:`aiohttp.ClientSession` (the caller owns it), the
provider's base URL (``"http://127.0.0.1:PORT"``, as in ``Providers.urls[kind]`` or a
worker's ``Environment.providers[kind]``) and, for requests that count as a worker's
in-flight work, ``worker_id``: sent as the ``X-Crashmatrix-Worker`` header so the
harness can wait, after killing that worker, until none of its requests is still
running at the provider. :class:`Resources` is what the reference adapter hands a
workload's ``build_agent`` (the session, the URLs, the worker id) for its tools.
A declared service (:mod:`.declared`) is called with :func:`request_effect` and probed
with :func:`get_status`.

Money is integer minor units (``amount=1999`` is 19.99), never floats.

Outcomes mirror Jepsen's ok / fail / info:

- ok: the function returns the provider's answer (a dict). A declined card is an
  answer, not an exception: the dict has ``"status": "declined"``.
- fail: :class:`DefiniteProviderError` -- the provider answered 4xx and applied
  nothing (bad input, unknown charge, idempotency key reused with other fields);
  :class:`ProviderUnreachableError` (a subclass) when no connection could be made, so
  nothing was sent.
- info: :class:`AmbiguousProviderError` -- connection reset or closed mid-request,
  timeout, 5xx, or an unreadable answer: the effect may or may not have been applied;
  ask the probe (``get_charge_status`` ...), which never raises.

Cancellation (``asyncio.CancelledError``) is never wrapped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
from yarl import URL

__all__ = [
    "WORKER_HEADER",
    "PROBE_TIMEOUT_S",
    "Resources",
    "ProbeResult",
    "ProviderError",
    "DefiniteProviderError",
    "ProviderUnreachableError",
    "AmbiguousProviderError",
    "charge",
    "refund",
    "send_mail",
    "complete",
    "get_charge_status",
    "get_refund_status",
    "get_mail_status",
    "create_document",
    "get_document_status",
    "request_effect",
    "get_status",
    "set_delay",
    "read_ledger",
    "inflight",
    "health",
    "wait_inflight_zero",
]

WORKER_HEADER = "X-Crashmatrix-Worker"
_RETRIED_BY_AIOHTTP = frozenset({"PUT", "DELETE"})  # the effect methods in aiohttp's IDEMPOTENT_METHODS

Outcome = Literal["applied", "not_applied", "unknown"]

PROBE_TIMEOUT_S = 10.0
"""A probe's own bound (seconds): past it the probe answers ``cannot_tell`` instead of
waiting on a dead link for the session's default 300 s (docs/probes.md)."""


@dataclass
class Resources:
    """Per-worker clients: one HTTP session, the provider URLs (kind -> base URL, the
    worker's ``Environment.providers``), the worker id header, the conversation, the
    probes' bound in seconds (the probe certifier's sandbox sets a short one), and
    ``deadline_s``: how long one provider call (model, effect or probe) may take before
    it counts as ambiguous (None: the session's own timeout; the network section sets
    one, which then bounds the probes too). The reference adapter builds one per worker
    and passes it to ``workload.build_agent(conversation, resources)``; tools find it as
    ``ctx.resources``."""

    session: aiohttp.ClientSession
    urls: dict[str, str]
    worker_id: str
    conversation: str
    probe_timeout_s: float = PROBE_TIMEOUT_S
    deadline_s: float | None = None

    @property
    def probe_bound_s(self) -> float:
        """A probe's timeout: its own bound, or the call deadline when that is shorter."""
        return self.probe_timeout_s if self.deadline_s is None else min(self.deadline_s, self.probe_timeout_s)


@dataclass(frozen=True)
class ProbeResult:
    """What a probe learned about an idempotency key.

    ``outcome``: ``"applied"`` (the provider has a row for the key; ``result`` is the
    body the original request was answered with -- a declined charge is applied, with
    ``result["status"] == "declined"``), ``"not_applied"`` (the provider says it has no
    such key; ``result`` is None) or ``"unknown"`` (the provider could not be asked or
    answered something else; ``error`` says what, and is ignored by ``==``).
    ``transient`` (with ``"unknown"``): the provider could not be asked at all (no
    connection, a broken or timed-out request, a 5xx), so asking again may decide;
    False when it answered and the answer does not decide.
    """

    outcome: Outcome
    result: dict[str, Any] | None = None
    error: str | None = field(default=None, compare=False)
    transient: bool = field(default=False, compare=False)


class ProviderError(Exception):
    """A provider call that did not return an answer.

    ``url``: the request URL; ``status``: the HTTP status, or None when no answer came;
    ``body``: the decoded JSON answer, or None; ``retryable``: whether repeating the
    call with the same idempotency key is safe and may succeed.
    """

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status: int | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.body = body


class DefiniteProviderError(ProviderError):
    """The effect was definitely not applied: the provider refused it with a 4xx (other
    than a card decline). ``status`` and ``body`` hold the answer; ``body["error"]``
    names the field at fault."""


class ProviderUnreachableError(DefiniteProviderError):
    """No connection to the provider could be made, so nothing was sent; retrying with
    the same key is safe."""

    retryable = True


class AmbiguousProviderError(ProviderError):
    """The effect may or may not have been applied (connection reset, timeout, 5xx,
    garbled answer). Resolve it with the probe; retrying with the same key is safe."""

    retryable = True


def _base(base_url: str) -> str:
    return base_url.rstrip("/")


def _headers(worker_id: str | None) -> dict[str, str]:
    return {WORKER_HEADER: worker_id} if worker_id else {}


def _timeout(timeout: float | None) -> dict[str, Any]:
    return {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}


def _metadata(run_id: str, delay_ms: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"run_id": run_id}
    if delay_ms is not None:
        meta["delay_ms"] = delay_ms
    return meta


async def _call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json_body: dict[str, Any] | None = None,
    worker_id: str | None = None,
    timeout: float | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any] | None]:
    """Send one request; return ``(status, decoded JSON body or None)``.

    Raises ProviderUnreachableError when the connection could not be made and
    AmbiguousProviderError for any failure after that."""
    try:
        async with session.request(
            method,
            URL(url, encoded=True),
            json=json_body,
            headers={**(headers or {}), **_headers(worker_id)},
            **_timeout(timeout),
        ) as resp:
            status = resp.status
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
    except aiohttp.ClientConnectorError as exc:
        if method in _RETRIED_BY_AIOHTTP:
            # aiohttp sends an idempotent request a second time when the connection of
            # the first attempt breaks (RFC 9112 9.3.1.1): a connect error may then
            # follow an attempt that reached the provider. Found by the probe
            # certifier (docs/probes.md, window provider.restart.after_apply).
            raise AmbiguousProviderError(
                f"{method} {url}: cannot connect ({exc}) after a possible first attempt;"
                " the effect may have been applied", url=url) from exc
        raise ProviderUnreachableError(f"{method} {url}: cannot connect ({exc})", url=url) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        detail = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        raise AmbiguousProviderError(
            f"{method} {url}: no answer ({detail}); the effect may have been applied", url=url
        ) from exc
    return status, body if isinstance(body, dict) else None


async def _effect(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    worker_id: str | None,
    timeout: float | None,
    declinable: bool = False,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    status, answer = await _call(
        session, method, url, json_body=body, worker_id=worker_id, timeout=timeout, headers=headers
    )
    if 200 <= status < 300 and answer is not None:
        return answer
    if declinable and status == 402 and answer is not None and answer.get("status") == "declined":
        return answer
    error = (answer or {}).get("error", "no JSON body")
    if 400 <= status < 500 and answer is not None:
        raise DefiniteProviderError(
            f"{method} {url}: {status} {error}", url=url, status=status, body=answer
        )
    raise AmbiguousProviderError(
        f"{method} {url}: {status} {error}; the effect may have been applied",
        url=url,
        status=status,
        body=answer,
    )


# -- effects ----------------------------------------------------------------------------


async def charge(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    key: str,
    amount: int,
    currency: str,
    card: str,
    run_id: str,
    worker_id: str | None = None,
    delay_ms: int | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Charge ``amount`` minor units of ``currency`` (``"eur"``) to ``card``, once per
    ``key`` (the idempotency key).

    Returns ``{"charge_id": "ch_<16 hex>", "status": "succeeded", "amount", "currency",
    "card"}``, or for a declined card (ending in ``0002``) ``{"error": "card_declined",
    "charge_id", "status": "declined", ...}``. The charge id is derived from the key, so
    a repeat with the same key returns the same answer. ``delay_ms`` asks the provider
    to wait that long before applying (tests use it to hold the request in flight);
    ``timeout`` (seconds) overrides the session's.
    """
    body = {
        "idempotency_key": key,
        "amount": amount,
        "currency": currency,
        "card": card,
        "metadata": _metadata(run_id, delay_ms),
    }
    return await _effect(
        session, _base(base_url) + "/charges", body,
        worker_id=worker_id, timeout=timeout, declinable=True,
    )


async def refund(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    key: str,
    charge_id: str,
    amount: int,
    run_id: str,
    worker_id: str | None = None,
    delay_ms: int | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Refund ``amount`` minor units of ``charge_id``, once per ``key``.

    Returns ``{"refund_id": "re_<16 hex>", "status": "succeeded", "charge_id", "amount",
    "currency"}``. An unknown charge (404), a declined charge or an amount above what
    is left to refund (400) raise :class:`DefiniteProviderError`.
    """
    body = {
        "idempotency_key": key,
        "charge_id": charge_id,
        "amount": amount,
        "metadata": _metadata(run_id, delay_ms),
    }
    return await _effect(
        session, _base(base_url) + "/refunds", body, worker_id=worker_id, timeout=timeout
    )


async def send_mail(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    key: str,
    to: str,
    subject: str,
    body: str,
    run_id: str,
    worker_id: str | None = None,
    delay_ms: int | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Send one mail, once per ``key``.

    Returns ``{"message_id": "msg_<16 hex>", "status": "sent", "to", "subject"}``.
    """
    payload = {
        "idempotency_key": key,
        "to": to,
        "subject": subject,
        "body": body,
        "metadata": _metadata(run_id, delay_ms),
    }
    return await _effect(
        session, _base(base_url) + "/messages", payload, worker_id=worker_id, timeout=timeout
    )


async def complete(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    script: str,
    conversation: str,
    node_id: str,
    messages: list[Any],
    run_id: str,
    worker_id: str | None = None,
    delay_ms: int | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One billed model turn: the provider calls ``script`` (``"pkg.module:function"``)
    with ``(conversation, messages)``.

    Returns ``{"id": "cmpl_<12 hex>", "content": str, "tool_calls": [{"id":
    "call_<12 hex>", "name": str, "arguments": dict}], "usage": {"tokens": int}}``.
    Tool-call ids are fresh on every call, as a real model's are. Every call is billed
    to ``(run_id, node_id)``, repeats included. An unimportable script raises
    :class:`DefiniteProviderError`; a script that raises gives a 500, i.e.
    :class:`AmbiguousProviderError`.
    """
    payload = {
        "script": script,
        "conversation": conversation,
        "node_id": node_id,
        "messages": messages,
        "metadata": _metadata(run_id, delay_ms),
    }
    return await _effect(
        session, _base(base_url) + "/v1/complete", payload, worker_id=worker_id, timeout=timeout
    )


# -- probes -----------------------------------------------------------------------------


async def _probe(
    session: aiohttp.ClientSession,
    base_url: str,
    collection: str,
    key: str,
    worker_id: str | None,
    timeout: float | None,
) -> ProbeResult:
    url = f"{_base(base_url)}/{collection}/by-key/{quote(key, safe='')}"
    return await _probe_url(session, url, worker_id, timeout)


async def _probe_url(
    session: aiohttp.ClientSession, url: str, worker_id: str | None, timeout: float | None
) -> ProbeResult:
    """GET ``url``: 200 with a body is applied, 404 ``not_found`` is not applied, any
    other answer or no answer is unknown."""
    try:
        status, body = await _call(session, "GET", url, worker_id=worker_id, timeout=timeout)
    except ProviderError as exc:
        return ProbeResult("unknown", None, str(exc), transient=True)
    if status == 200 and body is not None:
        return ProbeResult("applied", body)
    if status == 404 and body is not None and body.get("error") == "not_found":
        return ProbeResult("not_applied", None)
    return ProbeResult("unknown", None, f"GET {url}: unexpected answer {status} {body!r}", transient=status >= 500)


async def get_charge_status(
    session: aiohttp.ClientSession,
    base_url: str,
    key: str,
    *,
    worker_id: str | None = None,
    timeout: float | None = None,
) -> ProbeResult:
    """Did the charge with idempotency key ``key`` happen? Never raises a ProviderError;
    ``result`` is the body the original charge got (declined charges included)."""
    return await _probe(session, base_url, "charges", key, worker_id, timeout)


async def get_refund_status(
    session: aiohttp.ClientSession,
    base_url: str,
    key: str,
    *,
    worker_id: str | None = None,
    timeout: float | None = None,
) -> ProbeResult:
    """Did the refund with idempotency key ``key`` happen? (see :func:`get_charge_status`)"""
    return await _probe(session, base_url, "refunds", key, worker_id, timeout)


async def get_mail_status(
    session: aiohttp.ClientSession,
    base_url: str,
    key: str,
    *,
    worker_id: str | None = None,
    timeout: float | None = None,
) -> ProbeResult:
    """Was the mail with idempotency key ``key`` sent? (see :func:`get_charge_status`)"""
    return await _probe(session, base_url, "messages", key, worker_id, timeout)


# -- docstore ----------------------------------------------------------------------------


def _doc_url(base_url: str, collection: str, doc_id: str) -> str:
    return f"{_base(base_url)}/collections/{quote(collection, safe='')}/docs/{quote(doc_id, safe='')}"


async def create_document(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    collection: str,
    doc_id: str,
    document: dict[str, Any],
    run_id: str,
    worker_id: str | None = None,
    delay_ms: int | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Create the row ``collection/doc_id`` of the document store, once: the client
    names the row, so the id is the idempotency key (ids: 1-128 of ``[A-Za-z0-9_.-]``).

    Returns ``{"collection", "doc_id", "document", "rev": "1-<16 hex>"}``; a repeat
    with the same document returns the same answer; the id taken by another document
    raises :class:`DefiniteProviderError` (409)."""
    url = _doc_url(base_url, collection, doc_id)
    body = {"document": document, "metadata": _metadata(run_id, delay_ms)}
    return await _effect(session, url, body, worker_id=worker_id, timeout=timeout, method="PUT")


async def get_document_status(
    session: aiohttp.ClientSession,
    base_url: str,
    collection: str,
    doc_id: str,
    *,
    worker_id: str | None = None,
    timeout: float | None = None,
) -> ProbeResult:
    """Read the row ``collection/doc_id`` back: applied with the create's answer, not
    applied (404), or unknown. Never raises a ProviderError."""
    return await _probe_url(session, _doc_url(base_url, collection, doc_id), worker_id, timeout)


# -- declared services ---------------------------------------------------------------------


async def request_effect(
    session: aiohttp.ClientSession,
    base_url: str,
    path: str,
    body: dict[str, Any],
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    worker_id: str | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One request with an effect to a declared service (:mod:`.declared`) or any
    service with the same contract: ``method`` (POST, PUT, PATCH) ``base_url + path``
    with the JSON object ``body`` and extra ``headers`` (the idempotency key, when the
    service reads it from a header); the worker header is added.

    Returns the answer (a 2xx with a JSON object body). Raises
    :class:`DefiniteProviderError` for a 4xx with a JSON body (bad input, 409: the key
    reused with other fields; nothing applied), :class:`ProviderUnreachableError` when
    no connection could be made, :class:`AmbiguousProviderError` for everything else
    (reset, timeout, 5xx, unreadable answer: it may have been applied; ask
    :func:`get_status`)."""
    return await _effect(session, _base(base_url) + path, body, worker_id=worker_id, timeout=timeout,
                         method=method, headers=headers)


async def get_status(
    session: aiohttp.ClientSession,
    base_url: str,
    status_path: str,
    key: str,
    *,
    worker_id: str | None = None,
    timeout: float | None = None,
) -> ProbeResult:
    """Ask a declared service's status route whether the effect with idempotency key
    ``key`` was applied: ``status_path`` as declared (``"/v2/tickets/by-key/{key}"``),
    the key quoted into it. 200 with a JSON body is applied (``result``: the original
    answer), 404 ``not_found`` not applied, anything else unknown (``transient`` when
    it could not be asked). Never raises a ProviderError."""
    url = _base(base_url) + status_path.replace("{key}", quote(key, safe=""))
    return await _probe_url(session, url, worker_id, timeout)


async def set_delay(
    session: aiohttp.ClientSession, base_url: str, delay_ms: int, *, timeout: float | None = 5.0
) -> None:
    """Set the provider's default delay before applying (``POST /admin/delay``): the
    certifier's "provider slow" knob. Raises ProviderError."""
    url = _base(base_url) + "/admin/delay"
    status, body = await _call(session, "POST", url, json_body={"delay_ms": delay_ms}, timeout=timeout)
    if status != 200:
        raise DefiniteProviderError(f"POST {url}: {status} {body!r}", url=url, status=status, body=body)


# -- harness-side reads -------------------------------------------------------------------


async def _read(
    session: aiohttp.ClientSession, url: str, timeout: float | None
) -> dict[str, Any]:
    status, body = await _call(session, "GET", url, timeout=timeout)
    if status != 200 or body is None:
        cls = DefiniteProviderError if 400 <= status < 500 else AmbiguousProviderError
        raise cls(f"GET {url}: {status} {body!r}", url=url, status=status, body=body)
    return body


async def read_ledger(
    session: aiohttp.ClientSession,
    base_url: str,
    run_id: str | None,
    *,
    timeout: float | None = None,
) -> list[dict[str, Any]]:
    """The provider ledger's rows for ``run_id`` (all rows when None), in insertion
    order. Row shape: :mod:`crashmatrix.harness.services.providers.ledger`."""
    return await _rows(session, base_url, "/ledger", run_id, timeout)


async def _rows(session: aiohttp.ClientSession, base_url: str, path: str, run_id: str | None,
                timeout: float | None) -> list[dict[str, Any]]:
    """``GET path[?run_id=]``'s ``rows``."""
    url = _base(base_url) + path
    if run_id is not None:
        url += "?run_id=" + quote(run_id, safe="")
    return list((await _read(session, url, timeout))["rows"])


async def read_refusals(
    session: aiohttp.ClientSession,
    base_url: str,
    run_id: str | None,
    *,
    timeout: float | None = None,
) -> list[dict[str, Any]]:
    """The requests the provider answered 4xx or 5xx for ``run_id`` (all when None), in
    arrival order: ``{"seq", "run_id", "method", "path", "http_status", "error"}``."""
    return await _rows(session, base_url, "/refusals", run_id, timeout)


async def inflight(
    session: aiohttp.ClientSession,
    base_url: str,
    worker_id: str | None = None,
    *,
    timeout: float | None = None,
) -> int:
    """Requests of ``worker_id`` still running at the provider (all workers' when None)."""
    url = _base(base_url) + "/inflight"
    if worker_id is not None:
        url += "?worker=" + quote(worker_id, safe="")
    return int((await _read(session, url, timeout))["inflight"])


async def health(
    session: aiohttp.ClientSession, base_url: str, *, timeout: float | None = 2.0
) -> str | None:
    """The provider's kind (``"payment"`` ...) if it answers ``/health``, else None."""
    try:
        body = await _read(session, _base(base_url) + "/health", timeout)
    except ProviderError:
        return None
    return body.get("kind")


async def wait_inflight_zero(
    session: aiohttp.ClientSession,
    base_url: str,
    worker_id: str | None,
    *,
    deadline_s: float = 30.0,
    poll_s: float = 0.01,
) -> None:
    """Poll :func:`inflight` until ``worker_id`` has no request running at the provider;
    raise TimeoutError after ``deadline_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while await inflight(session, base_url, worker_id) > 0:
        if loop.time() >= end:
            raise TimeoutError(f"{base_url}: worker {worker_id!r} still has requests in flight")
        await asyncio.sleep(poll_s)
