"""Toxiproxy's HTTP API (spec §1), served by aiohttp's low-level server.

Routing, status codes, messages and JSON shapes are Toxiproxy 2.12's:

* gorilla/mux routing on the URL-decoded path: unknown path → 404 ``404 page not
  found\\n`` (text/plain), known path with another method → 405 with an empty body, an
  unclean path (``//x``, ``/a/../b``) → 301 to the cleaned one;
* on matched routes only: an ``X-Toxiproxy-Request-Id`` header, the ``Mozilla/`` user
  agent refusal (403 ``User agent not allowed\\n``), and a per-request timeout (503 with
  Go's HTML "Timeout" body) — the handler keeps running, as Go's does;
* errors are ``{"error":…,"status":…}`` plus a newline, sent as ``text/plain;
  charset=utf-8`` with ``X-Content-Type-Options: nosniff`` (Go's ``http.Error``), except
  ``/populate``, whose error body also carries ``"proxies"`` and is ``application/json``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from typing import Any, Awaitable, Callable
from urllib.parse import quote, unquote

from aiohttp import web

from . import _gojson as gojson
from ._gojson import GoJSONError, JObject, StructField, decode_struct
from ._link import ToxicWrapper, parse_direction
from ._proxy import AlreadyStarted, ApiError, Proxy, ProxyCollection, Runtime
from ._toxics import TOXIC_TYPES, InvalidAttributes, new_toxic, struct_fields, with_attributes

__all__ = ["ToxiproxyApi", "VERSION"]

log = logging.getLogger("crashmatrix.harness.faultproxy")

#: Reported by ``GET /version``: the Toxiproxy release whose behaviour is matched,
#: tagged (semver build metadata) so a client can tell the embedded server apart.
VERSION = "2.12.0+crashmatrix"

_TIMEOUT_BODY = b"<html><head><title>Timeout</title></head><body><h1>Timeout</h1></body></html>"

_PROXY_FIELDS = (
    StructField("name", "string"),
    StructField("listen", "string"),
    StructField("upstream", "string"),
    StructField("enabled", "bool"),
)
_POPULATE_FIELDS = _PROXY_FIELDS[:3] + (StructField("enabled", "*bool"),)
_POPULATE_ELEM = 'struct { toxiproxy.Proxy; Enabled *bool "json:\\"enabled\\"" }'
_WRAPPER_FIELDS = (
    StructField("attributes", "toxics.NoopToxic", fields=(), struct="NoopToxic"),
    StructField("name", "string"),
    StructField("type", "string"),
    StructField("stream", "string"),
    StructField("toxicity", "float32"),
)


def _attr_field(type_name: str) -> StructField:
    cls = TOXIC_TYPES[type_name]
    return StructField("attributes", f"toxics.{cls.go_name}", fields=struct_fields(cls),
                       struct=cls.go_name)


# ------------------------------------------------------------------------- routing

Handler = Callable[..., Awaitable[web.StreamResponse]]

_ROUTES: list[tuple[re.Pattern[str], dict[str, str]]] = [
    (re.compile(r"/reset\Z"), {"POST": "reset"}),
    (re.compile(r"/proxies\Z"), {"GET": "proxy_index", "POST": "proxy_create"}),
    (re.compile(r"/populate\Z"), {"POST": "populate"}),
    (re.compile(r"/proxies/(?P<proxy>[^/]+)\Z"),
     {"GET": "proxy_show", "POST": "proxy_update", "PATCH": "proxy_update", "DELETE": "proxy_delete"}),
    (re.compile(r"/proxies/(?P<proxy>[^/]+)/toxics\Z"),
     {"GET": "toxic_index", "POST": "toxic_create"}),
    (re.compile(r"/proxies/(?P<proxy>[^/]+)/toxics/(?P<toxic>[^/]+)\Z"),
     {"GET": "toxic_show", "POST": "toxic_update", "PATCH": "toxic_update", "DELETE": "toxic_delete"}),
    (re.compile(r"/version\Z"), {"GET": "version"}),
]
_METRICS_ROUTE = re.compile(r"/metrics\Z")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def clean_path(p: str) -> str:
    """gorilla/mux ``cleanPath``: Go's ``path.Clean`` keeping a trailing slash."""
    if p == "":
        return "/"
    if not p.startswith("/"):
        p = "/" + p
    parts: list[str] = []
    for seg in p.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    np = "/" + "/".join(parts)
    if p.endswith("/") and np != "/":
        np += "/"
    return np


_XID_ALPHABET = "0123456789abcdefghijklmnopqrstuv"


class _RequestIds:
    """20-character, base32hex request ids shaped like the ``xid`` ones Go emits."""

    def __init__(self) -> None:
        self._machine_pid = os.urandom(5)
        self._counter = int.from_bytes(os.urandom(3), "big")

    def next(self) -> str:
        self._counter = (self._counter + 1) & 0xFFFFFF
        raw = (int(time.time()).to_bytes(4, "big") + self._machine_pid
               + self._counter.to_bytes(3, "big"))
        n = int.from_bytes(raw, "big")  # 96 bits -> 20 base32 digits (100 bits)
        out = []
        for _ in range(20):
            out.append(_XID_ALPHABET[n & 31])
            n >>= 5
        return "".join(reversed(out))


# ----------------------------------------------------------------------- responses

def _json(status: int, obj: Any) -> web.Response:
    return web.Response(status=status, body=gojson.dumps(obj).encode(),
                        headers={"Content-Type": "application/json"})


def _error(status: int, message: str) -> web.Response:
    body = gojson.dumps({"error": message, "status": status}) + "\n"
    return web.Response(status=status, body=body.encode(), headers={
        "Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"})


def _plain(status: int, text: str) -> web.Response:
    return web.Response(status=status, body=text.encode(), headers={
        "Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"})


def _no_content() -> web.Response:
    return web.Response(status=204)


def _bad_body(exc: Exception | str) -> ApiError:
    return ApiError(400, f"bad request body: {exc}")


class _PopulateError(Exception):
    def __init__(self, status: int, message: str, proxies: list[Proxy] | None) -> None:
        super().__init__(message)
        self.status, self.message, self.proxies = status, message, proxies


# ----------------------------------------------------------------------------- api

class ToxiproxyApi:
    """The request handler: routing, middleware and one method per endpoint."""

    def __init__(self, collection: ProxyCollection, runtime: Runtime, *,
                 handler_timeout: float = 25.0) -> None:
        self.collection = collection
        self.runtime = runtime
        self.handler_timeout = handler_timeout
        self._ids = _RequestIds()
        self._background: set[asyncio.Task[Any]] = set()

    def cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raw = request.raw_path
        raw_path, sep, query = raw.partition("?")
        raw_path = raw_path.split("#", 1)[0]
        if _BAD_ESCAPE.search(raw_path):
            return _plain(400, "400 Bad Request")
        path = unquote(raw_path, errors="surrogateescape")
        cleaned = clean_path(path)
        if cleaned != path:
            location = quote(cleaned, safe="/!$&'()*+,;=:@-._~") + (sep + query if sep else "")
            return web.Response(status=301, headers={"Location": location})

        name, params = self._route(request.method, path)
        if name is None:
            return _plain(404, "404 page not found\n")
        if name == "":
            return web.Response(status=405)

        request_id = self._ids.next()
        response = await self._matched(request, name, params)
        response.headers["X-Toxiproxy-Request-Id"] = request_id
        return response

    def _route(self, method: str, path: str) -> tuple[str | None, dict[str, str]]:
        mismatch = False
        for pattern, methods in _ROUTES:
            m = pattern.match(path)
            if m is None:
                continue
            if method in methods:
                return methods[method], m.groupdict()
            mismatch = True
        if self.runtime.metrics.enabled and _METRICS_ROUTE.match(path):
            return "metrics", {}
        return ("" if mismatch else None), {}

    async def _matched(self, request: web.BaseRequest, name: str,
                       params: dict[str, str]) -> web.Response:
        if request.headers.get("User-Agent", "").startswith("Mozilla/"):
            return _plain(403, "User agent not allowed\n")
        body = await request.content.read()
        handler: Handler = getattr(self, "_h_" + name)
        task = asyncio.ensure_future(self._guarded(handler, body, **params))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        done, _ = await asyncio.wait({task}, timeout=self.handler_timeout)
        if task not in done:
            log.warning("%s %s still running after %.0f s: answering 503",
                        request.method, request.raw_path, self.handler_timeout)
            return web.Response(status=503, body=_TIMEOUT_BODY,
                                headers={"Content-Type": "text/html; charset=utf-8"})
        return task.result()

    async def _guarded(self, handler: Handler, body: bytes, **params: str) -> web.Response:
        try:
            return await handler(body, **params)
        except ApiError as exc:
            return _error(exc.status, exc.message)
        except _PopulateError as exc:
            obj = {"error": exc.message, "status": exc.status,
                   "proxies": [p.to_json() for p in exc.proxies] if exc.proxies else None}
            return web.Response(status=exc.status, body=gojson.dumps(obj).encode(),
                                headers={"Content-Type": "application/json"})
        except Exception as exc:  # a bug: report it, never hang or kill the server
            log.exception("handler %s failed", handler.__name__)
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    # -- endpoints: server --------------------------------------------------------------

    async def _h_version(self, body: bytes) -> web.Response:
        return web.Response(status=200, body=f'{{"version": "{VERSION}"}}\n'.encode(),
                            headers={"Content-Type": "application/json;charset=utf-8"})

    async def _h_metrics(self, body: bytes) -> web.Response:
        return web.Response(status=200, body=self.runtime.metrics.render().encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _h_reset(self, body: bytes) -> web.Response:
        for proxy in list(self.collection.proxies.values()):
            try:
                await proxy.start()
            except AlreadyStarted:
                pass
            async with proxy.toxics.lock:
                await proxy.toxics.reset()
        return _no_content()

    # -- endpoints: proxies -----------------------------------------------------------

    async def _h_proxy_index(self, body: bytes) -> web.Response:
        proxies = self.collection.proxies
        return _json(200, {name: proxies[name].to_json() for name in sorted(proxies)})

    async def _h_proxy_create(self, body: bytes) -> web.Response:
        fields = _decode(body, _PROXY_FIELDS, "Proxy", "toxiproxy.Proxy")
        name = fields.get("name", "")
        upstream = fields.get("upstream", "")
        if not name:
            raise ApiError(400, "missing required field: name")
        if not upstream:
            raise ApiError(400, "missing required field: upstream")
        proxy = Proxy(self.runtime, name, fields.get("listen", ""), upstream)
        await self.collection.add(proxy, fields.get("enabled", True))
        return _json(201, proxy.to_json())

    async def _h_populate(self, body: bytes) -> web.Response:
        try:
            value = gojson.decode(body)
        except GoJSONError as exc:
            raise _PopulateError(400, f"bad request body: {exc}", None) from None
        entries: list[dict[str, Any]] = []
        if value is not None:
            if not isinstance(value, list) or isinstance(value, JObject):
                raise _PopulateError(400, "bad request body: json: cannot unmarshal "
                                     f"{gojson.kind_of(value)} into Go value of type []{_POPULATE_ELEM}",
                                     None)
            first: str | None = None
            for elem in value:
                fields, err = decode_struct(elem, _POPULATE_FIELDS, struct_name="", go_type=_POPULATE_ELEM)
                first = first or err
                entries.append(fields)
            if first:
                raise _PopulateError(400, f"bad request body: {first}", None)
        for i, fields in enumerate(entries, 1):
            if not fields.get("name"):
                raise _PopulateError(400, f"missing required field: name at proxy {i}", None)
            if not fields.get("upstream"):
                raise _PopulateError(400, f"missing required field: upstream at proxy {i}", None)
        done: list[Proxy] = []
        for fields in entries:
            enabled = fields.get("enabled")
            proxy = Proxy(self.runtime, fields["name"], fields.get("listen", ""), fields["upstream"])
            try:
                done.append(await self.collection.add_or_replace(proxy, True if enabled is None else enabled))
            except ApiError as exc:
                raise _PopulateError(exc.status, exc.message, done) from None
        obj = {"proxies": [p.to_json() for p in done] if done else None}
        return web.Response(status=201, body=gojson.dumps(obj).encode(),
                            headers={"Content-Type": "application/json"})

    async def _h_proxy_show(self, body: bytes, proxy: str) -> web.Response:
        return _json(200, self.collection.get(proxy).to_json())

    async def _h_proxy_update(self, body: bytes, proxy: str) -> web.Response:
        p = self.collection.get(proxy)
        fields = _decode(body, _PROXY_FIELDS, "Proxy", "toxiproxy.Proxy")
        await p.update(fields.get("listen", p.listen), fields.get("upstream", p.upstream),
                       fields.get("enabled", p.enabled))
        return _json(200, p.to_json())

    async def _h_proxy_delete(self, body: bytes, proxy: str) -> web.Response:
        await self.collection.remove(proxy)
        return _no_content()

    # -- endpoints: toxics ----------------------------------------------------------------

    async def _h_toxic_index(self, body: bytes, proxy: str) -> web.Response:
        p = self.collection.get(proxy)
        return _json(200, [w.to_json() for w in p.toxics.toxics()])

    async def _h_toxic_show(self, body: bytes, proxy: str, toxic: str) -> web.Response:
        p = self.collection.get(proxy)
        wrapper = p.toxics.find(toxic)
        if wrapper is None:
            raise ApiError(404, "toxic not found")
        return _json(200, wrapper.to_json())

    async def _h_toxic_create(self, body: bytes, proxy: str) -> web.Response:
        p = self.collection.get(proxy)
        try:
            value = gojson.decode(body)
        except GoJSONError as exc:
            raise _bad_body(exc) from None
        fields, err = decode_struct(value, _WRAPPER_FIELDS, struct_name="ToxicWrapper",
                                    go_type="toxics.ToxicWrapper")
        if err:
            raise _bad_body(err)
        stream = fields.get("stream", "downstream")
        direction = parse_direction(stream)
        if direction is None:
            raise ApiError(400, "stream was invalid, can be either upstream or downstream")
        type_name = fields.get("type", "")
        name = fields.get("name", "") or f"{type_name}_{stream}"
        toxic = new_toxic(type_name)
        if toxic is None:
            raise ApiError(400, "invalid toxic type")
        async with p.toxics.lock:
            if p.toxics.find(name) is not None:
                raise ApiError(409, "toxic already exists")
            attrs, err = decode_struct(value, (_attr_field(type_name),), struct_name="",
                                       go_type='struct { Attributes interface {} "json:\\"attributes\\"" }')
            if err:
                raise _bad_body(err)
            toxic = with_attributes(toxic, attrs.get("attributes") or {})
            _validate(toxic)
            wrapper = ToxicWrapper(toxic, name, type_name, stream,
                                   fields.get("toxicity", 1.0), direction)
            await p.toxics.add(wrapper)
        return _json(200, wrapper.to_json())

    async def _h_toxic_update(self, body: bytes, proxy: str, toxic: str) -> web.Response:
        p = self.collection.get(proxy)
        async with p.toxics.lock:
            wrapper = p.toxics.find(toxic)
            if wrapper is None:
                raise ApiError(404, "toxic not found")
            try:
                value = gojson.decode(body)
            except GoJSONError as exc:
                raise _bad_body(exc) from None
            spec = (_attr_field(wrapper.type), StructField("toxicity", "float32"))
            fields, err = decode_struct(value, spec, struct_name="", go_type=(
                'struct { Attributes interface {} "json:\\"attributes\\""; '
                'Toxicity float32 "json:\\"toxicity\\"" }'))
            if err:
                raise _bad_body(err)
            updated = with_attributes(wrapper.toxic, fields.get("attributes") or {})
            _validate(updated)
            wrapper.toxic = updated
            wrapper.toxicity = fields.get("toxicity", wrapper.toxicity)
            await p.toxics.update(wrapper)
        return _json(200, wrapper.to_json())

    async def _h_toxic_delete(self, body: bytes, proxy: str, toxic: str) -> web.Response:
        p = self.collection.get(proxy)
        async with p.toxics.lock:
            wrapper = p.toxics.find(toxic)
            if wrapper is None:
                raise ApiError(404, "toxic not found")
            await p.toxics.remove(wrapper)
        return _no_content()


def _decode(body: bytes, fields: tuple[StructField, ...], struct_name: str,
            go_type: str) -> dict[str, Any]:
    try:
        value = gojson.decode(body)
    except GoJSONError as exc:
        raise _bad_body(exc) from None
    out, err = decode_struct(value, fields, struct_name=struct_name, go_type=go_type)
    if err:
        raise _bad_body(err)
    return out


def _validate(toxic: Any) -> None:
    try:
        toxic.validate()
    except InvalidAttributes as exc:
        raise ApiError(400, f"bad request body: invalid {toxic.type_name} attributes: {exc}") from None

