"""Checks as declared objects, and their composition (in the spirit of Jepsen's
``compose``): each check is a :class:`Check` made where the check is defined, naming its
stable name, the property it protects (:data:`.properties.PROPERTIES`), the anomaly a
failure is, the moment it runs and a one-line doc. Making one registers it; a property
the table does not know, or a name declared twice with other words, raises
:class:`CheckDeclarationError` at import. :func:`property_of` and :func:`anomaly_of`
read the declarations (every verdict's JSON carries both: :func:`annotate`), and
docs/checks.md is held to them by ``tests/unit/test_unit_checks.py`` (names,
properties).

Verdicts are three-valued (:class:`Verdict`): ``valid`` (True), ``invalid`` (False) or
``unknown`` (None: the check raised; never a pass). :func:`compose` runs checks and
returns their verdicts in order; :mod:`.verdicts` holds the two compositions the case
flow calls (after each faulted worker; after the last resume). This module imports
nothing of the harness but the property table, so every module that defines a check
can import it.

A check whose name holds ``<kind>`` declares a family (``provider.<kind>.ledger_equal``:
one check per provider kind). The case flow's own checks (a run that does not end, a
resume that raised) are declared in :mod:`.case`, a resume policy's in :mod:`.policies`.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .properties import PROPERTIES

PHASES = ("crash", "end", "invariant", "resume")
"""When a check runs: at the crash state, at the end against the golden run, as an
invariant (golden run and every case's end, no golden run needed), or during a resume
policy's round."""


class CheckDeclarationError(ValueError):
    """A check declared with an unknown property or phase, or a name declared twice with
    other words; or a verdict of a check nobody declared."""


@dataclass
class Verdict:
    """One check's outcome. ``valid``: True, False (invalid) or None (unknown)."""

    check: str
    phase: str
    valid: bool | None
    details: str = ""
    diff: list[str] = field(default_factory=list)

    @property
    def word(self) -> str:
        return {True: "valid", False: "invalid", None: "unknown"}[self.valid]

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: check, phase, verdict word, details, diff, the ``property`` it
        protects and, when it did not pass, the ``anomaly`` (:func:`annotate`)."""
        return annotate({"check": self.check, "phase": self.phase, "verdict": self.word, "details": self.details,
                         "diff": self.diff})


def merge(verdicts: list[Verdict]) -> bool | None:
    """Invalid beats unknown beats valid; no verdicts at all is valid."""
    if any(v.valid is False for v in verdicts):
        return False
    if any(v.valid is None for v in verdicts):
        return None
    return True


def run_check(check: str, phase: str, fn: Callable[[], Verdict]) -> Verdict:
    """``fn()``, or an unknown verdict of ``check`` naming the exception it raised (a
    check that raises is unknown, never a pass)."""
    try:
        return fn()
    except Exception as exc:
        return Verdict(check, phase, None, f"check raised {type(exc).__name__}: {exc}")


_DECLARED: dict[str, Check] = {}
_FAMILIES: list[tuple[re.Pattern[str], Check]] = []


@dataclass(frozen=True)
class Check:
    """One declared check. ``name``: stable (reports, selftest rows, findings and users'
    CI filters use it; ``<kind>`` in it makes a family); ``property``: a key of
    :data:`.properties.PROPERTIES`; ``anomaly``: what a failure is (Elle's sense);
    ``phase``: one of :data:`PHASES` (the phase its verdicts carry: an invariant's is
    ``end``); ``doc``: one line, what it checks. ``refine``: optional, the failure's
    details -> a more precise anomaly (None: ``anomaly``). Registered when made;
    raises :class:`CheckDeclarationError`."""

    name: str
    property: str
    anomaly: str
    phase: str
    doc: str
    refine: Callable[[str], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.property not in PROPERTIES:
            raise CheckDeclarationError(f"check {self.name!r} declares property {self.property!r}, not one of "
                                        f"harness/properties.py's PROPERTIES: {', '.join(PROPERTIES)}")
        if self.phase not in PHASES:
            raise CheckDeclarationError(f"check {self.name!r} declares phase {self.phase!r}, not one of {PHASES}")
        old = _DECLARED.get(self.name)
        if old is not None:
            if old != self:
                raise CheckDeclarationError(f"check {self.name!r} declared twice, differently: {old} and {self}")
            return
        _DECLARED[self.name] = self
        if "<kind>" in self.name:
            pattern = re.escape(self.name).replace(re.escape("<kind>"), r"[^.]+")
            _FAMILIES.append((re.compile(pattern + r"\Z"), self))

    @property
    def verdict_phase(self) -> str:
        """The phase its verdicts carry (an invariant's: ``end``)."""
        return "end" if self.phase == "invariant" else self.phase

    def run(self, fn: Callable[[], Verdict], name: str | None = None) -> Verdict:
        """:func:`run_check` under this check's name (``name``: a family member's)."""
        return run_check(name or self.name, self.verdict_phase, fn)

    def verdict(self, valid: bool | None, details: str = "", diff: list[str] | None = None) -> Verdict:
        """A verdict of this check."""
        return Verdict(self.name, self.verdict_phase, valid, details, list(diff or []))

    def anomaly_for(self, details: str) -> str:
        """The anomaly a failure with ``details`` is."""
        return (self.refine(details) if self.refine is not None else None) or self.anomaly


def lookup(name: str) -> Check:
    """The declaration of check ``name`` (a family's member too: ``provider.payment.
    ledger_equal``). Raises :class:`CheckDeclarationError` for a name nobody declared:
    a check has a property, never ``other``."""
    for attempt in range(2):
        found = _DECLARED.get(name)
        if found is not None:
            return found
        for pattern, check in _FAMILIES:
            if pattern.match(name):
                return check
        if attempt == 0:
            declared()  # a verdict read back from a worker or a file: its module may not be imported yet
    raise CheckDeclarationError(f"check {name!r} is not declared (a Check(...) where it is defined: "
                                f"harness/checks.py)")


def property_of(check: str) -> str:
    """The property ``check`` protects, as its declaration says
    (``provider.payment.ledger_equal``: effect exactly-once). Raises
    :class:`CheckDeclarationError` for a check nobody declared."""
    return lookup(check).property


def anomaly_of(check: str, details: str = "") -> str:
    """The anomaly a failure of ``check`` is, refined by its ``details`` where the
    declaration says how (a provider ledger with a row too many is a duplicated effect,
    one too few a lost effect). Raises :class:`CheckDeclarationError` for a check
    nobody declared."""
    return lookup(check).anomaly_for(details)


def annotate(verdict: dict[str, Any]) -> dict[str, Any]:
    """A verdict's JSON record with its ``property`` (and, if it failed, ``anomaly``)."""
    out = dict(verdict, property=property_of(verdict["check"]))
    if verdict.get("verdict") != "valid":
        out["anomaly"] = anomaly_of(verdict["check"], verdict.get("details", ""))
    return out


def declared() -> dict[str, Check]:
    """Every check of the harness, by name: each module of ``crashmatrix.harness`` (the
    fault kinds' package too) imported once, so that each declaration ran. A module
    whose optional dependency is not installed (the pytest plugin without pytest) is
    left out: it reports no verdict there either."""
    for name in ("crashmatrix.harness", "crashmatrix.harness.faults"):  # by name: each imports this module
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if not info.ispkg:
                try:
                    importlib.import_module(info.name)
                except ModuleNotFoundError as exc:
                    if not (exc.name or "").split(".")[0] or (exc.name or "").startswith("crashmatrix"):
                        raise
    return dict(_DECLARED)


def compose(runs: Iterable[tuple[Check, Callable[[], Verdict]]]) -> list[Verdict]:
    """Each ``(check, fn)``'s verdict, in order: ``fn()``, or an unknown verdict of the
    check naming what it raised (:meth:`Check.run`)."""
    return [check.run(fn) for check, fn in runs]
