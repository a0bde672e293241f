"""Drive any Toxiproxy-compatible server (real or embedded) through ``toxiproxy-python``.

``toxiproxy-python`` 0.1.1 is the client teams already have; this module wraps it, it
does not fork it. What the wrapper adds (spec §4.1, defects a, b, c, e, g, h):

* a per-instance address: ``ToxiproxyClient("http://127.0.0.1:8474")`` — no global
  ``APIConsumer.host``; two clients can drive two servers at once, from any thread;
* a timeout on every request (the library has none, so a server-side stall hung forever);
* 5xx answers raise :class:`ToxiproxyServerError` (the library let them through: a 500 on
  create surfaced as ``KeyError: 'name'``, a failed ``enable()`` passed silently);
* toxic update (:meth:`ProxyHandle.update_toxic`), which the library lacks, and a
  :meth:`ProxyHandle.toxic` context manager that removes the toxic on exit;
* ``version()`` as text from either response format, ``running()`` that works for any
  host, and ``listen`` refreshed after ``enable()`` (the port may be chosen then).

How: the library calls ``APIConsumer.get/post/delete`` (class methods on a global). On
first use this module installs thin dispatchers on those three methods: inside a
client's call they send the request to that client's address with its timeout, through
the library's own ``validate_response`` (409 → ``ProxyExists``, 404 → ``NotFound``,
400 → ``InvalidToxic``), then raise on 5xx; outside, they behave exactly as the library's own.
The active client travels in a :class:`contextvars.ContextVar`, so threads and asyncio
tasks do not see each other's.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import socket
import threading
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import quote, urlsplit

import requests
import toxiproxy
import toxiproxy.api as _tp_api
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from ..errors import InvalidArgument, ServiceError

__all__ = [
    "InvalidToxic",
    "NotFound",
    "ProxyExists",
    "ProxyHandle",
    "ToxiproxyClient",
    "ToxiproxyServerError",
    "ToxiproxyUnavailable",
    "default_url",
]

_T = TypeVar("_T")

#: Where ``toxiproxy-cli`` and most tools look: the de-facto convention (spec §1.1).
DEFAULT_URL = "http://127.0.0.1:8474"


def default_url() -> str:
    """``$TOXIPROXY_URL`` if set, else ``http://127.0.0.1:8474``."""
    return os.environ.get("TOXIPROXY_URL") or DEFAULT_URL


class ToxiproxyServerError(ServiceError):
    """The server answered 5xx. ``status`` and ``message`` come from its error body."""

    def __init__(self, status: int, message: str, method: str, path: str, url: str) -> None:
        super().__init__(f"fault proxy at {url}: {method} {path} answered {status}: {message}")
        self.status = status
        self.message = message
        self.method = method
        self.path = path


class ToxiproxyUnavailable(ServiceError):
    """The server could not be reached, or did not answer within the timeout."""


class _Endpoint:
    """One client's address, timeout and session, used by the dispatchers."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout)
        try:
            # A fresh connection per call, as the library does: a pooled keep-alive
            # connection can go stale against the server's 60 s idle timeout (#254).
            response = requests.request(method, self.url + path, **kwargs)
        except requests.Timeout:
            raise ToxiproxyUnavailable(
                f"fault proxy at {self.url}: {method.upper()} {path} got no answer within "
                f"{kwargs['timeout']} s") from None
        except requests.ConnectionError as exc:
            raise ToxiproxyUnavailable(
                f"fault proxy at {self.url}: {method.upper()} {path} failed: {exc}") from None
        _tp_api.validate_response(response)  # the library's own 409/404/400 mapping
        if response.status_code >= 500:
            raise ToxiproxyServerError(response.status_code, _message(response),
                                       method.upper(), path, self.url)
        return response


def _message(response: requests.Response) -> str:
    try:
        body = json.loads(response.content)
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return body["error"]
    except ValueError:
        pass
    return response.text.strip()[:200] or response.reason or ""


_ACTIVE: contextvars.ContextVar[_Endpoint | None] = contextvars.ContextVar(
    "crashmatrix_toxiproxy_endpoint", default=None)
_INSTALL_LOCK = threading.Lock()


def _install_dispatch() -> None:
    consumer = _tp_api.APIConsumer
    with _INSTALL_LOCK:
        if getattr(consumer, "_crashmatrix_dispatch", False):
            return
        for method in ("get", "post", "delete"):
            original = getattr(consumer, method).__func__

            def dispatch(cls: type, url: str, *args: Any, _m: str = method,
                         _orig: Callable[..., Any] = original, **kwargs: Any) -> Any:
                endpoint = _ACTIVE.get()
                if endpoint is None:
                    return _orig(cls, url, *args, **kwargs)
                if _m == "get" and args:
                    kwargs["params"] = args[0]
                elif _m == "post" and args:
                    kwargs["data"] = args[0]
                    if len(args) > 1:
                        kwargs["json"] = args[1]
                return endpoint.request(_m, url, **kwargs)

            setattr(consumer, method, classmethod(dispatch))
        consumer._crashmatrix_dispatch = True  # type: ignore[attr-defined]


class ProxyHandle(toxiproxy.Proxy):
    """A ``toxiproxy.Proxy`` bound to one client; every library method works on it."""

    def __init__(self, client: "ToxiproxyClient", **fields: Any) -> None:
        super().__init__(**fields)
        self._client = client

    def __repr__(self) -> str:
        return (f"ProxyHandle(name={self.name!r}, listen={self.listen!r}, "
                f"upstream={self.upstream!r}, enabled={self.enabled!r})")

    @property
    def port(self) -> int:
        """The proxy's listen port (after :meth:`refresh` if it was created disabled)."""
        return int(str(self.listen).rsplit(":", 1)[1])

    @property
    def _path(self) -> str:
        return "/proxies/" + quote(self.name, safe="")

    # -- library methods, bound to this client ------------------------------------------

    def toxics(self) -> dict[str, toxiproxy.toxic.Toxic]:
        """The proxy's toxics by name (``toxiproxy.toxic.Toxic`` objects)."""
        return self._client._call(super().toxics)

    def get_toxic(self, toxic_name: str) -> toxiproxy.toxic.Toxic | None:
        """The named toxic, or None."""
        return self._client._call(super().get_toxic, toxic_name)

    def add_toxic(self, **kwargs: Any) -> None:
        """Add a toxic: ``type``, and optionally ``stream``, ``name``, ``toxicity``,
        ``attributes`` (the library's defaults: downstream, ``{type}_{stream}``, 1.0)."""
        return self._client._call(super().add_toxic, **kwargs)

    def destroy_toxic(self, toxic_name: str) -> bool:
        """Remove the named toxic (``NotFound`` if absent)."""
        return self._client._call(super().destroy_toxic, toxic_name)

    def destroy(self) -> bool:
        """Delete the proxy (its connections are closed)."""
        return self._client._call(super().destroy)

    def disable(self) -> None:
        """Take the proxy down: connects refused, live connections closed, toxics kept."""
        self._client._call(super().disable)

    def enable(self) -> None:
        """Bring the proxy up again (raises ``ToxiproxyServerError`` if it cannot bind)."""
        self._client._call(super().enable)
        self.refresh()  # the library keeps a stale listen (spec §4.1)

    # -- additions ---------------------------------------------------------------------

    def refresh(self) -> "ProxyHandle":
        """Reload ``listen``, ``upstream`` and ``enabled`` from the server."""
        body = self._client._request("get", self._path).json()
        self.listen, self.upstream, self.enabled = body["listen"], body["upstream"], body["enabled"]
        return self

    def update(self, **fields: Any) -> "ProxyHandle":
        """Update ``listen``/``upstream``/``enabled`` (merge semantics), then refresh."""
        unknown = set(fields) - {"listen", "upstream", "enabled"}
        if unknown:
            raise InvalidArgument(f"fields={sorted(unknown)!r} must be among listen, upstream, enabled")
        body = self._client._request("post", self._path, json=fields).json()
        self.listen, self.upstream, self.enabled = body["listen"], body["upstream"], body["enabled"]
        return self

    def update_toxic(self, name: str, attributes: dict[str, Any] | None = None,
                     toxicity: float | None = None) -> dict[str, Any]:
        """Change a toxic in place: only the given attributes change (merge semantics).

        Uses POST (served by every 2.x server; PATCH needs 2.6+). Returns the toxic.
        """
        body: dict[str, Any] = {}
        if attributes is not None:
            body["attributes"] = attributes
        if toxicity is not None:
            body["toxicity"] = toxicity
        return self._client._request("post", f"{self._path}/toxics/{quote(name, safe='')}",
                                     json=body).json()

    def toxic_json(self, name: str) -> dict[str, Any]:
        """The toxic as the server reports it (``GET …/toxics/{name}``)."""
        return self._client._request("get", f"{self._path}/toxics/{quote(name, safe='')}").json()

    @contextlib.contextmanager
    def toxic(self, type: str, *, stream: str = "downstream", name: str | None = None,
              toxicity: float = 1.0, attributes: dict[str, Any] | None = None) -> Iterator[str]:
        """Add a toxic for the duration of a ``with`` block (removed on exit); yields its name."""
        name = name or f"{type}_{stream}"
        self.add_toxic(type=type, stream=stream, name=name, toxicity=toxicity,
                       attributes=attributes or {})
        try:
            yield name
        finally:
            with contextlib.suppress(NotFound):
                self.destroy_toxic(name)


class ToxiproxyClient:
    """A Toxiproxy client with its own address and timeout.

    ``url`` defaults to ``$TOXIPROXY_URL``, else ``http://127.0.0.1:8474``. ``timeout``
    (seconds) bounds every request; :class:`ToxiproxyUnavailable` is raised past it.
    """

    def __init__(self, url: str | None = None, *, timeout: float = 10.0) -> None:
        url = (url or default_url()).rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise InvalidArgument(f"url={url!r} must look like http://HOST:PORT")
        if not timeout > 0:
            raise InvalidArgument(f"timeout={timeout!r} must be > 0")
        _install_dispatch()
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.timeout = timeout
        self._endpoint = _Endpoint(url, timeout)
        self._lib = toxiproxy.Toxiproxy()

    def __repr__(self) -> str:
        return f"ToxiproxyClient({self.url!r}, timeout={self.timeout!r})"

    # -- plumbing ------------------------------------------------------------------------

    def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        token = _ACTIVE.set(self._endpoint)
        try:
            return fn(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self._endpoint.request(method, path, **kwargs)

    def _bind(self, proxy: toxiproxy.Proxy) -> ProxyHandle:
        if isinstance(proxy, ProxyHandle):
            return proxy
        return ProxyHandle(self, name=proxy.name, upstream=proxy.upstream,
                           enabled=proxy.enabled, listen=proxy.listen)

    # -- library methods, bound to this client ----------------------------------------------

    def proxies(self) -> dict[str, ProxyHandle]:
        """Every proxy on the server, by name."""
        return {name: self._bind(p) for name, p in self._call(self._lib.proxies).items()}

    def get_proxy(self, proxy_name: str) -> ProxyHandle | None:
        """The named proxy, or None."""
        proxy = self._call(self._lib.get_proxy, proxy_name)
        return None if proxy is None else self._bind(proxy)

    def create(self, upstream: str, name: str, listen: str | None = None,
               enabled: bool | None = None) -> ProxyHandle:
        """Create a proxy (``listen`` defaults to ``127.0.0.1:0``: a free port)."""
        return self._bind(self._call(self._lib.create, upstream, name, listen, enabled))

    def destroy(self, proxy: toxiproxy.Proxy) -> bool:
        """Delete ``proxy``; like the library, anything but a proxy object gives False."""
        if not isinstance(proxy, toxiproxy.Proxy):
            return False
        return self._bind(proxy).destroy()

    def destroy_all(self) -> None:
        """Delete every proxy on the server."""
        for proxy in self.proxies().values():
            proxy.destroy()

    def populate(self, proxies: list[dict[str, Any]]) -> list[ProxyHandle]:
        """The library's client-side populate (creates or recreates; returns new ones)."""
        return [self._bind(p) for p in self._call(self._lib.populate, proxies)]

    def reset(self) -> bool:
        """``POST /reset``: re-enable every proxy and remove every toxic."""
        return self._call(self._lib.reset)

    # -- additions ---------------------------------------------------------------------

    def running(self) -> bool:
        """Whether the API port accepts a TCP connection (IPv4, IPv6 or a name)."""
        try:
            socket.create_connection((self.host, self.port), timeout=min(self.timeout, 2.0)).close()
        except OSError:
            return False
        return True

    def version(self) -> str:
        """The server version as text, from ``{"version": …}`` or a bare string."""
        raw = self._request("get", "/version").content.decode("utf-8", "replace").strip()
        try:
            body = json.loads(raw)
        except ValueError:
            return raw
        if isinstance(body, dict) and isinstance(body.get("version"), str):
            return body["version"]
        return raw

    def populate_server(self, proxies: list[dict[str, Any]]) -> list[ProxyHandle]:
        """The server's ``POST /populate`` (atomic validation, in order, keeps identical ones)."""
        body = self._request("post", "/populate", json=proxies).json()
        return [ProxyHandle(self, **{k: p[k] for k in ("name", "upstream", "enabled", "listen")})
                for p in body.get("proxies") or []]
