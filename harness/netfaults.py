"""Network faults: toxics on the links of one case, and the matrix's network section.

(The ``net`` fault kind itself, its setting, hooks and ``net.resumable``, is
:mod:`.faults.net`; this module holds the parts it uses.)

Fault model (what the reference runtime claims to survive, so what is injected): a link
between the subject and a service breaks while it is in use. The subject's answer may be
lost after the server acted (a COMMIT that landed, a charge that was made), cut in the
middle, late beyond the caller's deadline, or the link may stay down for the rest of the
worker. Requests are never corrupted, and a link is never poisoned for more than one
worker. A ``net`` fault (:class:`~.plan.NetToxic`) names the link (``db`` or a provider
kind), the Toxiproxy toxic and its attributes, the stream, and its heal.

**Links.** Only a case that poisons a link pays for the proxy: the controller creates,
on the session's fault proxy (:class:`FaultProxyService`: ``$TOXIPROXY_URL`` if set,
else the embedded Toxiproxy-compatible server in a process of its own, started on the
first network case), one proxy per poisoned link of that case (:class:`CaseLinks`,
named ``cm-RUNID-LINK``, so parallel cases never share one), and hands the case's
workers an :class:`~.adapter.Environment` whose DSN or provider URL points at it. Every
other link, and every other case, stays direct. The proxies are removed at the end of
the case, whatever happened.

**How the toxic lands** (:class:`LinkToxic`, in the worker): at the fault's crash point
the worker writes ``fired``, then adds the toxic through the proxy's HTTP API and only
then returns to the subject, so the statement or request that follows meets it. At the
heal point (the runtime's own retry, e.g. ``db.reconnect[db]#1``), or at the end of the
worker when the plan gives none, the worker removes it and writes ``healed``
(:mod:`.history`); the controller removes whatever a dead worker left, and checks that
every plan ends healed before the oracle runs (:mod:`.faults.net`).

**The network section** (:func:`net_cases`, ``crashmatrix run --kinds net``): for each
golden run, each labelled crash point where a link is in use x each row of
:data:`NET_DEFAULTS` that applies there. "In use" comes from the golden trace's labels:
the ``db`` link at ``log.append.*`` and ``effect.*``; the ``model`` link at
``model.call.before``; an effect tool's provider at that node's ``tool.request.before``
(the provider is the one whose own ledger holds the node's idempotency key in the golden
run; read-only tools use no link). Bounds: labels only (no step or await points), each
point at the occurrence the golden run recorded, single faults (``--depth 2`` adds a
second fault of another kind, never a second ``net``), links limited to ``db`` and the
workload's providers. On checkout that is 57 cases for conversation 1 and 259 for all four
(docs/benchmarks.md).

Workers of network cases get short deadlines so that a late answer costs seconds, not
minutes (:data:`NET_OPTIONS`: 2 s per provider call, 1 s to reconnect to PostgreSQL);
the golden run and every other case keep the runtime's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

from .adapter import Environment
from .crashpoint import (
    DB_RECONNECT, EFFECT_STARTED_BEFORE, EFFECT_UNKNOWN_BEFORE, LOG_APPEND_BEFORE, MODEL_CALL_BEFORE,
    PROBE_BEFORE, TOOL_REQUEST_BEFORE,
)
from .errors import HarnessError, PlanError, ServiceError
from .history import Healed, HealError, TraceEntry, WorkerEvent
from .plan import Case, CrashPoint, Fault, FaultPlan, NetToxic

if TYPE_CHECKING:  # the worker imports this module; the controller's side stays lazy
    from .golden import GoldenRun
    from .faultproxy.client import ProxyHandle, ToxiproxyClient

PROVIDER_DEADLINE_MS = 2000
"""Deadline of one provider call (model, effect, probe) in a network case's workers."""
DB_RECONNECT_DEADLINE_MS = 1000
"""How long a network case's worker tries to reconnect to PostgreSQL before it gives up."""
NET_OPTIONS = {"provider_deadline_ms": PROVIDER_DEADLINE_MS, "db_reconnect_deadline_ms": DB_RECONNECT_DEADLINE_MS}
"""``Environment.options`` of a network case's workers (read by the reference adapter)."""
TOXIC_NAME = "cm-net"
"""The name of the toxic a ``net`` fault adds (one per proxy: proxies are per case)."""
RESPONSE_CUT_BYTES = 200
"""``limit_data`` for "a response cut in half": the providers' status line and headers
take about 160 bytes and their bodies 93 to 400 (measured: a charge 160 + 123, a mail
159 + 93, a model turn 160 + 213 and more), so 200 bytes delivers the status 200 and
cuts every body before its end, most near the middle."""


@dataclass(frozen=True)
class NetDefault:
    """One row of the network section's default set: on links of class ``links``
    (``"db"``, ``"model"``, ``"effect"``: a provider an effect tool calls, or
    ``"provider"``: model and effect providers), at labels matching ``points``
    (shell patterns), toxic ``toxic`` with ``attributes`` on ``stream``, healed at
    ``heal``: ``"retry"`` (the runtime's first retry on that link: ``db.reconnect[db]#1``,
    the node's next ``model.call.before``, or its next ``probe.before``) or
    ``"worker-end"`` (the link stays broken until the worker ends)."""

    name: str
    links: str
    points: tuple[str, ...]
    toxic: str
    attributes: tuple[tuple[str, int], ...]
    heal: str
    why: str
    stream: str = "downstream"


NET_DEFAULTS: tuple[NetDefault, ...] = (
    NetDefault("db-blip", "db", ("log.append.*", "effect.*"), "reset_peer", (), "retry",
               "the answer to the statement in flight (or the next one) is lost and the connection reset: a COMMIT "
               "whose acknowledgement is lost; the network is back when the runtime reconnects"),
    NetDefault("db-outage", "db", (LOG_APPEND_BEFORE, EFFECT_STARTED_BEFORE, EFFECT_UNKNOWN_BEFORE),
               "reset_peer", (), "worker-end",
               "as db-blip, and every reconnection is reset too until the worker ends: it must fail loudly, "
               "leaving the run for a resume"),
    NetDefault("effect-timeout", "effect", (TOOL_REQUEST_BEFORE,), "timeout", (("timeout", 200),), "worker-end",
               "the request reaches the provider, its answer never comes back and the link closes 200 ms later; "
               "the probe meets the same broken link (cannot tell yet) until the worker ends"),
    NetDefault("provider-cut", "provider", (TOOL_REQUEST_BEFORE, MODEL_CALL_BEFORE), "limit_data",
               (("bytes", RESPONSE_CUT_BYTES),), "retry",
               "the provider's answer is cut after the status line, in the middle of its body"),
    NetDefault("provider-late", "provider", (TOOL_REQUEST_BEFORE, MODEL_CALL_BEFORE), "latency",
               (("latency", 2 * PROVIDER_DEADLINE_MS),), "retry",
               "the answer arrives after twice the caller's deadline"),
)
"""The default toxics of ``--kinds net`` (see the module docstring for the bounds)."""


# -- enumeration ------------------------------------------------------------------------


def effect_providers(golden: GoldenRun) -> dict[str, str]:
    """Node id -> the provider kind its effect went to, from the golden run's evidence
    (the provider whose own ledger holds the effect's idempotency key)."""
    by_key = {row.get("key"): kind for kind, rows in golden.evidence.ledgers.items() for row in rows if row.get("key")}
    return {e.node_id: by_key[e.key] for e in golden.evidence.observation.effects or [] if e.key in by_key}


def _link_of(entry: TraceEntry, effects: dict[str, str], providers: tuple[str, ...]) -> tuple[str, str] | None:
    """``(link class, link)`` in use at a golden trace entry, or None."""
    source, name, task, _ = entry
    if source != "label":
        return None
    if name.startswith(("log.append.", "effect.")):
        return "db", "db"
    if name.startswith("model.call.") and "model" in providers:
        return "model", "model"
    if name.startswith(("tool.request.", "probe.")) and task in effects:
        return "effect", effects[task]
    return None


def _retry_heal(link_class: str, entry: TraceEntry, trace: list[TraceEntry]) -> CrashPoint:
    _, name, task, occ = entry
    if link_class == "db":
        return CrashPoint("label", DB_RECONNECT, "db", 1)
    if link_class == "model":
        return CrashPoint("label", MODEL_CALL_BEFORE, task, occ + 1)
    probes = sum(1 for e in trace[:trace.index(entry)] if e[1] == PROBE_BEFORE and e[2] == task)
    return CrashPoint("label", PROBE_BEFORE, task, probes + 1)


def net_cases(workload: str, goldens: dict[str, GoldenRun], providers: tuple[str, ...],
              defaults: tuple[NetDefault, ...] = NET_DEFAULTS) -> list[Case]:
    """The network section: for each golden run (sorted by conversation), each labelled
    point where a link is in use (trace order) x each row of ``defaults`` that applies
    there. Deterministic: the same goldens give the same list."""
    cases = []
    for conv in sorted(goldens):
        trace = goldens[conv].trace
        effects = effect_providers(goldens[conv])
        for entry in trace:
            link = _link_of(entry, effects, providers)
            if link is None:
                continue
            link_class, link_name = link
            for row in defaults:
                if row.links != link_class and not (row.links == "provider" and link_class in ("model", "effect")):
                    continue
                if not any(fnmatch.fnmatchcase(entry[1], p) for p in row.points):
                    continue
                heal = _retry_heal(link_class, entry, trace) if row.heal == "retry" else None
                net = NetToxic(link_name, row.toxic, row.attributes, row.stream, heal)
                point = CrashPoint(*entry)
                cases.append(Case(workload, conv, FaultPlan((Fault("net", point, net),))))
    return cases


def check_links(case: Case, providers: tuple[str, ...]) -> None:
    """Raise :class:`PlanError` when a ``net`` fault of ``case`` names a link the workload
    does not have (``db`` or one of ``providers``)."""
    for i, fault in enumerate(case.plan.faults):
        if fault.net is not None and fault.net.link != "db" and fault.net.link not in providers:
            raise PlanError(f"plan.faults[{i}].net.link={fault.net.link!r} must be 'db' or one of the workload's "
                            f"providers ({', '.join(providers)})")


# -- worker side ------------------------------------------------------------------------


def _api(url: str, method: str, path: str, body: Any = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """One call to a Toxiproxy-compatible API with the standard library (a worker must
    not import the fault proxy's server package: 0.6 s); ``(status, body)``."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class LinkToxic:
    """The worker's side of one ``net`` fault: the toxic, added by :meth:`add` and
    removed by :meth:`heal` (at the plan's heal point or at the worker's end).

    ``api``: the fault proxy's URL; ``proxy``: the case's proxy for the fault's link.
    Raises :class:`HarnessError` when the proxy API refuses or does not answer."""

    def __init__(self, fault: Fault, api: str, proxy: str) -> None:
        assert fault.net is not None
        self.fault = fault
        self.net = fault.net
        self.api = api
        self.proxy = proxy
        self.healed = False
        self._heal_key = fault.net.heal.key if fault.net.heal else None

    @classmethod
    def from_env(cls, fault: Fault, env: Environment | None) -> LinkToxic:
        """The toxic for ``fault`` on the proxy the controller created for its link."""
        net = (env.options.get("net") if env else None) or {}
        assert fault.net is not None
        proxy = net.get("proxies", {}).get(fault.net.link)
        if not net.get("api") or not proxy:
            raise HarnessError(f"fault {fault.label()}: no proxy for link {fault.net.link!r} in this worker's environment")
        return cls(fault, net["api"], proxy)

    def _path(self, *rest: str) -> str:
        return "/".join(["", "proxies", quote(self.proxy, safe=""), "toxics", *rest])

    def add(self) -> None:
        body = {"name": TOXIC_NAME, "type": self.net.toxic, "stream": self.net.stream, "toxicity": 1.0,
                "attributes": self.net.attrs}
        try:
            status, text = _api(self.api, "POST", self._path(), body)
        except OSError as exc:
            raise HarnessError(f"fault {self.fault.label()}: the fault proxy at {self.api} did not answer: {exc}") from None
        if status != 200:
            raise HarnessError(f"fault {self.fault.label()}: adding the toxic answered {status}: {text[:200]!r}")

    def due(self, name: str, task: str, occurrence: int) -> bool:
        """Whether the point just reached is this toxic's heal point."""
        return not self.healed and self._heal_key == (name, task, occurrence)

    def heal(self, emit: Callable[[WorkerEvent], None], at: TraceEntry | str) -> None:
        """Remove the toxic (once) and report :class:`~.history.Healed` ``at`` the heal
        point reached (or ``"worker-end"``); a failure is reported as
        :class:`~.history.HealError` (the controller removes it then)."""
        if self.healed:
            return
        self.healed = True
        try:
            status, text = _api(self.api, "DELETE", self._path(TOXIC_NAME))
            if status not in (200, 204):
                raise OSError(f"answered {status}: {text[:200]!r}")
        except OSError as exc:
            emit(HealError(f"removing toxic {TOXIC_NAME} from {self.proxy}: {exc}"))
            return
        emit(Healed(at, time.time()))


# -- controller side: the fault proxy and a case's links ----------------------------------


class FaultProxyService:
    """The session's fault proxy, started on first use: ``$TOXIPROXY_URL`` if set (the
    real Toxiproxy, or any compatible server), else the embedded server
    (``python -m crashmatrix.harness.faultproxy``) in a process and process group of its
    own, on a free loopback port, seeded with ``seed`` (its ``--seed``: jitter, slicer
    sizes, toxicity rolls), registered with the watchdog; with ``services="containers"``,
    Toxiproxy in a container instead (:func:`.services.containers.start_container_toxiproxy`,
    seeded alike). :meth:`close` stops it.

    Raises :class:`~.errors.ServiceError` (one line) when it cannot be started or reached."""

    def __init__(self, workdir: Path, watchdog: Any = None, *, seed: int = 0, services: str = "embedded") -> None:
        self.workdir = workdir
        self.watchdog = watchdog
        self.seed = seed
        self.services = services
        self.proc: subprocess.Popen[bytes] | None = None
        self.container: Any = None
        self._client: ToxiproxyClient | None = None
        self._error: ServiceError | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> ToxiproxyClient:
        """The client, starting the server on the first call; a failed start is
        remembered, so later cases fail at once with the same error."""
        async with self._lock:
            if self._error is not None:
                raise self._error
            if self._client is None:
                try:
                    self._client = await asyncio.to_thread(self._start)
                except ServiceError as exc:
                    self._error = exc
                    raise
            return self._client

    def _start(self) -> ToxiproxyClient:
        from .faultproxy.client import ToxiproxyClient, ToxiproxyUnavailable

        url = os.environ.get("TOXIPROXY_URL")
        if url is None and self.services == "containers":
            from .services.containers import start_container_toxiproxy

            self.container = start_container_toxiproxy(seed=self.seed, watchdog=self.watchdog)
            url = self.container.url
        elif url is None:
            url = self._spawn()
        client = ToxiproxyClient(url, timeout=10)
        try:
            client.version()
        except ToxiproxyUnavailable as exc:
            raise ServiceError(f"fault proxy: {exc}") from None
        return client

    def _spawn(self, ready_timeout: float = 15.0) -> str:
        from .services.process import NotReady, first_lines, spawn, stderr_tail

        stderr_path = self.workdir / "faultproxy.stderr.log"
        self.proc = spawn(
            [sys.executable, "-P", "-m", "crashmatrix.harness.faultproxy", "--host", "127.0.0.1", "--port", "0",
             "--seed", str(self.seed)],
            stderr_path=stderr_path, register_pgid=self.watchdog.watch_pgid if self.watchdog is not None else None)
        try:
            text = first_lines({"faultproxy": self.proc}, ready_timeout)["faultproxy"]
        except NotReady as exc:
            text = "" if exc.why == "exited" else f"no line within {ready_timeout:g} s"
        if not text.startswith("listening on "):
            self.close()
            raise ServiceError(f"embedded fault proxy did not start: {text or 'no output'}; {stderr_tail(stderr_path)}")
        return text.removeprefix("listening on ")

    def close(self) -> None:
        """Stop the embedded server (SIGTERM, then SIGKILL after 5 s) and reap it, or remove
        the Toxiproxy container. Idempotent."""
        from .services.process import stop_process_groups

        proc, self.proc = self.proc, None
        self._client = None
        container, self.container = self.container, None
        if container is not None:
            container.close()
        if proc is None:
            return
        stop_process_groups({"faultproxy": proc}, 5.0)
        if self.watchdog is not None:
            self.watchdog.forget_pgid(proc.pid)


def with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = (f"{parts.username}@" if parts.username else "") + f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def upstream_of(url: str, link: str) -> str:
    parts = urlsplit(url)
    if not parts.hostname or not parts.port or parts.password:
        raise HarnessError(f"link {link!r} cannot go through the fault proxy: {url.split('@')[-1]!r} is not a "
                           f"host:port URL without a password (a DSN in key=value form or on a Unix socket)")
    return f"{parts.hostname}:{parts.port}"


class CaseLinks:
    """The proxies of one case, one per poisoned link (``async with``): created on
    enter, every toxic on them removed by :meth:`heal_all`, deleted on exit.

    ``env``: the case's direct environment; :attr:`worker_env` is the same with the
    poisoned links pointed at their proxies and :data:`NET_OPTIONS` added."""

    def __init__(self, client: ToxiproxyClient, env: Environment, links: set[str], tag: str) -> None:
        self.client = client
        self.env = env
        self.links = sorted(links)
        self.tag = tag
        self.proxies: dict[str, ProxyHandle] = {}
        self.worker_env = env

    def _direct(self, link: str) -> str:
        return self.env.dsn if link == "db" else self.env.providers[link]

    async def __aenter__(self) -> CaseLinks:
        try:
            for link in self.links:
                upstream = upstream_of(self._direct(link), link)
                self.proxies[link] = await asyncio.to_thread(
                    self.client.create, upstream, f"cm-{self.tag}-{link}", "127.0.0.1:0")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        providers = dict(self.env.providers)
        dsn = self.env.dsn
        for link, proxy in self.proxies.items():
            if link == "db":
                dsn = with_port(dsn, proxy.port)
            else:
                providers[link] = with_port(providers[link], proxy.port)
        options = {**self.env.options, **NET_OPTIONS,
                   "net": {"api": self.client.url, "proxies": {k: p.name for k, p in self.proxies.items()}}}
        self.worker_env = dataclasses.replace(self.env, dsn=dsn, providers=providers, options=options)
        return self

    async def heal_all(self) -> list[str]:
        """Remove every toxic left on the case's proxies; returns ``"LINK:TOXIC"`` for each."""
        def clear() -> list[str]:
            left = []
            for link, proxy in self.proxies.items():
                for name in proxy.toxics():
                    proxy.destroy_toxic(name)
                    left.append(f"{link}:{name}")
            return left

        return await asyncio.to_thread(clear)

    async def __aexit__(self, *exc: object) -> None:
        from .faultproxy.client import NotFound

        proxies, self.proxies = self.proxies, {}

        def destroy() -> None:
            for proxy in proxies.values():
                with contextlib.suppress(NotFound):
                    proxy.destroy()

        await asyncio.to_thread(destroy)
