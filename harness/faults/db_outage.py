"""``db-outage``: PostgreSQL unreachable for a window while the worker keeps running, then
healed (docs/design.md, "Fault kinds, precisely").

A case with a ``db-outage`` fault anywhere in its plan gets, for the whole case, a proxy
of its own on the session's fault proxy in front of its PostgreSQL (the one its workers
would use otherwise: the session's, a ``db-restart`` case's server, or a ``net`` case's
db proxy), and its workers a DSN through it; the controller keeps its direct
connection. At the point the worker stops itself (SIGSTOP); the controller disables the
proxy, which aborts every connection of the worker's and refuses new ones (as a server
that is down does: ``connection refused``), and wakes the worker. The worker goes on
without its database for ``window_ms`` (:attr:`.plan.Fault.window_ms`), measured from
the moment the link was cut; then the controller enables the proxy again, on the same
port. The window is the controller's, not the worker's: it ends on time whether the
worker rides it out, gives up, or died, and a worker that ended inside it is followed by
the next one only once it is over. A window that cannot end healed (the proxy cannot be
enabled again) is a harness error, and the case's proxy is removed whatever happened.

Unlike ``db-restart`` (the worker sleeps through the whole restart and wakes on a dead
connection to a server that is back), the subject meets the outage awake: its retries,
its pool's reconnections, its recovery loop run against a database that refuses them.
Crash check ``db-outage.resumable``: after the worker, the run is finished or left for
a resume, never failed or handed to a human because the database was briefly away. The
end checks then say whether the run still ends as the golden run did.

The window comes with the fault (``db-outage(3000ms)@...``, ``window_ms`` in a plan);
the cases a matrix enumerates get ``--outage-window`` (``Options.outage_window_ms``,
:func:`with_window`), else 1 s. Bad input: a window not shorter than the case deadline
(``--worker-timeout``) is refused before anything starts (:func:`check_windows`: one
line, exit 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import HarnessError, InvalidArgument, PlanError
from ..checks import Check
from ..oracle import Verdict
from ..plan import OUTAGE_WINDOW_MS, CrashPoint, Fault, FaultPlan
from ._base import CaseSetting, FaultKind, Stops, register, signal_self

if TYPE_CHECKING:
    from ..adapter import Observation
    from ..case import CaseRun, WorkerRun
    from ..oracle import CrashEvidence
    from ..plan import Case
    from ..worker import Recorder


@dataclass
class Outage:
    """One case's db proxy (``proxy``: a :class:`~..faultproxy.client.ProxyHandle`) and
    the window in progress (``heal``: the task that enables the proxy again at its end)."""

    proxy: Any
    heal: asyncio.Task[None] | None = None
    #: what the window in progress did: ``link cut for S s``, ``healed after S s``
    log: list[str] = dataclasses.field(default_factory=list)


RESUMABLE = Check("db-outage.resumable", "resumability", "run given up for a brief outage", "crash",
                  "a database away for a while leaves the run resumable")


@register
class DbOutage(Stops, CaseSetting, FaultKind):
    """PostgreSQL unreachable for the fault's window while the worker runs on."""

    name = "db-outage"
    rank = 7
    listing_order = 9
    short = "dbo"
    unjudged = True  # a runtime may ride it out: its run then ends as the golden run did
    needs_fault_proxy = True
    mostly_waits = True  # a case lasts its window and the reconnections: nearly all waiting

    def act(self, recorder: Recorder, fault: Fault) -> None:
        signal_self(signal.SIGSTOP)  # the controller cuts the link while this worker sleeps

    @contextlib.asynccontextmanager
    async def setting(self, cx: CaseRun) -> AsyncIterator[None]:
        from ..faultproxy.client import NotFound
        from ..netfaults import upstream_of, with_port

        ex = cx.explorer
        if ex.fault_proxy is None:
            raise HarnessError("db-outage faults need the session's fault proxy (Explorer.fault_proxy is not set)")
        client = await ex.fault_proxy.client()
        env = ex.worker_env  # a net case's db proxy stays in the path
        name = f"cm-{cx.run_id.removeprefix('cm-run-')}-db-outage"
        proxy = await asyncio.to_thread(client.create, upstream_of(env.dsn, "db"), name, "127.0.0.1:0")
        outage = cx.kind_state[self.name] = Outage(proxy)
        try:
            with ex.scoped(worker_env=dataclasses.replace(env, dsn=with_port(env.dsn, proxy.port))):
                yield
        finally:
            if outage.heal is not None and not outage.heal.done():
                outage.heal.cancel()
            with contextlib.suppress(NotFound):
                await asyncio.to_thread(proxy.destroy)

    async def at_stop(self, cx: CaseRun, w: WorkerRun) -> None:
        outage: Outage = cx.kind_state[self.name]
        window = (w.fault.window_ms or OUTAGE_WINDOW_MS) / 1000
        await asyncio.to_thread(outage.proxy.disable)
        cut = time.monotonic()
        outage.log.append(f"link cut for {window:g} s")

        async def heal() -> None:
            await asyncio.sleep(max(0.0, cut + window - time.monotonic()))
            await asyncio.to_thread(outage.proxy.enable)
            outage.log.append(f"healed after {time.monotonic() - cut:.2f} s")

        outage.heal = asyncio.create_task(heal())

    async def after_worker(self, cx: CaseRun, w: WorkerRun) -> None:
        """Wait for the window's end (a worker that ended inside it leaves the database
        away until then), and check it ended healed."""
        outage: Outage = cx.kind_state[self.name]
        task, outage.heal = outage.heal, None
        if task is None:  # the worker never stopped at its point: the firing check says so
            return
        try:
            await task
        except Exception as exc:  # noqa: BLE001 - a window that did not end healed is ours
            raise HarnessError(f"db-outage window of {w.fault.label()} did not end healed: "
                               f"{type(exc).__name__}: {exc}") from exc
        w.entry["outage"] = "; ".join(outage.log)
        outage.log.clear()

    async def case_end(self, cx: CaseRun) -> None:
        outage: Outage = cx.kind_state[self.name]
        if not await asyncio.to_thread(lambda: outage.proxy.refresh().enabled):
            raise HarnessError("the database link was still cut after the last worker")

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        return [RESUMABLE.run(lambda: check_resumable(ev.observation))]


def check_resumable(obs: Observation) -> Verdict:
    """``db-outage.resumable`` (crash state of a ``db-outage`` fault): a database that was
    away for a while is never a reason to give a run up: after the worker the run is
    finished (``completed``) or left for a resume (``running``, ``interrupted``,
    ``paused``, ``pending``), not ``failed`` and not handed to a human."""
    if obs.status in ("completed", "running", "interrupted", "paused", "pending"):
        return Verdict("db-outage.resumable", "crash", True, f"status {obs.status}")
    return Verdict("db-outage.resumable", "crash", False,
                   f"the run ended {obs.status!r} after the database was unreachable for a while; "
                   f"it should have been left resumable")


def check_windows(cases: Iterable[Case] | None, kinds: Iterable[str], worker_timeout: float,
                  window_ms: int | None = None) -> None:
    """Refuse, before anything starts, an outage window the case deadline cannot hold:
    the ``db-outage`` faults of ``cases`` (None: the matrix is enumerated, and its
    ``kinds`` say whether it has db-outage cases, at ``window_ms`` or the default) against
    ``worker_timeout`` (seconds). Raises :class:`InvalidArgument` (one line, exit 2),
    also for a ``window_ms`` that is not a valid window."""
    if window_ms is not None:
        try:
            Fault("db-outage", CrashPoint("label", "x", "x"), window_ms=window_ms)
        except PlanError as exc:
            raise InvalidArgument(f"--outage-window: {exc}") from None
    if cases is None:
        windows = ([("the matrix's db-outage cases", window_ms or OUTAGE_WINDOW_MS)]
                   if "db-outage" in tuple(kinds) else [])
    else:
        windows = [(c.id, f.window_ms or OUTAGE_WINDOW_MS) for c in cases for f in c.plan.faults
                   if f.kind == "db-outage"]
    for where, ms in windows:
        if ms / 1000 >= worker_timeout:
            raise InvalidArgument(
                f"db-outage window {ms} ms of {where} is not shorter than the case deadline "
                f"(--worker-timeout {worker_timeout:g} s): the worker would be killed before the database is back")


def with_window(cases: list[Case], window_ms: int | None) -> list[Case]:
    """``cases`` with every ``db-outage`` fault's window set to ``window_ms`` (None: as
    they are): the matrix's enumerated cases under ``--outage-window``."""
    if window_ms is None:
        return cases

    def plan_of(plan: FaultPlan) -> FaultPlan:
        return FaultPlan(tuple(dataclasses.replace(f, window_ms=window_ms) if f.kind == "db-outage" else f
                               for f in plan.faults))

    return [dataclasses.replace(c, plan=plan_of(c.plan)) if any(f.kind == "db-outage" for f in c.plan.faults) else c
            for c in cases]
