"""The fault-kind interface, its abilities, and the registry by name.

A fault kind is one small interface, as a toxic is in the fault proxy
(:mod:`crashmatrix.harness.faultproxy._toxics`): a class with a ``name``, a ``rank``
and one worker-side method, :meth:`FaultKind.act`. What only some kinds need is a
separate ability, a mixin the case runner (:class:`.case.CaseRun`)
tests with ``isinstance``:

* :class:`UnderLock`: the worker acts while it holds the recorder's lock, so no other
  thread of the subject runs between the ``fired`` report and the fault (kill);
* :class:`Drains`: once the worker reported firing it gets the drain grace period
  (``Options.term_grace``) before it is SIGKILLed (term);
* :class:`ObservesBefore`: the durable state before the worker started goes to the
  kind's crash checks (``CrashEvidence.before``; term: a drain before the worker took
  the run leaves it as it was);
* :class:`Stops`: the worker stops itself (SIGSTOP) at the point; the controller acts
  while it sleeps (:meth:`Stops.at_stop`), then wakes it (SIGCONT) and waits for its
  end as for any worker (pause, db-restart);
* :class:`CaseSetting`: the whole case runs inside a setting of the kind's
  (:meth:`CaseSetting.setting`: a PostgreSQL of its own, the links' proxies), entered
  once per case whichever worker the kind's fault is armed in, in registry order, and
  checked when the run is over (:meth:`CaseSetting.case_end`);
* :class:`SessionResource`: what the setting keeps for the session (a second
  PostgreSQL), released by :meth:`SessionResource.close_session`.

Every kind may add crash-state checks (:meth:`FaultKind.crash_checks`, run after the
generic ones on the state right after its worker) and act once its worker ended
(:meth:`FaultKind.after_worker`: what it left behind, whether it landed). Every kind
composes with a following fault: fault *i + 1* is armed in the worker that runs after
fault *i*'s worker, which for a :class:`Stops` kind is a worker that runs while it is
stopped (a pause's successor takes the run over from the sleeping worker).

``rank`` orders kinds from simplest to most involved, for shrinking (:mod:`.fuzz`);
``bare`` is False for a kind whose fault needs more than a point (a ``net`` fault's
toxic), which the matrix and depth 2 then do not draw from a point alone.

:data:`KINDS` maps names to instances, in listing order (``listing_order``, then the
name: the order of :func:`.faults.names` in help texts and messages; the dict lives in
:mod:`..fault_registry`, a leaf the plan grammar reads). A new kind is one module in this
package that defines a subclass decorated with :func:`register`: importing the package
imports every module of it whose name does not start with ``_``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, TYPE_CHECKING, ClassVar, TypeVar

from ..fault_registry import KINDS as _REGISTRY

if TYPE_CHECKING:  # the worker imports this module: the controller's types stay lazy
    from ..adapter import Observation
    from ..case import CaseRun, WorkerRun
    from ..explorer import Explorer
    from ..oracle import CrashEvidence, Verdict
    from ..plan import Fault
    from ..worker import Recorder


class FaultKind:
    """Base of every fault kind (module docstring)."""

    #: the kind's name in plans and case ids (``kill``)
    name: ClassVar[str] = ""
    #: simplicity for shrinking: lower is simpler (:func:`.fuzz.order_kinds`)
    rank: ClassVar[int] = 100
    #: where the kind stands in listings (:func:`.faults.names`: help texts, messages,
    #: conformance columns, the order :class:`CaseSetting` settings are entered in);
    #: kinds of equal position are listed by name. A new kind may leave the default:
    #: it is listed after the built-in ones
    listing_order: ClassVar[int] = 100
    #: the kind's column heading in the narrow summary table (:func:`.report.short`), at
    #: most 4 characters; empty: the name
    short: ClassVar[str] = ""
    #: its cases need the session's fault proxy (:attr:`.settings.RunSettings.wants_proxy`)
    needs_fault_proxy: ClassVar[bool] = False
    #: its fault may leave the run as the golden run ended and still have taken effect
    #: (a runtime that rides a database outage out): such a case is never ``not-run``
    #: (:func:`.coverage.fault_took_effect`)
    unjudged: ClassVar[bool] = False
    #: what most likely made a case of this kind not run (its fault changed nothing),
    #: the hint :func:`.coverage.not_run_reason` adds; empty: none
    why_not_run: ClassVar[str] = ""
    #: a crash point alone makes a fault of this kind (``net`` needs its toxic)
    bare: ClassVar[bool] = True
    #: the crash checks read the providers' ledgers too (``CrashEvidence.ledgers``)
    reads_ledgers: ClassVar[bool] = False
    #: its cases spend most of their wall time waiting, not on the CPU (a server's
    #: restart, a toxic's delay): the case loop runs them in lanes beside the ``jobs``
    #: slots (:class:`.runner.CaseLanes`)
    mostly_waits: ClassVar[bool] = False
    #: its cases hold a session-wide resource for their whole run (``db-restart``'s
    #: PostgreSQL), so no two run at once: the case loop never starts a second one
    #: while one is in flight (:class:`.runner.CaseLanes`)
    one_at_a_time: ClassVar[bool] = False
    #: the worker outlives the fault and ends as a fault-free one does (a cancellation,
    #: a toxic): its job may run in a long-lived worker (:mod:`..resident`); a kind that
    #: ends, signals or stops the process does not
    survives: ClassVar[bool] = False

    def not_applicable(self, adapter: Any) -> str | None:
        """Why a fault of this kind cannot test ``adapter``'s runtime, from what the
        adapter declares (``cancel-api`` without a cancel API): its cases are then
        ``not-applicable`` with this reason, never run, never counted failed. None:
        applicable (the default)."""
        return None

    async def before_matrix(self, ex: Explorer, conversation: str) -> None:
        """Once a matrix with faults of this kind is about to run on ``ex``'s session,
        after the golden runs, ``conversation`` a healthy one: what the kind checks of
        the subject before any case (``db-restart``: that ``observe`` reads the server it
        is given). Raises :class:`~.errors.CrashmatrixError` subclasses (one line). The
        default checks nothing."""

    def act(self, recorder: Recorder, fault: Fault) -> None:  # pragma: no cover - abstract
        """In the worker, right after ``fired`` was written: make the fault happen
        (a signal to itself, a cancellation, a toxic). May not return (kill)."""
        raise NotImplementedError

    @property
    def fires_under_lock(self) -> bool:
        """Whether the worker fires this kind's fault under its lock (:class:`UnderLock`)."""
        return isinstance(self, UnderLock)

    def crash_checks(self, ev: CrashEvidence) -> list[Verdict]:
        """The kind's own crash-state checks, run after the generic ones
        (:func:`.verdicts.crash_verdicts`); each wrapped in :func:`.checks.run_check`."""
        return []

    def allowance(self, ev: CrashEvidence) -> dict[str, int]:
        """Model calls the faulted worker left in flight, per node, that a resume may pay
        for again (the end check ``model.calls_billed``'s margin): by default what its
        whole trace shows unfinished (:func:`.oracle.in_flight_model_calls`)."""
        from ..oracle import in_flight_model_calls

        return in_flight_model_calls(ev.trace_full)

    def end_checks_only(self, cx: CaseRun) -> tuple[str, ...] | None:
        """The end checks a case this kind ended on its own keeps (the invariants that
        hold of any run: a final cancel's run is not meant to match the golden run), or
        None: the case's end checks are all of them (the default)."""
        return None

    async def after_worker(self, cx: CaseRun, w: WorkerRun) -> None:
        """In the controller, once the faulted worker ended (``w.exit`` and ``w.report``
        are set), before its firing is checked: what the kind left to clean up, and
        whether it landed. Raises :class:`~.errors.HarnessError` if it did not."""

    async def settle(self, cx: CaseRun, w: WorkerRun, obs: Observation) -> str:
        """In the controller, after the crash state (``obs``) was read and checked, before
        the next worker: what the fault's own recovery does to the waiting run (a
        ``cancel-api`` fault's resume through the runtime's API). Returns the status the
        next step of the case goes by. Default: ``obs.status``."""
        return obs.status


class UnderLock:
    """Ability: act under the recorder's lock (module docstring)."""


class Drains:
    """Ability: the drain grace period after firing (module docstring)."""


class ObservesBefore:
    """Ability: the state before the worker started goes to the crash checks."""


class Stops:
    """Ability: the worker stops itself at the point; the controller acts meanwhile."""

    #: wait for the worker's database sessions to go away after it ended (False: they
    #: went with a server that was restarted, or the worker never used this one)
    quiesce_database: ClassVar[bool] = True
    #: the worker's role in the case's report (``zombie``: it wakes after its run was
    #: taken over); None: ``start`` or ``resume`` as for any worker
    role: ClassVar[str | None] = None
    #: the worker wakes in the process it stopped in, its connections as they were (the
    #: controller acted on the run, not on the process's links): its job may run in a
    #: long-lived worker (:mod:`..resident`), stopped and woken there as a forked one
    #: is. False: what the controller does meanwhile cuts the process's links (a server
    #: restarted), which a later job of that process would meet
    wakes_intact: ClassVar[bool] = False

    async def at_stop(self, cx: CaseRun, w: WorkerRun) -> None:  # pragma: no cover - abstract
        """While the worker sleeps (SIGSTOP), after it reported firing (``w.pid`` is
        set). Then the pool wakes it (SIGCONT); a kind may end it here instead (the
        SIGCONT then finds it gone). Raising kills the worker and fails the case with
        the error."""
        raise NotImplementedError


class CaseSetting:
    """Ability: the case runs inside a setting of the kind's (module docstring)."""

    def setting(self, cx: CaseRun) -> contextlib.AbstractAsyncContextManager[None]:  # pragma: no cover - abstract
        """An async context manager around the whole case. Raises
        :class:`~.errors.HarnessError` when the setting cannot be made."""
        raise NotImplementedError

    async def case_end(self, cx: CaseRun) -> None:
        """After the last worker, before the end checks, inside the setting; raises
        :class:`~.errors.HarnessError` if the kind left something behind."""


class SessionResource:
    """Ability: something kept for the session, released when its explorer closes."""

    async def close_session(self, ex: Explorer) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def signal_self(signum: int) -> None:
    """Send ``signum`` to this process (a worker's own fault)."""
    os.kill(os.getpid(), signum)


def die_now() -> None:  # pragma: no cover - the process is gone
    """SIGKILL this process and never return."""
    os.kill(os.getpid(), signal.SIGKILL)
    while True:  # SIGKILL is not delivered asynchronously late
        time.sleep(1)


KINDS: dict[str, FaultKind] = _REGISTRY
"""Registered fault kinds by name: the built-in ones in listing order, any registered
after the package's import after them."""

_K = TypeVar("_K", bound=type[FaultKind])


def register(cls: _K) -> _K:
    """Class decorator: register an instance of ``cls`` under ``cls.name``. Raises
    ``ValueError`` for an empty or duplicate name."""
    if not cls.name or cls.name in KINDS:
        raise ValueError(f"fault kind name {cls.name!r} is empty or already registered")
    KINDS[cls.name] = cls()
    return cls
