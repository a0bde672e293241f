"""The harness's exception hierarchy.

Every error the harness raises on purpose derives from :class:`CrashmatrixError`;
argument errors also subclass the matching builtin (as Hypothesis's ``InvalidArgument``
subclasses ``TypeError``), so callers that catch builtins keep working. Messages take
the form ``name=value!r must be ...`` and name what was wrong.
"""

from __future__ import annotations


class CrashmatrixError(Exception):
    """Base of every error crashmatrix raises on purpose."""


class InvalidArgument(CrashmatrixError, ValueError):
    """A caller passed an argument of the wrong shape or value."""


class PlanError(InvalidArgument):
    """A fault plan or case id is malformed: bad JSON, unknown fault kind, a crash point
    not in the golden trace, an occurrence out of range. The message names the field."""


class RegistryError(InvalidArgument, LookupError):
    """No subject, workload or mutant is registered under the requested name."""


class ServiceError(CrashmatrixError):
    """A service (PostgreSQL, a provider, the fault proxy) could not be started or
    reached. The message is one line naming the service and the address tried."""


class HarnessError(CrashmatrixError):
    """The harness itself failed to carry out a case: a fault that never fired, a worker
    that vanished without a report, a trace that diverged from the golden run before the
    fault. Reported separately from oracle failures (exit code 3, not 1)."""


class CaseNotApplicable(HarnessError):
    """A case whose fault cannot take effect on this subject, found once it runs (a
    runtime's cancel that cannot commit while the stopped worker holds its store's one
    write lock): the case is ``not-applicable`` with the message, never a failure nor a
    harness error."""


class NondeterministicWorkload(CrashmatrixError):
    """The two golden runs of a conversation differ in something the oracle compares,
    once their identifiers are renamed (docs/design.md, "Determinism"): the workload (or
    the subject) is not deterministic, so no case could be judged against the golden run.
    Raised before the first case (exit code 2). ``differences``: every place that
    differs, in words (the message names the first)."""

    def __init__(self, message: str, differences: list[str] | None = None) -> None:
        super().__init__(message)
        self.differences = differences or []


class GoldenRunRefused(CrashmatrixError):
    """The golden runs did not exercise what the workload declares (no effect applied
    at its effect providers, a provider's 5xx, effects from a workload that declares
    none: :func:`.golden.golden_effects`), so every case would pass vacuously. Raised
    before the first case (exit code 2); the message is one line naming the provider
    and what it answered."""


class AdapterContractError(CrashmatrixError):
    """The adapter breaks its contract in a way the harness checks before any case
    (docs/adapters.md): e.g. its ``observe`` does not see what a worker wrote on the
    server of the environment it was given. Exit code 2; the message names the method."""
