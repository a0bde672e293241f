"""Restate as a subject: the Python SDK's workflow, served by the worker, journaled by a
real ``restate-server``.

Needs the optional extra ``crashmatrix[restate]`` (``restate-sdk``, ``hypercorn``) and the
server binary (:mod:`crashmatrix.harness.services.restate`: fetched once from the npm
registry and cached). The SDK and hypercorn are imported only in a worker. The workload is
:mod:`crashmatrix.scenarios.realworld.restate_checkout` (``NAIVE`` or ``KEYED``), reached
through the workload object (its ``build``, ``service_name``, ``run_input``, ``answer``).

**The server** is started by :meth:`RestateAdapter.prepare` in the controller, once per
adapter instance (a session), on loopback ports, with a watchdog of the adapter's own
(the server's process group and directory are registered with it, so a SIGKILLed
controller leaves nothing behind); :meth:`RestateAdapter.aclose` stops it and removes
its data (:class:`~._shared.ServerBackedAdapter`). Its URLs reach the workers in
``<workdir>/restate/server.json``.

**A worker** (start or resume: the same code) is the workflow's *service endpoint*:
it serves the run's workflow service (one per run, ``Checkout_<run>``) with hypercorn
on a loopback port kept for the run (``<workdir>/restate/runs/<run id>.json``, a port
below the ephemeral range reserved under ``<workdir>/restate/ports/``), registers that
URL as a deployment with the admin API (idempotent), submits the workflow with the run
id as its key (``/send``: a second submission of the same key is answered
``PreviouslyAccepted``; a resume that finds the invocation on the server submits
nothing, so it needs no input), acknowledges the run (``ctx.accepted()``: the server
answered Accepted), and attaches to it until it ends. Restate pins an invocation to
its deployment (the URL), so after a kill the server retries the invocation against the
same URL (every 20-250 ms: :data:`~crashmatrix.harness.services.restate.RETRY_POLICY`)
until the resume worker serves it again, and replays the journal to it: "another machine
behind the same service address".

**Faults.**

- ``kill``: the endpoint dies mid-handler; the resume worker serves the URL again.
- ``term``: the SDK installs a SIGTERM handler on the worker's loop at its first request
  (``restate.server.install_shutdown_hook``: it only lets finished requests close their
  streams), so SIGTERM no longer ends the worker and the invocation runs on to its end,
  launching further actions; nothing labels ``drain.begin`` (the SDK offers no drain of a
  running invocation). Measured as it ships.
- ``cancel``: the harness cancels the worker's scope, whose task is the adapter's wait on
  the invocation; the handler runs in hypercorn's connection task, outside it (as a
  server's request handler is outside its client's). The worker stays up until the
  invocation ends by itself (at most :data:`CANCELLED_WAIT_SECONDS`), then re-raises, as
  the DBOS adapter does.
- ``pause`` and ``db-restart`` do not apply (no lease the harness can steal: the frozen
  endpoint keeps its port and its HTTP/2 stream; no PostgreSQL). ``net`` cases on the
  model and effect providers' links apply.

**Crash points**: ``step.before/after`` inside each ``ctx.run`` action (logical task
``model-N`` / ``tool-N.i``, the action's journal name), the workload's
``model.call.*`` and ``tool.request.*`` labels, and ``log.append.after`` once the server
acknowledged the action's result (``ctx.run`` returned in the attempt that ran it).
Await points: frames in ``restate`` (the SDK's own modules).

**observe** reads the server's introspection tables through the admin SQL API
(``/query``): ``sys_invocation`` for the run's invocation (status, completion result)
and ``sys_journal`` for its entries; the log is one entry per ``Run`` command whose
``Run`` notification (the result) is journaled, the transcript the run input plus those
results in journal order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import socket
import threading
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from ..adapter import Environment, LogEntry, Observation, RunContext
from ._shared import ServerBackedAdapter, point_under, worker_hooks

PORT_RANGE = (20000, 32000)
"""Endpoint ports: below Linux's ephemeral range (32768-60999), so no outgoing
connection's source port takes a run's port while its endpoint is down."""
CANCELLED_WAIT_SECONDS = 30.0
SERVE_TIMEOUT = 10.0  # seconds until the endpoint answers its health check
STATUS_MAP = {"completed": "completed", "pending": "pending", "scheduled": "pending", "ready": "pending",
              "running": "pending", "backing-off": "pending", "suspended": "pending", "paused": "needs_human"}
QUERY_RETRIES = 50
QUERY_RETRY_SECONDS = 0.1
"""How a worker asks a server that is still starting whether it holds the run
(:meth:`RestateAdapter._submitted`): at most 5 s."""
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_POINT_LOCK = threading.Lock()
point = point_under(_POINT_LOCK)
"""``crashpoint(name)`` under one process-wide lock (docs/adapters.md: the SDK runs
synchronous actions in a thread pool; these are async, the lock costs nothing)."""


def restate_dir(env: Environment) -> Path:
    return Path(env.workdir) / "restate"


def _reserve_port(ports: Path) -> int:
    """A free loopback port in :data:`PORT_RANGE` that no other run of this session
    holds (a file ``ports/<port>`` created exclusively)."""
    ports.mkdir(parents=True, exist_ok=True)
    candidates = list(range(*PORT_RANGE))
    random.shuffle(candidates)
    for port in candidates[:2000]:
        try:
            fd = os.open(ports / str(port), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken by something else: keep it reserved, try another
        return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


def run_endpoint(env: Environment, run_id: str, workload: Any) -> dict[str, Any]:
    """The run's endpoint record ``{"port", "service"}`` (the service named by the
    workload's ``service_name(run_id)``), created on first use. Raises ``ValueError`` for
    a run id that cannot name a file."""
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run_id={run_id!r} must be letters, digits, '_', '.', '-'")
    runs = restate_dir(env) / "runs"
    path = runs / f"{run_id}.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    runs.mkdir(parents=True, exist_ok=True)
    record = {"port": _reserve_port(restate_dir(env) / "ports"), "service": workload.service_name(run_id)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return record


async def query(http: aiohttp.ClientSession, admin_url: str, sql: str) -> list[dict[str, Any]]:
    """Rows of the admin API's SQL introspection (``POST /query``)."""
    async with http.post(f"{admin_url}/query", json={"query": sql}, headers={"accept": "application/json"}) as resp:
        body = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"restate /query {resp.status}: {body[:300]}")
    return list(json.loads(body).get("rows") or [])


def _payload(raw: Any) -> Any:
    """A journal payload (``entry_json`` gives bytes as a list of ints) decoded as JSON."""
    if isinstance(raw, list):
        return json.loads(bytes(raw).decode())
    return raw


def journal_view(entries: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[tuple[int, str, Any]]]:
    """``(run input, [(seq, action name, result), ...])`` from ``sys_journal`` rows in
    index order: a ``Run`` command is in the list once its ``Run`` notification holds a
    success (a failure ends the list: the workflow fails there)."""
    run_input = None
    names: dict[int, str] = {}
    results: list[tuple[int, str, Any]] = []
    for row in entries:
        entry = json.loads(row["entry_json"]) if row.get("entry_json") else {}
        command = entry.get("Command") or {}
        if "Input" in command:
            run_input = _payload(command["Input"].get("payload"))
        elif "Run" in command:
            names[command["Run"]["completion_id"]] = command["Run"].get("name", "")
        completion = ((entry.get("Notification") or {}).get("Completion") or {}).get("Run")
        if completion is not None:
            name = names.get(completion["completion_id"], "?")
            result = completion.get("result") or {}
            if "Success" in result:
                results.append((len(results) + 1, name, _payload(result["Success"])))
    return run_input, results


class RestateAdapter(ServerBackedAdapter):
    """Restate: the Python SDK's workflow, one ``ctx.run`` per model turn and tool call,
    journaled by a real restate-server."""

    name = "restate"
    #: a resume reads the run from the runtime's own store and needs the input only when
    #: nothing was stored (then the harness still hands it: the run was never acknowledged)
    expects_redelivery = False
    subject_packages = ("restate",)
    server_dir = "restate"
    requires = ("restate", "hypercorn.asyncio", "hypercorn.config")
    extra = "restate"

    def start_server(self, base_dir: Path, watchdog: Any) -> tuple[Any, dict[str, Any]]:
        from ..services.restate import start_restate

        server = start_restate(base_dir, watchdog=watchdog)
        return server, server.to_dict()

    # -- worker side --------------------------------------------------------------

    async def start(self, ctx: RunContext) -> str:
        return await self._run(ctx)

    async def resume(self, ctx: RunContext) -> str:
        return await self._run(ctx)  # serving the run's URL again is the resume

    async def _run(self, ctx: RunContext) -> str:
        import hypercorn.asyncio
        import hypercorn.config
        import restate

        server = self.server_info(ctx.env)
        endpoint = run_endpoint(ctx.env, ctx.run_id, ctx.workload)
        service, port = endpoint["service"], int(endpoint["port"])
        stop = asyncio.Event()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            workflow = ctx.workload.build(ctx.run_id, worker_hooks(ctx, session, point, _POINT_LOCK))
            config = hypercorn.config.Config()
            config.bind = [f"127.0.0.1:{port}"]
            config.loglevel = "WARNING"
            config.accesslog = None
            config.graceful_timeout = 0.5
            serving = asyncio.ensure_future(
                hypercorn.asyncio.serve(restate.app(services=[workflow]), config, shutdown_trigger=stop.wait))
            try:
                await self._until_serving(session, port, serving)
                await self._register(session, server["admin_url"], port)
                # the server holds a submitted invocation: a resume that finds it needs
                # no input (``--resume input-once``); one that does not submits again
                if not await self._submitted(session, server["admin_url"], service, ctx.run_id):
                    url = f"{server['ingress_url']}/{service}/{ctx.run_id}/run/send"
                    async with session.post(url, json=ctx.run_input()) as resp:
                        if resp.status not in (200, 202):
                            raise RuntimeError(f"restate submit {resp.status}: {(await resp.text())[:300]}")
                with _POINT_LOCK:
                    ctx.accepted()  # the server answered Accepted (or holds the invocation)
                attach = f"{server['ingress_url']}/restate/workflow/{service}/{ctx.run_id}/attach"
                try:
                    await self._attach(session, attach)
                except anyio.get_cancelled_exc_class():
                    # a cancel fault reached this wait only; the handler runs in
                    # hypercorn's task: keep serving until the invocation ends (bounded)
                    with anyio.move_on_after(CANCELLED_WAIT_SECONDS, shield=True):
                        with contextlib.suppress(Exception):
                            await self._attach(session, attach)
                    raise
                rows = await self._invocation(session, server["admin_url"], service, ctx.run_id)
                return _status(rows[0] if rows else None)
            finally:
                with anyio.CancelScope(shield=True):
                    stop.set()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(serving, 5.0)

    @staticmethod
    async def _until_serving(session: aiohttp.ClientSession, port: int, serving: asyncio.Future[Any]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SERVE_TIMEOUT
        while True:
            if serving.done():
                serving.result()  # raises the bind error
                raise RuntimeError(f"endpoint on 127.0.0.1:{port} stopped before serving")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                    if resp.status == 200:
                        return
            if loop.time() > deadline:
                raise RuntimeError(f"endpoint on 127.0.0.1:{port} not serving within {SERVE_TIMEOUT} s")
            await asyncio.sleep(0.02)

    @staticmethod
    async def _register(session: aiohttp.ClientSession, admin_url: str, port: int) -> None:
        """Register the endpoint as a deployment; the same URL again is accepted (409:
        it exists with the same services)."""
        async with session.post(f"{admin_url}/deployments", json={"uri": f"http://127.0.0.1:{port}"}) as resp:
            if resp.status not in (200, 201, 409):
                raise RuntimeError(f"restate deployment registration {resp.status}: {(await resp.text())[:300]}")

    @staticmethod
    async def _attach(session: aiohttp.ClientSession, url: str) -> None:
        async with session.get(url) as resp:
            await resp.read()  # 200: the output; 4xx/5xx: the terminal failure (status read after)

    @classmethod
    async def _submitted(cls, session: aiohttp.ClientSession, admin_url: str, service: str, run_id: str) -> bool:
        """Whether the server holds the run's invocation. A fresh server answers its SQL
        API with 500 ("node lookup for partition 0 failed") until its partitions are up:
        asked again every :data:`QUERY_RETRY_SECONDS`, at most :data:`QUERY_RETRIES`
        times, then False (the submission is idempotent: ``PreviouslyAccepted``)."""
        for _ in range(QUERY_RETRIES):
            try:
                return bool(await cls._invocation(session, admin_url, service, run_id))
            except RuntimeError:
                await asyncio.sleep(QUERY_RETRY_SECONDS)
        return False

    @staticmethod
    async def _invocation(session: aiohttp.ClientSession, admin_url: str, service: str,
                          run_id: str) -> list[dict[str, Any]]:
        return await query(session, admin_url,
                           "SELECT id, status, completion_result, completion_failure FROM sys_invocation "
                           f"WHERE target_service_name = '{service}' AND target_service_key = '{run_id}' "
                           "AND target_handler_name = 'run'")

    # -- controller side: observe -------------------------------------------------

    async def observe(self, env: Environment, run_id: str) -> Observation:
        if not _RUN_ID.match(run_id):
            return Observation(run_id, "absent", log=[], state=None, state_error=f"malformed run id {run_id!r}")
        workload = self.workload_of(env)
        admin = self.server_info(env)["admin_url"]
        rows = await self._invocation(self.http(), admin, workload.service_name(run_id), run_id)
        if not rows:
            return Observation(run_id, "absent", log=[], state=None, state_error="no invocation")
        inv = rows[0]
        entries = await query(self.http(), admin, "SELECT index, entry_json FROM sys_journal "
                                                 f"WHERE id = '{inv['id']}' ORDER BY index")
        run_input, results = journal_view(entries)
        status = _status(inv)
        messages = list((run_input or {}).get("messages") or []) + [out for _, _, out in results]
        log = [LogEntry(seq, name, (), name.split("-")[0], 0) for seq, name, _ in results]
        return Observation(run_id, status, log=log, effects=None, state={
            "transcript": messages, "answer": workload.answer(messages), "budget": None,
            "pending": [] if status in ("completed", "failed") else ["workflow"]})


def _status(inv: dict[str, Any] | None) -> str:
    """The harness's status of a ``sys_invocation`` row."""
    if inv is None:
        return "absent"
    if inv.get("status") == "completed":
        return "completed" if inv.get("completion_result") == "success" else "failed"
    return STATUS_MAP.get(str(inv.get("status")), str(inv.get("status")))


__all__ = ["RestateAdapter", "journal_view", "point", "query", "run_endpoint"]
