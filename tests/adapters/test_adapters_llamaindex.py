"""LlamaIndex Workflows as a subject (harness/adapters/llamaindex.py): context snapshots
at every step end, as LlamaIndex's "Writing durable workflows" page does them; what the
matrix found, pinned for the installed version (measured on llama-index-workflows 2.26.1).

A failure whose message says "now" means LlamaIndex changed: re-run the matrices of
docs/findings.md's "LlamaIndex Workflows" section and update it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("workflows", reason="LlamaIndex adapter tests need the extra: pip install 'crashmatrix[llamaindex]'")

ADAPTER = "crashmatrix.harness.adapters.llamaindex:LlamaIndexAdapter"
WL = "crashmatrix.scenarios.realworld.llamaindex_checkout"


def test_app_is_importable_without_starting_anything() -> None:
    code = (f"import threading, crashmatrix.harness.adapters.llamaindex, {WL}; "
            "assert threading.active_count() == 1, threading.enumerate(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_finished_context_run_again_starts_the_workflow_over() -> None:
    """Why the adapter judges completion itself: a snapshot taken after the StopEvent
    (``is_running`` false), given to ``run(ctx=...)``, runs the workflow again from its
    StartEvent, on the state it carries (a context is shared across runs, by design)."""
    from workflows import Context, Workflow, step
    from workflows.events import StartEvent, StopEvent

    class Count(Workflow):
        @step
        async def count(self, ctx: Context, ev: StartEvent) -> StopEvent:
            async with ctx.store.edit_state() as state:
                state["runs"] = state.get("runs", 0) + 1
            return StopEvent(result=await ctx.store.get("runs"))

    async def main() -> tuple[Any, Any, bool]:
        first = Count().run()
        result = await first
        snapshot = first.ctx.to_dict()
        workflow = Count()
        again = await workflow.run(ctx=Context.from_dict(workflow, snapshot))
        return result, again, snapshot["is_running"]

    result, again, running = asyncio.run(main())
    assert (result, running) == (1, False)
    assert again == 2, f"now a finished context is {again!r} when run again: LlamaIndex changed; update docs/findings.md"


def test_cancel_run_cancels_a_step_in_flight() -> None:
    """``handler.cancel_run()`` (what the adapter calls when its caller is cancelled)
    cancels the step that is running: the step's work after its await never happens and
    the run ends ``WorkflowCancelledByUser``."""
    from workflows import Context, Workflow, step
    from workflows.errors import WorkflowCancelledByUser
    from workflows.events import StartEvent, StopEvent

    effects: list[str] = []

    class Slow(Workflow):
        @step
        async def work(self, ctx: Context, ev: StartEvent) -> StopEvent:
            await asyncio.sleep(0.5)
            effects.append("done")
            return StopEvent(result="done")

    async def main() -> BaseException | None:
        handler = Slow().run()
        await asyncio.sleep(0.05)
        await handler.cancel_run()
        await asyncio.sleep(0.7)
        try:
            await handler
        except BaseException as exc:  # noqa: BLE001 - the run's end is what is pinned
            return exc
        return None

    ended = asyncio.run(main())
    assert effects == [] and isinstance(ended, WorkflowCancelledByUser), (effects, ended)


def test_kills_between_effect_and_snapshot_and_a_cancelled_caller(matrix_cases: Any) -> None:
    """Keyed: a kill after the charge, before the snapshot that follows it, runs the step
    again with the same key (one charge). Naive: twice. A cancel of the caller at the
    charge step's start reaches the workflow only through ``cancel_run``, a message to
    its control loop; the step runs in the workflow's own task and has sent the charge by
    then: the charge is made, its end never snapshotted, and the resume makes it again."""
    keyed = matrix_cases(ADAPTER, f"{WL}:KEYED",
                         ["kill@step.after[tool-4.0]#1", "cancel@step.before[tool-4.0]#1"], goldens=2)
    first, second = keyed.golden_traces["conv1"]
    assert first == second, "LlamaIndex: two golden runs reached different points; update docs/findings.md"
    golden = keyed.cases[0].golden.evidence.observation
    assert golden.status == "completed" and [e.node_id for e in golden.log][-1] == "model-6"
    for case in keyed.cases:
        assert case.result.outcome == "pass" and case.extra("payment") == 0, (case.result.case.id, case.why())

    naive = matrix_cases(ADAPTER, f"{WL}:NAIVE", ["kill@step.after[tool-4.0]#1", "cancel@step.before[tool-4.0]#1"])
    for case in naive.cases:
        assert case.failed == {"provider.payment.ledger_equal", "effects.applied_once"} and case.extra("payment") == 1, (
            f"LlamaIndex, naive: {case.result.case.id} now {case.why()}; update docs/findings.md")


def _core_venv(version: str, entry: str = "llamaindex-17938") -> Any:
    """The corpus's venv of llama-index-core ``version`` (``crashmatrix bugs --entry
    ENTRY`` makes the entry's two), with this tree's crashmatrix installed again (the
    subject's workers run the copy in its venv), or skip saying how to make it."""
    from crashmatrix.harness import bugs
    from crashmatrix.harness.errors import InvalidArgument

    try:
        bugs.source_tree()  # the corpus installs this tree into the release's venv
    except InvalidArgument as exc:  # an installed crashmatrix (CI's wheel): ci/bugs-nightly.yml runs these
        pytest.skip(str(exc))
    venv = bugs.cache_dir() / f"llama-index-core-{version}"
    if not (venv / ".crashmatrix-bugs").is_file():
        pytest.skip(f"no llama-index-core {version} venv at {venv}: crashmatrix bugs --entry {entry} makes it")
    made, status, detail = bugs.ensure_venv("llama-index-core", version, log=lambda line: None)
    assert status == "ok", detail
    return made


def _replay(tmp_path: Any, venv: Any, case: str) -> tuple[str, set[str]]:
    """``crashmatrix replay case --subject llamaindex@venv``: the case's outcome and its
    failing checks."""
    import json

    report = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "crashmatrix.harness.cli", "replay", case, "--subject",
                           f"llamaindex@{venv}", "--report", str(report)], capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    data = json.loads(report.read_text())
    [result] = [c for r in (data.get("reports") or [data]) for c in r["cases"]]
    return result["outcome"], {v["check"] for v in result["verdicts"] if v.get("verdict") != "valid"}


@pytest.mark.parametrize("version, outcome", [("0.12.21", "pass"), ("0.12.20", "fail")])
def test_llama_index_core_012_checkpoints_resume_from_the_last_step(tmp_path: Any, version: str, outcome: str) -> None:
    """llama-index-core 0.12's embedded engine, in a venv of its own: the adapter saves the
    ``WorkflowCheckpointer``'s checkpoint after every step and resumes with ``run_from``.
    A kill after model-2's checkpoint committed: 0.12.21 resumes at tool-2.0 and finishes
    as the golden run did; 0.12.20 delivers the restored step's event twice (``run_from``
    sends it, then the run's start re-sends it as in progress), so the resumed run runs
    the tool step again on an empty pending list and fails."""
    got, failed = _replay(tmp_path, _core_venv(version), f"{WL}:KEYED/conv1/kill@log.append.after[model-2]#1")
    assert got == outcome, (got, failed)
    if outcome == "fail":
        assert "resume.runs" in failed, failed


@pytest.mark.parametrize("version, outcome", [("0.12.23", "pass"), ("0.12.22", "fail")])
def test_a_person_in_the_loop_on_llama_index_core_012(tmp_path: Any, version: str, outcome: str) -> None:
    """The approval workflow (``llamaindex_human``): the adapter's operator answers each
    ``InputRequiredEvent`` on the stream with a ``HumanResponseEvent``. A kill before the
    receipt: 0.12.23 resumes from the last checkpoint and finishes; 0.12.22 left each
    asking step in progress (its ``InputRequiredEvent`` path skips the removal), so the
    restored context runs the plan and the first review again: the plan's model turn is
    billed again and the person asked again."""
    venv = _core_venv(version, entry="llamaindex-18019")
    got, failed = _replay(tmp_path, venv, "crashmatrix.scenarios.realworld.llamaindex_human:KEYED/approve/"
                                          "kill@step.before[tool-1.1]#1")
    assert got == outcome, (got, failed)
    if outcome == "fail":
        # the plan's turn billed again every time; whether the second answer lands in
        # the transcript before the re-run fails depends on timing (interrupt.answers)
        assert "model.calls_billed" in failed, failed


def test_a_person_in_the_loop_answers_a_restored_run_that_waits(matrix_cases: Any) -> None:
    """The approval workflow on llama-index-workflows 2.x: a kill after the snapshot of the
    first answer's step. The restored run does not ask its pending question again; the
    adapter's operator answers what the snapshot says it waits on (review#2), and the run
    ends as the golden run did, each answer consumed once."""
    s = matrix_cases(ADAPTER, "crashmatrix.scenarios.realworld.llamaindex_human:KEYED",
                     ["approve/kill@log.append.after[human-review-1]#1"])
    [case] = s.cases
    assert case.result.outcome == "pass", case.why()
    checks = {v.check: v for v in case.result.verdicts}
    assert checks["interrupt.answers"].valid and "each answered once" in checks["interrupt.answers"].details
