"""The reference runtime served by an ASGI endpoint: a run is a streaming HTTP request
to a uvicorn server in the worker process, and SIGTERM meets uvicorn's signal handling.

A common production shape: an agent behind an HTTP endpoint, each run one request
whose response streams the run's events (``text/event-stream``). The worker here is that
process: :meth:`EndpointAdapter.start` / ``resume`` bind a loopback port, serve a
Starlette app on it with :func:`server_class` (a ``uvicorn.Server``) as a task of the
worker's event loop, and drive the run as a client would, ``POST /runs?run_id=ID`` with
aiohttp, reading the stream until its ``end`` event. The request's handler runs the
reference runtime (:meth:`.ReferenceAdapter._run`) without the runtime's own SIGTERM
handler: the process's handler is uvicorn's (``Server.capture_signals``, a Python-level
``signal.signal`` handler installed for the length of ``serve``).

What SIGTERM does then, in order:

1. uvicorn's ``handle_exit`` sets ``should_exit``; ``EndpointServer``
   (:func:`server_class`) extends it (as sse-starlette's ``AppStatus`` patches it) to
   request the runtime's drain at once (:meth:`.WorkerDrain.request`): no step is
   launched after the signal, the steps in flight finish and append, the run is left
   ``paused`` and the stream's ``end`` event says so.
2. Within 0.1 s uvicorn's main loop sees ``should_exit``: it stops accepting, asks open
   connections to close after their response, and waits for them up to
   ``timeout_graceful_shutdown`` seconds (:attr:`EndpointAdapter.graceful_s`), then
   cancels the request tasks still running.
3. ``serve`` returns and re-raises the captured SIGTERM with the handler that was there
   before it (``signal.raise_signal``): with the default disposition the process would
   die of it after the drain. The adapter is the process's main here: it installs a
   handler of its own before ``serve`` that only notes the signal, so the re-raise lands
   there, the adapter returns the stream's status, and the worker writes its end report
   and exits 0. The harness installs no SIGTERM handler in a worker
   (:mod:`..worker`): the process's handling is the server's and the adapter's.

Defective variants (docs/adapters.md, "Endpoint"): :class:`EndpointUnwiredAdapter`
does not extend ``handle_exit`` (uvicorn waits for the open request, which runs the
agent to its end, launching steps after SIGTERM: ``term.drained``);
:class:`EndpointCancelAdapter` cancels the open requests from the server's handler
(:func:`cancel_requests`, the stream cut as sse-starlette's default cuts it) and serves
with ``timeout_graceful_shutdown=0``: the step in flight is cancelled, not recorded, and
the run not left at rest (``running``: uvicorn's shutdown returns without waiting for the
cancelled request to unwind; ``term.drained``, ``term.in_flight_recorded``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from functools import cache

import aiohttp
import anyio

from crashmatrix.reference_runtime.drain import WorkerDrain

from ..adapter import RunContext
from .reference import ReferenceAdapter


@cache
def server_class() -> type[Any]:
    """``EndpointServer``: a ``uvicorn.Server`` whose signal handler also calls its
    ``on_exit`` (the app's hook into graceful shutdown; None: uvicorn's handler alone).
    Made on first use: uvicorn is the optional extra ``endpoint``."""
    import uvicorn

    class EndpointServer(uvicorn.Server):
        on_exit: Callable[[], None] | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if self.on_exit is not None:
                self.on_exit()

    return EndpointServer


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event: ``event: NAME`` and one ``data:`` line of JSON."""
    return f"event: {event}\ndata: {json.dumps(data, sort_keys=True)}\n\n".encode()


async def read_events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The ``(event, data)`` pairs of a ``text/event-stream`` response, as they arrive."""
    event, data = "message", ""
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif not line and data:
            yield event, json.loads(data)
            event, data = "message", ""


def cancel_requests(server: Any) -> None:
    """Cancel every request task ``server`` runs (what uvicorn does once
    ``timeout_graceful_shutdown`` ran out, and sse-starlette's ``EventSourceResponse``
    with its default ``shutdown_grace_period=0`` once it sees the shutdown)."""
    for task in list(server.server_state.tasks):
        task.cancel(msg="server shutdown")


async def stop(server: Any, serving: asyncio.Task[None]) -> None:
    """Shut ``server`` down and wait for ``serve`` (its task ``serving``) to return, even
    when the caller is being cancelled (a ``cancel`` fault: the client's request is
    dropped, the server sees the disconnect and cancels the run's request): no server,
    port or request task outlives the job. A native cancel meanwhile (``task.cancel()``)
    is raised once the server stopped."""
    server.should_exit = True
    interrupted = False
    with anyio.CancelScope(shield=True):
        while not serving.done():
            try:
                await asyncio.wait({serving})
            except asyncio.CancelledError:
                interrupted = True
    if interrupted:
        raise asyncio.CancelledError


class EndpointAdapter(ReferenceAdapter):
    """The reference runtime behind a uvicorn endpoint: a run is a streaming request, SIGTERM is uvicorn's."""

    name = "endpoint"
    requires = ("uvicorn", "starlette")
    extra = "endpoint"
    #: uvicorn's ``timeout_graceful_shutdown``: seconds it waits for open requests after
    #: SIGTERM before cancelling them (None: until they end; the harness's ``--term-grace``
    #: still bounds the worker)
    graceful_s: float | None = None
    #: the server's signal handler requests the runtime's drain (:func:`server_class`)
    drain_on_exit: bool = True
    #: the server's signal handler cancels the open requests at once instead
    #: (:func:`cancel_requests`; only without :attr:`drain_on_exit`)
    cancel_on_exit: bool = False
    #: a cancel of the worker's task is the client's: it reaches the run only when the
    #: server sees the disconnect, not at the run's next await (``--kinds cancel`` on
    #: checkout conv1: 76 of 82 pass, 6 fail ``cancel.left_unknown``)
    cancel_reaches_run = False
    #: one server per job, its handlers put back when the job ends
    long_lived_workers = True

    def app(self, ctx: RunContext, drain: WorkerDrain | None, role: str) -> Any:
        """The ASGI app: ``POST /runs?run_id=ID`` streams ``accepted`` (once the runtime
        stored the run) and ``end`` (``{"status": ...}``) or ``error``
        (``{"error": ...}``) events while the runtime runs it in the request's task."""
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        adapter = self

        async def run(request: Request) -> StreamingResponse:
            run_ctx = RunContext(ctx.env, request.query_params.get("run_id", ""), ctx.workload, ctx.conversation,
                                 ctx.worker_id, ctx.on_step, input_given=ctx.input_given, scope=ctx.scope,
                                 clock_offset_s=ctx.clock_offset_s, on_accepted=ctx.on_accepted, seed=ctx.seed)

            async def events() -> AsyncIterator[bytes]:
                try:
                    # a task of its own, not the generator's frame: the await-point tracer
                    # walks a task's await chain, which does not enter an async generator;
                    # a cancel of the request still reaches it (the awaiting task cancels it)
                    status = await asyncio.create_task(adapter._run(run_ctx, recover=role == "recover", drain=drain))
                except Exception as exc:  # the client raises it in the worker
                    yield sse("error", {"error": f"{type(exc).__name__}: {exc}"})
                    return
                yield sse("end", {"status": status})

            return StreamingResponse(events(), media_type="text/event-stream")

        return Starlette(routes=[Route("/runs", run, methods=["POST"])])

    async def serve(self, ctx: RunContext, role: str) -> str:
        """Serve the app on a loopback port in this process and run ``ctx.run_id`` as its
        client; return the status of the stream's ``end`` event, or ``"drained"`` when
        the stream ended without one after SIGTERM (the server cancelled the request).
        Raises RuntimeError with the stream's ``error`` event."""
        import uvicorn

        loop = asyncio.get_running_loop()
        drain = WorkerDrain()  # not installed: requested by the server's handler
        noted: list[int] = []
        # the handler uvicorn restores and re-raises the captured SIGTERM into once it
        # has shut down: this process's main notes it (module docstring, step 3)
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: noted.append(signum))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            config = uvicorn.Config(self.app(ctx, drain, role), lifespan="off", log_config=None, access_log=False,
                                    timeout_graceful_shutdown=self.graceful_s)
            server = server_class()(config)
            if self.drain_on_exit:
                server.on_exit = lambda: drain.request(loop)
            elif self.cancel_on_exit:  # in the loop: a signal handler may not touch tasks
                server.on_exit = lambda: loop.call_soon_threadsafe(cancel_requests, server)
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            try:
                while not server.started and not serving.done():
                    await asyncio.sleep(0.005)
                if serving.done():  # it could not start: its error
                    serving.result()
                    raise RuntimeError("the endpoint server stopped before it started")
                return await self.call(port, ctx.run_id, stopping=lambda: server.should_exit)
            finally:
                await stop(server, serving)
        finally:
            sock.close()
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

    async def call(self, port: int, run_id: str, stopping: Callable[[], bool]) -> str:
        """The client: ``POST /runs?run_id=ID`` and read the stream to its ``end``."""
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            try:
                async with http.post(f"http://127.0.0.1:{port}/runs", params={"run_id": run_id}) as response:
                    response.raise_for_status()
                    async for event, data in read_events(response):
                        if event == "end":
                            return str(data["status"])
                        if event == "error":
                            raise RuntimeError(f"the endpoint's run raised: {data['error']}")
            except aiohttp.ClientPayloadError:
                if not stopping():
                    raise
        if stopping():  # the server shut down and cut the request short
            return "drained"
        raise RuntimeError(f"the endpoint's stream for run {run_id} ended without an end event")

    async def start(self, ctx: RunContext) -> str:
        return await self.serve(ctx, "start")

    async def resume(self, ctx: RunContext) -> str:
        return await self.serve(ctx, "resume")

    async def recover(self, ctx: RunContext) -> str:
        return await self.serve(ctx, "recover")


class EndpointUnwiredAdapter(EndpointAdapter):
    """Defective: the app does not hook the server's shutdown; the open request runs the agent on after SIGTERM."""

    name = "endpoint-unwired"
    drain_on_exit = False


class EndpointCancelAdapter(EndpointAdapter):
    """Defective: the app cancels its open requests when the server shuts down; the step in flight is cut off."""

    name = "endpoint-cancel"
    graceful_s = 0.0
    drain_on_exit = False
    cancel_on_exit = True
