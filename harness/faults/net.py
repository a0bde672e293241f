"""``net``: a Toxiproxy toxic on one link of the subject from the point until its heal
(docs/design.md, "Fault kinds, precisely"; the fault model and the matrix's network
section are :mod:`..netfaults`'s).

A case with a ``net`` fault anywhere in its plan gets, on the session's fault proxy,
one proxy per poisoned link (``db`` or a provider kind), and its workers an environment
whose DSN or provider URLs point at them (:class:`..netfaults.CaseLinks`), for the whole
case. In the worker, at the point, the toxic is added before the subject goes on
(:class:`..netfaults.LinkToxic`); it is removed at its heal point or when the worker
ends (a ``healed`` event). Once the worker ended the controller removes whatever toxic
is left and says where it was healed (the worker's ``healed`` field); a fault that
fired without landing (``fault-error``) is a harness error; no toxic may be left after
the last worker. Crash check: ``net.resumable``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..errors import HarnessError
from ..history import FaultError, WorkerReport
from ..checks import Check
from ..oracle import Verdict
from ._base import CaseSetting, FaultKind, register

if TYPE_CHECKING:
    from ..adapter import Observation
    from ..case import CaseRun, WorkerRun
    from ..oracle import CrashEvidence
    from ..plan import Fault
    from ..worker import Recorder


RESUMABLE = Check("net.resumable", "resumability", "run lost to a network fault", "crash",
                  "a broken link leaves the run resumable")


@register
class Net(CaseSetting, FaultKind):
    """A toxic on one link from the point until its heal."""

    name = "net"
    survives = True
    rank = 4
    listing_order = 5
    unjudged = True  # a runtime may ride it out: its run then ends as the golden run did
    needs_fault_proxy = True
    bare = False  # a net fault needs its toxic (plan.NetToxic)
    mostly_waits = True  # ~0.75 s a case, most of it the toxic's latency and the client's timeouts

    def act(self, recorder: Recorder, fault: Fault) -> None:
        from ..netfaults import LinkToxic

        try:
            toxic = LinkToxic.from_env(fault, recorder.env)
            toxic.add()
        except Exception as exc:  # the fault did not land: a harness error, never the subject's
            recorder.emit(FaultError(f"{type(exc).__name__}: {exc}"))
            os._exit(70)
        recorder.lasting = toxic

    @contextlib.asynccontextmanager
    async def setting(self, cx: CaseRun) -> AsyncIterator[None]:
        from ..netfaults import CaseLinks, check_links

        ex = cx.explorer
        check_links(cx.case, ex.workload.providers)
        if ex.fault_proxy is None:
            raise HarnessError("net faults need the session's fault proxy (Explorer.fault_proxy is not set)")
        client = await ex.fault_proxy.client()
        links = {f.net.link for f in cx.case.plan.faults if f.net is not None}
        async with CaseLinks(client, ex.case_env, links, cx.run_id.removeprefix("cm-run-")) as case_links:
            cx.kind_state[self.name] = case_links
            with ex.scoped(worker_env=case_links.worker_env):
                yield

    async def after_worker(self, cx: CaseRun, w: WorkerRun) -> None:
        leftovers = await cx.kind_state[self.name].heal_all()
        w.entry["healed"] = heal_report(w.fault, w.report, leftovers)
        errors = w.report.fault_errors
        if errors:
            raise HarnessError(f"fault {w.fault.label()} fired but did not land: {errors[0].error}")

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        return [RESUMABLE.run(lambda: check_resumable(ev.observation))]

    async def case_end(self, cx: CaseRun) -> None:
        if await cx.kind_state[self.name].heal_all():
            raise HarnessError("a toxic was still on a link after the last resume")


def check_resumable(obs: Observation) -> Verdict:
    """``net.resumable`` (crash state of a ``net`` fault): a broken link is never a reason
    to give up: after the faulted worker the run is finished (``completed``) or left for
    a resume (``running``, ``interrupted``, ``paused``), not ``failed``, not handed to a
    human (``needs_human``: a probe that could not reach its provider is "cannot tell
    yet", not "cannot tell")."""
    if obs.status in ("completed", "running", "interrupted", "paused", "pending"):
        return Verdict("net.resumable", "crash", True, f"status {obs.status}")
    return Verdict("net.resumable", "crash", False,
                   f"the run ended {obs.status!r} after a network fault; it should have been left resumable")


def heal_report(fault: Fault, report: WorkerReport, leftovers: list[str]) -> str:
    """Where the toxic was removed: ``at NAME[TASK]#N`` or ``at worker-end`` (with the
    heal point the worker did not reach), ``by the controller after the worker ended``,
    or ``never added``."""
    healed = report.healed
    if healed:
        where = healed[0].where()
        heal = fault.net.heal if fault.net is not None else None
        missed = heal is not None and where == "worker-end"
        return f"at {where}" + (f" (heal point {heal.label()} not reached)" if missed and heal else "")
    return "by the controller after the worker ended" if leftovers else "never added"


