"""What the LangGraph and DBOS tests share: chosen cases of a matrix, on real services.

Imports neither runtime (each test module skips itself when its extra is missing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class CaseRun:
    """One case's result, its end evidence and its conversation's golden run."""

    result: Any
    evidence: Any
    golden: Any

    @property
    def failed(self) -> set[str]:
        return {v.check for v in self.result.failed}

    def why(self) -> list[tuple[str, str]]:
        return [(v.check, v.details) for v in self.result.failed]

    def extra(self, kind: str) -> int:
        """Model calls billed (``"model"``) or provider rows (``"payment"``,
        ``"mail"``) beyond the golden run's."""
        if kind == "model":
            return sum(self.evidence.model_calls.values()) - sum(self.golden.evidence.model_calls.values())
        return len(self.evidence.ledgers[kind]) - len(self.golden.evidence.ledgers[kind])

    @property
    def workers(self) -> list[dict[str, Any]]:
        """How each worker of the case ended (role, returncode, signal...)."""
        return self.result.workers


@dataclass
class Session:
    """The cases run, and every golden run's trace (per conversation, in run order)."""

    cases: list[CaseRun]
    golden_traces: dict[str, list[list[Any]]] = field(default_factory=dict)


def run_cases(subject: str, workload: str, ids: list[str], *, await_points: bool = False,
              goldens: int = 1) -> Session:
    """Start one session for ``subject`` and ``workload``; run ``goldens`` golden runs of
    each conversation the ids name (``"conv3/kill@..."``, ``"approve/kill@..."``; no
    prefix: ``conv1``), then
    each case. A case that ends in a harness error fails the test there."""
    from crashmatrix.harness.explorer import Options
    from crashmatrix.harness.plan import Case
    from crashmatrix.harness.session import open_session

    def split(case_id: str) -> tuple[str, str]:
        conv, sep, rest = case_id.partition("/")
        return (conv, rest) if sep and "@" not in conv else ("conv1", case_id)  # a plan always has an @

    async def main() -> Session:
        session = Session([])
        async with open_session(subject, workload, options=Options(await_points=await_points)) as explorer:
            golden = {}
            for conv in dict.fromkeys(split(i)[0] for i in ids):
                for _ in range(goldens):
                    golden[conv] = await explorer.golden(conv)
                    session.golden_traces.setdefault(conv, []).append(golden[conv].trace)
            for case_id in ids:
                conv, rest = split(case_id)
                result = await explorer.run_case(Case.parse(f"{workload}/{conv}/{rest}"), golden[conv])
                assert result.outcome != "harness-error", f"{case_id}: {result.error}"
                session.cases.append(CaseRun(result, await explorer.evidence(result.run_id), golden[conv]))
        return session

    return asyncio.run(main())


@pytest.fixture
def matrix_cases() -> Callable[..., Session]:
    """:func:`run_cases`, for the adapter tests."""
    return run_cases


@pytest.fixture(scope="module")
def module_cases() -> Callable[..., Session]:
    """:func:`run_cases` for module-scoped fixtures (one session serving several tests)."""
    return run_cases


@pytest.fixture
def imports_start_nothing() -> Callable[..., None]:
    """:func:`assert_imports_start_nothing`, for the adapter tests."""
    return assert_imports_start_nothing


def assert_imports_start_nothing(*modules: str) -> None:
    """Import ``modules`` in a fresh interpreter and fail unless it still has one thread
    (workers fork from a parent that imported them: docs/adapters.md, lesson 2)."""
    import subprocess
    import sys

    code = (f"import threading, {', '.join(modules)}; "
            "assert threading.active_count() == 1, threading.enumerate(); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
