"""A matrix's names, resolved and checked once, before anything starts.

A workload, a subject (one build, or a build pair: :mod:`.builds`), fault kinds,
crash-point sources and conversations arrive as strings: from the command line, from a
caller of :func:`.matrix.run_matrix`. :func:`resolve` checks every one of them (each
error one line naming the field: :class:`~.errors.RegistryError` for an unknown
workload or subject, :class:`~.errors.InvalidArgument` for the rest) and returns
:class:`Names`, frozen, which the rest receives and does not check again.
:func:`choices` is the one parser of a comma-separated list of names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import plan, registry
from .fault_registry import names as fault_kinds
from .errors import InvalidArgument


def choices(value: str | Sequence[str], allowed: Sequence[str], field_name: str) -> tuple[str, ...]:
    """``value`` (comma-separated, or a sequence of names) as a tuple of names, each one
    of ``allowed``. Raises :class:`InvalidArgument` (``"kinds='kill,boom': each item must
    be one of kill, term, ..."``) for an unknown name, or for a string that names none."""
    items = (tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str)
             else tuple(str(v).strip() for v in value))
    if any(v not in allowed for v in items) or (isinstance(value, str) and not items):
        raise InvalidArgument(f"{field_name}={value!r}: each item must be one of {', '.join(allowed)}")
    return items


@dataclass(frozen=True)
class Names:
    """What a matrix runs, by name, checked (:func:`resolve`).

    ``subject``: the session's subject, a build pair as ``A_SPEC>>B_SPEC``
    (:func:`.builds.pair`); ``upgrade``: that pair parsed (:class:`.builds.Upgrade`),
    None for one build. ``kinds`` (may be empty: a matrix of sampled kinds only) and
    ``sources``: registered fault kinds and crash-point sources, in the given order.
    ``conversations``: the ones asked for, each the workload's; None: every one of the
    workload's (or, given cases, those of the cases). ``workload_object``: the
    registry's workload."""

    workload: str
    subject: str
    kinds: tuple[str, ...] = plan.DEFAULT_KINDS
    sources: tuple[str, ...] = plan.DEFAULT_SOURCES
    conversations: tuple[str, ...] | None = None
    workload_object: Any = field(default=None, compare=False, repr=False)
    upgrade: Any = field(default=None, compare=False, repr=False)


def check_workload(given: str, wl: Any) -> None:
    """Raise :class:`InvalidArgument`, one line, unless ``wl`` (the workload ``given``
    names) has the members every workload has (docs/adapters.md, "The workload object"):
    ``name`` (a str), ``conversations`` and ``providers`` (non-empty for conversations;
    sequences of str) and a callable ``run_input``."""
    problems = []
    if not isinstance(getattr(wl, "name", None), str):
        problems.append("name (a str)")
    for member in ("conversations", "providers"):
        value = getattr(wl, member, None)
        if isinstance(value, str) or not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value) \
                or (member == "conversations" and not value):
            problems.append(f"{member} (a tuple of str{', not empty' if member == 'conversations' else ''})")
    if not callable(getattr(wl, "run_input", None)):
        problems.append("run_input(conversation) (a method)")
    if problems:
        raise InvalidArgument(f"workload {given!r} ({type(wl).__name__}) lacks {', '.join(problems)}: "
                              f"docs/adapters.md, \"The workload object\"")


def resolve(
    workload: str, subject: str = "reference", *, kinds: str | Sequence[str] = plan.DEFAULT_KINDS,
    sources: str | Sequence[str] = plan.DEFAULT_SOURCES, conversations: Sequence[str] | None = None,
    resume_with: str | None = None,
) -> Names:
    """Resolve and check a matrix's names (module docstring): the workload (a registered
    name or ``module:WORKLOAD``), the subject (with ``resume_with``, the build pair
    ``subject>>resume_with``; its builds checked by :func:`.builds.check_subject`), the
    kinds and sources (:func:`choices`; kinds read from :func:`.faults.names` at call
    time, so a kind registered later counts) and the conversations. Raises
    :class:`~.errors.RegistryError` or :class:`InvalidArgument`, one line."""
    from .builds import check_subject, pair, parse_subject

    wl = registry.workload(workload)
    check_workload(workload, wl)
    if resume_with:
        subject = pair(subject, resume_with)
    check_subject(subject, workload)
    kinds_t = choices(kinds, fault_kinds(), "kinds")
    sources_t = choices(sources, plan.POINT_SOURCES, "sources")
    if conversations is not None:
        conversations = tuple(conversations)
        for conv in conversations:
            if conv not in wl.conversations:
                raise InvalidArgument(f"conversation={conv!r} is not one of {', '.join(wl.conversations)}")
    return Names(workload, subject, kinds_t, sources_t, conversations, wl, parse_subject(subject))
