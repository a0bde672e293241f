"""Subjects, workloads and mutants, found by importable name.

A worker, ``crashmatrix replay`` and the test suite all reach a subject the same way:
by a registry name that maps to ``"package.module:attribute"``. Nothing crosses a process
boundary but the name. Mutants (``scenarios/defects``) register as subjects named
``defect:<name>``.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from .errors import RegistryError

SUBJECTS: dict[str, str] = {
    "reference": "crashmatrix.harness.adapters.reference:ReferenceAdapter",
    "reference-delta": "crashmatrix.harness.adapters.reference:ReferenceDeltaAdapter",
    "reference-fork": "crashmatrix.harness.adapters.reference:ReferenceForkAdapter",
    "endpoint": "crashmatrix.harness.adapters.endpoint:EndpointAdapter",
    # runtimes nobody here wrote, each behind its extra (docs/findings.md); loading one
    # without its extra raises RegistryError naming the extra to install
    "pydantic-ai-sqlite": "crashmatrix.harness.adapters.pydantic_ai:PydanticAISqliteAdapter",
    "pydantic-ai-postgres": "crashmatrix.harness.adapters.pydantic_ai:PydanticAIPostgresAdapter",
    "openai-agents-sqlite": "crashmatrix.harness.adapters.openai_agents:OpenAIAgentsSqliteAdapter",
    "openai-agents-postgres": "crashmatrix.harness.adapters.openai_agents:OpenAIAgentsPostgresAdapter",
    "llamaindex": "crashmatrix.harness.adapters.llamaindex:LlamaIndexAdapter",
    "dbos": "crashmatrix.harness.adapters.dbos:DBOSSqliteAdapter",
    "dbos-postgres": "crashmatrix.harness.adapters.dbos:DBOSPostgresAdapter",
    "langgraph": "crashmatrix.harness.adapters.langgraph:LangGraphAioSqliteSyncDrainAdapter",
    "absurd": "crashmatrix.harness.adapters.absurd:AbsurdAdapter",
    "burr": "crashmatrix.harness.adapters.burr:BurrAdapter",
    "restate": "crashmatrix.harness.adapters.restate:RestateAdapter",
    "prefect": "crashmatrix.harness.adapters.prefect:PrefectAdapter",
    "crewai": "crashmatrix.harness.adapters.crewai:CrewAIAdapter",
}
WORKLOADS: dict[str, str] = {
    "checkout": "crashmatrix.scenarios.checkout:WORKLOAD",
    "drift": "crashmatrix.scenarios.drift:WORKLOAD",
    "research": "crashmatrix.scenarios.research:WORKLOAD",
    "long_run": "crashmatrix.scenarios.long_run:WORKLOAD",
    "human_pause": "crashmatrix.scenarios.human_pause:WORKLOAD",
    "report": "crashmatrix.scenarios.report:WORKLOAD",
    "support_desk": "crashmatrix.scenarios.support_desk:WORKLOAD",
    "upgrade_shop": "crashmatrix.scenarios.upgrades.shop:WORKLOAD",
    # the checkout conversations written for each runtime nobody here wrote, with keyed
    # tools (scenarios/realworld; each runs on its runtime's subject above)
    **{f"{runtime}_checkout": f"crashmatrix.scenarios.realworld.{runtime}_checkout:KEYED"
       for runtime in ("absurd", "burr", "crewai", "dbos", "langgraph", "llamaindex", "openai_agents", "prefect",
                       "pydantic_ai", "restate")},
}


def load(target: str) -> Any:
    """Import ``"package.module:attribute"``; raises :class:`RegistryError`."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        obj: Any = module
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
        return obj
    except ModuleNotFoundError as exc:
        hint = ""
        if exc.name and module_name.split(".")[0] == exc.name.split(".")[0]:
            # the target's own package is missing, not one of its imports; workers start
            # with ``python -P``, so the current directory is never on their path
            hint = " (install its package, or put the directory that holds it on PYTHONPATH)"
        raise RegistryError(f"cannot import {target!r}: {exc}{hint}") from None
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"cannot import {target!r}: {exc}") from None
    except Exception as exc:  # the module itself raised on import (a SyntaxError names its file and line)
        raise RegistryError(f"cannot import {target!r}: {type(exc).__name__}: {exc}") from None


def _all_subjects() -> dict[str, str]:
    from crashmatrix.scenarios.defects import MUTANTS
    from crashmatrix.scenarios.upgrades import BUILDS  # later builds, for build pairs

    return {**SUBJECTS, **BUILDS, **{f"defect:{k}": v for k, v in MUTANTS.items()}}


def subject_names() -> list[str]:
    return sorted(_all_subjects())


def _importable(name: str, registered: dict[str, str]) -> bool:
    """``module:attribute`` (dotted or not), unless it is a misspelt registered name of
    the ``prefix:name`` kind (``defect:unfenced-lease``)."""
    module, sep, attr = name.partition(":")
    if not (sep and module and attr):
        return False
    return not any(known.startswith(module + ":") for known in registered)


def _instantiate(name: str, cls: Any) -> Any:
    from .adapter import Adapter

    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise RegistryError(f"subject={name!r} is {cls!r}, not a subclass of crashmatrix.harness.adapter.Adapter")
    try:
        return cls()
    except TypeError as exc:  # abstract methods left, or an __init__ that wants arguments
        raise RegistryError(f"subject={name!r}: {exc}") from None


@cache
def subject(name: str) -> Any:
    """A fresh adapter instance for the subject ``name`` (cached per process): a
    registered name, or an importable ``"module:AdapterClass"`` (how another team's
    adapter is reached without registering it here). Raises :class:`RegistryError`."""
    table = _all_subjects()
    if name in table:
        return _instantiate(name, load(table[name]))
    if _importable(name, table):
        return _instantiate(name, load(name))
    raise RegistryError(f"subject={name!r} is not registered{_did_you_mean(name, table)}; known: "
                        f"{_known_subjects(name, sorted(table))} (or give module:AdapterClass)")


def _did_you_mean(name: str, known: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest names of ``known`` (difflib), or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _known_subjects(name: str, names: list[str]) -> str:
    """The subjects to name after an unknown ``name``: the mutants when it names one
    (``defect:...``), else the runtimes and a count of the mutants (the whole list is
    ``crashmatrix list subjects``), so the line stays readable."""
    mutants = [n for n in names if n.startswith("defect:")]
    if name.startswith("defect:"):
        return ", ".join(mutants)
    others = ", ".join(n for n in names if not n.startswith("defect:"))
    return f"{others}, and {len(mutants)} mutants defect:NAME (crashmatrix list subjects)" if mutants else others


def workload_names() -> list[str]:
    return sorted(WORKLOADS)


@cache
def workload(name: str) -> Any:
    """The workload object registered as ``name``, or an importable
    ``"module:WORKLOAD"``. Raises :class:`RegistryError`."""
    if name in WORKLOADS:
        return load(WORKLOADS[name])
    if _importable(name, WORKLOADS):
        return load(name)
    raise RegistryError(f"workload={name!r} is not registered{_did_you_mean(name, WORKLOADS)}; known: "
                        f"{', '.join(sorted(WORKLOADS))} (or give module:WORKLOAD)")
