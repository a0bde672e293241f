"""The public-bug corpus: since-fixed durability bugs of released runtimes, each run by
the generic harness against its buggy and its fixing release.

An entry (:class:`Entry`, the data in :data:`ENTRIES`) names a public report (repository,
issue or pull request, link, the fixing change), the PyPI distribution with its buggy
and fixing releases, and the ordinary ``crashmatrix run`` command that should show it:
the shipped adapter (``subject``), a shipped workload, fault kinds, crash-point sources,
resume policy and conversation, and the check names expected to fail (``symptom``: a
failing check whose name starts with one of them names the symptom). An entry the
shipped adapters and workloads cannot express carries ``needs``: the capability missing
(it is reported "not found" with that reason and never installed).

:func:`run_entry` installs each release into a virtual environment of its own, cached
under :func:`cache_dir` (``<cache>/<dist>-<version>``: crashmatrix from this source tree
plus ``dist==version`` and the entry's ``pins``; a resolver conflict is reported as
"needs the subject in its own environment"), then runs the command with
``--subject SUBJECT@VENV`` in a child ``crashmatrix`` process and reads its JSON report.
An entry is **found** when the buggy release fails with a check naming the symptom and
the fixing release passes; anything else is **not found** with the reason
(:func:`judge`). :func:`markdown` and :func:`to_json` render the table
(docs/findings.md, "Public-bug corpus").

Inside :func:`guarded` (the CLI's ``crashmatrix bugs``), every child (``venv``, ``pip``,
the child ``crashmatrix run``) runs in a session of its own registered with a watchdog
(:mod:`.services.watchdog`), and so is the crashmatrix wheel's temporary directory: a
SIGKILLed ``crashmatrix bugs`` leaves no process and no directory behind.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import InvalidArgument
from .services.process import signal_group, stop_process_groups
from .services.watchdog import Watchdog

AD = "crashmatrix.harness.adapters"
RW = "crashmatrix.scenarios.realworld"
CACHE_ENV = "CRASHMATRIX_BUGS_CACHE"
"""Environment variable naming the venv cache directory (default ``~/.cache/crashmatrix/bugs``)."""
INSTALL_TIMEOUT = 1800.0
"""Seconds one venv's ``pip install`` may take."""
RUN_TIMEOUT = 1800.0
"""Seconds one release's ``crashmatrix run`` may take."""
OUTCOMES = ("found", "not found")


@dataclass(frozen=True)
class Entry:
    """One public, since-fixed durability bug.

    ``name`` (``runtime-number``), ``title`` (the symptom in a line), ``repo``
    (``owner/name``), ``ref`` (the upstream tracker's name, e.g. dbos-transact-py's ``issue 742``, ``PR 6640``), ``url``, ``fix`` (the
    fixing change, a link), ``dist`` (PyPI distribution), ``buggy`` and ``fixed``
    (releases; ``""`` when none exists), ``pins`` (further requirements of both venvs),
    ``subject`` (a registered subject or ``module:Adapter``), ``workload``, ``kinds``,
    ``sources``, ``resume`` (a resume policy), ``conversation``, ``symptom`` (check-name
    prefixes), ``plan`` (empty: the matrix of ``kinds`` x ``sources``; else exactly this
    fault plan, written as in a case id, ``KIND@NAME[TASK]#N+...``, replayed as one case:
    a fault placed where no enumerated case puts it), ``needs`` (None when the shipped
    harness can run it; else the capability it lacks), ``expect`` (``found``/``not found``: the last measured outcome, which a
    nightly run compares against)."""

    name: str
    title: str
    repo: str
    ref: str
    url: str
    fix: str
    dist: str
    buggy: str
    fixed: str
    subject: str = ""
    workload: str = ""
    kinds: tuple[str, ...] = ("kill",)
    sources: tuple[str, ...] = ("step", "label")
    resume: str = "default"
    conversation: str = "conv1"
    symptom: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()
    needs: str | None = None
    expect: str = "not found"
    plan: str = ""

    def command(self, venv: str | Path = "VENV", report: str | Path = "REPORT") -> list[str]:
        """The ``crashmatrix`` arguments (after the program name) for one release
        installed in ``venv``: the release both crashes and resumes each case (a build
        pair of one venv, :mod:`.builds`: how a subject runs from a venv of its own). An
        entry with a ``plan`` replays that one case (``crashmatrix replay``, its id naming
        the pair's builds, :meth:`case_id`); else ``crashmatrix run`` of the matrix."""
        pair = ["--subject", f"{self.subject}@{venv}", "--resume-with", f"{self.subject}@{venv}"]
        if self.plan:
            return ["replay", self.case_id(venv), *pair, "--report", str(report), "--replay-failures", "0"]
        return ["run", self.workload, *pair, "--kinds", ",".join(self.kinds),
                "--sources", ",".join(self.sources), "--resume", self.resume, "--conversation", self.conversation,
                "--report", str(report), "--replay-failures", "0", "--jobs", "1", "--no-prune"]

    def case_id(self, venv: str | Path = "VENV") -> str:
        """The case id of the entry's ``plan`` run with the release in ``venv`` as both
        builds (labelled after the venv's directory, ``-a`` crashing and ``-b``
        resuming, as :func:`.builds.parse_subject` labels one venv given twice)."""
        label = Path(venv).name
        policy = "" if self.resume == "default" else f"/{self.resume}"
        return f"{self.workload}/{self.conversation}/{self.plan}{policy}/upgrade:{label}-a>{label}-b"

    def validate(self) -> list[str]:
        """What is wrong with the entry (empty: nothing)."""
        from .errors import PlanError

        problems = []
        if self.plan:
            from .plan import Case

            try:
                Case.parse(self.case_id())
            except PlanError as exc:
                problems.append(f"plan: {exc}")
        if not self.name or not self.repo or "/" not in self.repo or not self.url.startswith("https://"):
            problems.append("name, repo (owner/name) and url (https://) are required")
        if self.expect not in OUTCOMES:
            problems.append(f"expect={self.expect!r} must be one of {OUTCOMES}")
        if self.needs is None:
            if not (self.subject and self.workload and self.kinds and self.symptom and self.buggy and self.fixed):
                problems.append("a runnable entry (needs None) needs subject, workload, kinds, symptom, buggy and fixed")
        elif self.expect == "found":
            problems.append("an entry with needs cannot be expected found")
        return problems


D_SUBJECT = f"{AD}.dbos:DBOSSqliteAdapter"
"""DBOS on SQLite, where most DBOS entries were measured; ``DBOSPostgresAdapter`` runs the
2.x releases too (its ``migrate`` runs the 2.x CLI's migration), for an entry whose
report names PostgreSQL."""
D_WORKLOAD = f"{RW}.dbos_checkout:KEYED"
"""The keyed tools (idempotency keys from DBOS's own ids): a kill between a naive tool's
request and its step record charges twice on any runtime, which would hide the bug."""
D_SYMPTOM = ("concurrent.", "effects.", "provider.", "model.calls_billed")
"""A recovery that runs a workflow twice: a second owner, an effect or a model call
applied twice."""
D_QUEUED = f"{RW}.dbos_checkout:QUEUED_KEYED"
"""The keyed checkout enqueued on a DBOS queue: DBOS recovers a queued workflow by handing
it back to its queue (``clear_queue_assignment``) rather than running it in the recoverer,
so two recoverers of one run meet the queued path, not the direct re-execution path."""
DBOS = "dbos-inc/dbos-transact-py"
D_PG_SUBJECT = f"{AD}.dbos:DBOSPostgresAdapter"
"""DBOS on PostgreSQL: a ``db-outage`` cuts the link to a PostgreSQL server."""
D_RECOVERY_LISTED = "recovery.listed[recovery]"
"""The point DBOS's recovery sweep passes once it has read the executor's pending
workflows (``DBOSAdapter.recovery_point``): an outage placed there begins between the
pending list and the re-enqueue."""

ENTRIES: tuple[Entry, ...] = (
    Entry("dbos-742", "a second recoverer with a stale pending list runs a queued workflow another recoverer "
          "already handed back to its queue", DBOS, "issue 742", f"https://github.com/{DBOS}/issues/742",
          f"https://github.com/{DBOS}/pull/744", "dbos", "2.25.0", "2.26.0", D_SUBJECT, D_QUEUED,
          ("kill",), resume="concurrent", symptom=D_SYMPTOM, expect="found"),
    Entry("dbos-786", "recovery is not idempotent: two processes recovering one workflow both run its remaining "
          "steps (fixed by routing recovery through queues, conditioned on the workflow still naming a dead "
          "executor)", DBOS, "PR 786", f"https://github.com/{DBOS}/pull/786", f"https://github.com/{DBOS}/pull/786",
          "dbos", "2.28.0", "2.29.0", D_SUBJECT, D_WORKLOAD, ("kill",), resume="concurrent", symptom=D_SYMPTOM,
          expect="found"),
    Entry("dbos-773", "two executions of one workflow clobber each other's outcome (an outcome written when the "
          "status is no longer PENDING)", DBOS, "PR 773", f"https://github.com/{DBOS}/pull/773",
          f"https://github.com/{DBOS}/pull/773", "dbos", "2.27.0", "2.28.0", D_SUBJECT, D_WORKLOAD, ("kill",),
          resume="concurrent", symptom=D_SYMPTOM),
    Entry("dbos-801", "a workflow's final status is written even when the row is no longer PENDING: a second "
          "execution overwrites the first one's outcome", DBOS, "PR 801", f"https://github.com/{DBOS}/pull/801",
          f"https://github.com/{DBOS}/pull/801", "dbos", "2.29.0", "2.30.0", D_SUBJECT, D_WORKLOAD, ("kill",),
          resume="concurrent", symptom=D_SYMPTOM),
    Entry("dbos-703", "a workflow cancelled right before it completes moves on to SUCCESS or ERROR: cancellation "
          "is not terminal", DBOS, "PR 703", f"https://github.com/{DBOS}/pull/703", f"https://github.com/{DBOS}/pull/703",
          "dbos", "2.23.0", "2.24.0", D_SUBJECT, D_WORKLOAD, ("cancel-api",),
          symptom=("cancel", "run.", "durable", "effects.", "provider."), expect="found"),
    Entry("dbos-721", "a recv_async cancelled while its setup thread is in flight leaves its notifications entry "
          "behind: the next recv of that workflow and topic in the process fails as a concurrent execution", DBOS,
          "PR 721", f"https://github.com/{DBOS}/pull/721", f"https://github.com/{DBOS}/pull/721", "dbos", "2.23.0",
          "2.24.0", D_SUBJECT, f"{RW}.dbos_human:KEYED", ("cancel",), resume="same-worker", conversation="approve",
          symptom=("run.", "resume.", "interrupt.", "same.worker")),
    Entry("dbos-716", "a PostgreSQL restart during recover_pending_workflows strands the dead executor's "
          "workflows in PENDING forever", DBOS, "issue 716", f"https://github.com/{DBOS}/issues/716",
          f"https://github.com/{DBOS}/pull/717", "dbos", "2.23.0", "2.24.0", D_PG_SUBJECT, D_QUEUED,
          ("kill", "db-outage"), symptom=("worker.stuck", "run.", "resume."), expect="found",
          plan=f"kill@step.after[model-1]#1+db-outage(2000ms)@{D_RECOVERY_LISTED}#1"),
    Entry("dbos-805", "a recovered queued workflow stays PENDING between completed steps and blocks a "
          "concurrency-1 queue", DBOS, "issue 805", f"https://github.com/{DBOS}/issues/805",
          f"https://github.com/{DBOS}/issues/805", "dbos", "2.26.0", "",
          needs="a fixing release: no change naming the issue is in the repository snapshot read (tags to 2.30.0, "
          "main to 2026-08-21); the queued workload (dbos_checkout:QUEUED_KEYED) would carry the run, on a queue "
          "without a concurrency limit"),
    Entry("dbos-804", "during a rolling restart the draining executor (same executor id) re-claims a queued "
          "workflow that the new executor's launch recovery just re-enqueued, stranding it PENDING", DBOS,
          "issue 804", f"https://github.com/{DBOS}/issues/804", f"https://github.com/{DBOS}/issues/804", "dbos",
          "2.30.0", "",
          needs="a fixing release (the closing change is not in the repository snapshot read); a resume policy "
          "that launches the recovering worker while the SIGTERMed one still drains (term and the resume are "
          "sequential), and an adapter that drains on SIGTERM (the DBOS adapter installs no SIGTERM handler: a "
          "term fault kills its worker at once, term.drained fails on every release, measured on 2.25.0 with "
          "dbos_checkout:CHILD_KEYED); and a workload with a forked workflow asleep in DBOS.sleep"),
    Entry("dbos-732", "an asyncio cancel of a workflow while it launches a child clears the workflow context: the "
          "child is launched with a blank workflow id", DBOS, "PR 732", f"https://github.com/{DBOS}/pull/732",
          f"https://github.com/{DBOS}/pull/732", "dbos", "2.25.0", "2.26.0",
          needs="a shutdown that ends the workflow while its parent is inside start_workflow_async (the fix reads "
          "the child's id before the to_thread dispatch, against a concurrent end_workflow on shutdown): the "
          "child-workflow workload exists (dbos_checkout:CHILD_KEYED), but a cancel fault cancels the adapter's "
          "wait, not the workflow task (DBOS shields it), and the adapter installs no SIGTERM handler, so no "
          "fault shuts DBOS down inside that dispatch (measured on 2.25.0: cancel@log.append.after[model-1] "
          "passes, term there fails term.drained as on every release)"),
    Entry("dbos-740", "a database error retried inside a workflow operation increments its function id again "
          "(get_result, child workflow start) or consumes a second message (recv): the recorded steps no longer "
          "line up with the code on recovery", DBOS, "PR 740", f"https://github.com/{DBOS}/pull/740",
          f"https://github.com/{DBOS}/pull/740", "dbos", "2.25.0", "2.26.0",
          needs="a database fault that fails one operation of the parent and not the one before it: with the "
          "child-workflow workload (dbos_checkout:CHILD_KEYED) on PostgreSQL, a db-outage at "
          "log.append.after[child_tool-2.1] or step.after[model-1] passes on 2.25.0 (the child's own outcome "
          "write waits the outage out first, so the parent's record_get_result, the retry that counts its "
          "function id again, runs against a healed database); a fault that loses a commit's acknowledgement "
          "(committed, the client sees the connection fail) or an outage that begins inside one operation "
          "would reach it; db-outage and db-restart cut the link at a crash point, between operations"),
    Entry("dbos-722", "DBOS.destroy deadlocks when called from the loop DBOS adopted while a workflow timeout "
          "task is pending on it: a worker that shuts down never exits", DBOS, "PR 722",
          f"https://github.com/{DBOS}/pull/722", f"https://github.com/{DBOS}/pull/722", "dbos", "2.24.0", "2.25.0",
          f"{AD}.dbos:DBOSSqliteLoopAdapter", f"{RW}.dbos_checkout:TIMED_KEYED", ("kill",),
          symptom=("run.ends", "worker.stuck", "resume.runs"), expect="found"),
    Entry("pydantic-ai-6640", "ModelRetry raised by a tool through a DBOS step with retries allowed re-runs the "
          "side-effecting tool call up to max_attempts", "pydantic/pydantic-ai", "PR 6640",
          "https://github.com/pydantic/pydantic-ai/pull/6640", "https://github.com/pydantic/pydantic-ai/pull/6640",
          "pydantic-ai-slim", "", "",
          needs="an adapter that wires MCP toolsets with DBOSDurability(mcp_step_config={'retries_allowed': "
          "True}) and a workload whose tool raises ModelRetry (the Pydantic AI adapter and workload have neither); "
          "the buggy and fixing releases are not determined"),
    Entry("pydantic-ai-6907", "on Prefect, tool-call results never replay: non-idempotent tools re-execute on "
          "a flow retry (the cache key depends on pickle object sharing)", "pydantic/pydantic-ai", "issue 6907",
          "https://github.com/pydantic/pydantic-ai/issues/6907", "https://github.com/pydantic/pydantic-ai/pull/6944",
          "pydantic-ai-slim", "2.21.0", "2.22.0",
          needs="an adapter for Pydantic AI's Prefect durability (PrefectAgent: model requests and tool calls as "
          "Prefect tasks cached by their inputs; the shipped Pydantic AI adapters run on DBOS only; Prefect itself "
          "runs here: the Prefect adapter starts a local API server on SQLite), and a way to see a tool re-executed "
          "on the retry that the checkout's tools hide: a keyed tool repeats its key, so the provider applies the "
          "charge once and every ledger matches the golden run; a naive tool charges twice on the buggy release, "
          "but on the fixing one too wherever the kill lands between the request and the task's persisted result "
          "(at-least-once), so the fixing release cannot pass. The releases: 2.22.0 is the first wheel whose "
          "_cache_policies.py projects a ToolsetTool to its ToolDefinition (PR 6944, read in the wheels)"),
    Entry("crewai-6113", "with checkpointing on, an agent running two sequential tasks replays the first task's "
          "completed methods as a resume and never reaches a final answer", "crewAIInc/crewAI", "PR 6113",
          "https://github.com/crewAIInc/crewAI/pull/6113", "https://github.com/crewAIInc/crewAI/pull/6113",
          "crewai", "", "1.14.7",
          needs="a buggy release on PyPI: the bug lived between a development commit (FlowStartedEvent no longer "
          "gated by suppress_flow_events, so the Flow-based AgentExecutor joined the checkpointed state) and its "
          "fix, both before 1.14.7, which has the fix (_restored_from_checkpoint); 1.14.6 still gates the event "
          "(read in the wheels), so its executor never joins the checkpoint. Also a CrewAI adapter that runs a "
          "Crew with agents, tasks and CheckpointConfig and a CrewAI LLM answering from the model provider (the "
          "shipped one runs a Flow with @persist)"),
    Entry("llamaindex-18019", "a workflow resumed from a serialized Context (to_dict/from_dict with "
          "JsonSerializer) does not continue where it stopped", "run-llama/llama_index", "issue 18019",
          "https://github.com/run-llama/llama_index/issues/18019", "https://github.com/run-llama/llama_index/pull/18023",
          "llama-index-core", "0.12.22", "0.12.23",
          "llamaindex", f"{RW}.llamaindex_human:KEYED", ("kill",), conversation="approve",
          symptom=("interrupt.", "model.calls_billed", "resume.runs", "transcript."), expect="found"),
    Entry("llamaindex-17938", "a context restored with Context.from_dict counts its in-progress events twice (once "
          "when restored, once when the run starts), and a stopped run's task never cancels", "run-llama/llama_index",
          "PR 17938", "https://github.com/run-llama/llama_index/pull/17938",
          "https://github.com/run-llama/llama_index/pull/17938", "llama-index-core", "0.12.20", "0.12.21",
          "llamaindex", f"{RW}.llamaindex_checkout:KEYED", ("kill",),
          symptom=("resume.runs", "model.calls_billed", "transcript.", "provider.", "effects."), expect="found"),
    Entry("llamaindex-281", "ctx.to_dict() of a workflow resumed from a snapshot fails with 'Worker N not found in "
          "in_progress': a resumed run cannot be snapshotted again", "run-llama/llama-agents", "issue 281",
          "https://github.com/run-llama/llama-agents/issues/281", "https://github.com/run-llama/llama-agents/pull/282",
          "llama-index-workflows", "2.12.1", "2.12.2", "llamaindex", f"{RW}.llamaindex_checkout:KEYED", ("kill",),
          symptom=("resume.runs", "run.status"), expect="found"),
    Entry("absurd-95", "a run cancelled (or failed) after its worker claimed it raises out of the worker instead of "
          "ending as terminal control flow", "earendil-works/absurd", "issue 95",
          "https://github.com/earendil-works/absurd/issues/95",
          "https://github.com/earendil-works/absurd/commit/4aec33eaa8f227249c3234f57a806b1fd7c9a6d1", "absurd-sdk",
          "0.3.0", "0.4.0", f"{AD}.absurd:AbsurdAdapter", f"{RW}.absurd_checkout:KEYED", ("cancel-api",), pins=("absurdctl",),
          symptom=("cancel.", "run.", "worker.", "resume."), expect="found"),
    Entry("langgraph-6161", "on a nested (subgraph) resume, already-completed @task writes are not reused and the "
          "task re-executes", "langchain-ai/langgraph", "PR 6161", "https://github.com/langchain-ai/langgraph/pull/6161",
          "https://github.com/langchain-ai/langgraph/pull/6227", "langgraph", "0.6.7", "",
          needs="a fixing release (the fix shipped in 0.6.8 and was reverted in 0.6.9 by PR 6227), and a workload "
          "with a subgraph that interrupts and resumes (the LangGraph checkout workload has none)"),
    Entry("absurd-16", "a task whose claim expired continues its existing run on reclaim instead of starting a new "
          "run: the attempt count is undercounted", "earendil-works/absurd", "issue 16",
          "https://github.com/earendil-works/absurd/issues/16", "https://github.com/earendil-works/absurd/pull/17",
          "absurd-sdk", "", "0.0.1",
          needs="a buggy release on PyPI (the fix merged before absurd-sdk's first upload), and a check on run "
          "attempt counts (the oracle compares effects and state, not the runtime's attempt bookkeeping)"),
)
"""Every entry, in the order the table shows them."""


def entries(names: list[str] | tuple[str, ...] = ()) -> list[Entry]:
    """The entries named (all when empty), in :data:`ENTRIES` order. Raises
    :class:`InvalidArgument` naming an unknown entry."""
    known = {e.name: e for e in ENTRIES}
    for n in names:
        if n not in known:
            raise InvalidArgument(f"--entry {n!r} is not in the corpus; known: {', '.join(known)}")
    return [e for e in ENTRIES if not names or e.name in names]


def cache_dir() -> Path:
    """The venv cache: ``$CRASHMATRIX_BUGS_CACHE``, default ``~/.cache/crashmatrix/bugs``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "crashmatrix" / "bugs")


def source_tree() -> Path:
    """This crashmatrix's source tree (the directory holding ``pyproject.toml``). Raises
    :class:`InvalidArgument` when crashmatrix runs from an installed wheel."""
    tree = Path(__file__).resolve().parents[1]
    if not (tree / "pyproject.toml").is_file():
        raise InvalidArgument(f"crashmatrix runs from {tree}, not a source tree: the corpus installs this tree into "
                              "each release's venv")
    return tree


@dataclass
class Side:
    """One release's run: ``release``, ``venv``, ``status`` (``passed`` / ``failed`` /
    ``install-conflict`` / ``install-failed`` / ``error``), the failing ``checks`` (name ->
    failing cases), ``cases``, ``failed`` cases, ``harness_errors``, ``not_run`` (cases
    whose fault could not take effect), ``exit`` (the run's
    exit code), ``detail`` (one line: the first failure, or why it did not run),
    ``first_failure`` (its replay command) and ``seconds``."""

    release: str
    venv: str = ""
    status: str = "error"
    checks: dict[str, int] = field(default_factory=dict)
    cases: int = 0
    failed: int = 0
    harness_errors: int = 0
    not_run: int = 0
    exit: int | None = None
    detail: str = ""
    first_failure: str = ""
    seconds: float = 0.0


@dataclass
class Result:
    """An entry's outcome: ``outcome`` (``found`` / ``not found``), ``why`` (one line),
    and each release's :class:`Side` (None when it was not run)."""

    entry: Entry
    outcome: str
    why: str
    buggy: Side | None = None
    fixed: Side | None = None

    def to_dict(self) -> dict[str, Any]:
        e = dataclasses.asdict(self.entry)
        return {"entry": e, "command": ["crashmatrix", *self.entry.command()] if self.entry.needs is None else None,
                "outcome": self.outcome, "why": self.why, "regressed": self.entry.expect == "found" and
                self.outcome != "found", "buggy": dataclasses.asdict(self.buggy) if self.buggy else None,
                "fixed": dataclasses.asdict(self.fixed) if self.fixed else None}


def load(path: Path) -> list[Result]:
    """The results of a corpus report written by :func:`write`, each re-attached to the
    current entry of its name (an entry no longer in :data:`ENTRIES` is dropped).
    Raises ``OSError``/``ValueError``/``KeyError`` for a missing or malformed file."""
    known = {e.name: e for e in ENTRIES}
    out = []
    for r in json.loads(Path(path).read_text())["results"]:
        entry = known.get(r["entry"]["name"])
        if entry is None:
            continue
        sides = [Side(**r[k]) if r.get(k) else None for k in ("buggy", "fixed")]
        out.append(Result(entry, r["outcome"], r["why"], *sides))
    return out


def read_report(path: Path) -> dict[str, Any]:
    """The figures of one ``crashmatrix run`` JSON report (its cases and its golden
    runs' results, ``golden_results``: a golden run that fails is a failing case):
    ``cases``, ``failed``,
    ``harness_errors``, ``not_run``, ``checks`` (failing check name -> cases), ``first`` (the first
    failing case's replay command), ``first_line`` (its case id and checks) and
    ``first_error`` (the first harness error's message and case id, one line). Raises
    ``OSError``/``ValueError`` for a missing or malformed file."""
    data = json.loads(Path(path).read_text())
    reports = data.get("reports") or data.get("matrices") or [data]
    out: dict[str, Any] = {"cases": 0, "failed": 0, "harness_errors": 0, "not_run": 0, "checks": {}, "first": "",
                           "first_line": "", "first_error": ""}
    for rep in reports:
        # a golden run that fails (the release breaks with no fault) counts as a failing case
        for c in [*rep.get("cases", []), *rep.get("golden_results", [])]:
            out["cases"] += 1
            if c.get("outcome") == "harness-error":
                out["harness_errors"] += 1
                if not out["first_error"]:
                    lines = str(c.get("error") or "no error recorded").splitlines() or [""]
                    out["first_error"] = f"{lines[0]} (case {c.get('id')})"
            if c.get("outcome") == "not-run":
                out["not_run"] += 1
            if c.get("outcome") not in ("fail", "flaky"):
                continue
            out["failed"] += 1
            names = list(dict.fromkeys(v["check"] for v in c.get("verdicts", []) if v.get("verdict") != "valid"))
            for n in names:
                out["checks"][n] = out["checks"].get(n, 0) + 1
            if not out["first"]:
                out["first"] = c.get("replay", "")
                out["first_line"] = f"{c.get('id')}: {', '.join(names)}"
        for name, g in (rep.get("golden") or {}).items():
            if isinstance(g, dict) and g.get("error"):
                out["first_line"] = out["first_line"] or f"golden {name}: {str(g['error']).splitlines()[0]}"
    return out


def symptom_checks(entry: Entry, checks: dict[str, int]) -> list[str]:
    """The failing checks of ``checks`` whose name starts with one of the entry's
    symptom prefixes."""
    return [c for c in checks if any(c.startswith(p) for p in entry.symptom)]


def judge(entry: Entry, buggy: Side | None, fixed: Side | None) -> tuple[str, str]:
    """``(outcome, why)`` of an entry from its two sides (module docstring)."""
    if entry.needs is not None:
        return "not found", f"needs {entry.needs}"
    assert buggy is not None and fixed is not None
    for side, which in ((buggy, "buggy"), (fixed, "fixing")):
        if side.status == "install-conflict":
            return "not found", (f"needs the subject in its own environment: {entry.dist}=={side.release}'s pins "
                                 f"conflict with crashmatrix's ({side.detail})")
        if side.status == "error" and side.cases and side.harness_errors == side.cases:
            return "not found", (f"every case of the {which} release {side.release} was a harness error: "
                                 f"{side.detail}")
        if side.status in ("install-failed", "error"):
            return "not found", f"the {which} release {side.release} did not run: {side.detail}"
    named = symptom_checks(entry, buggy.checks)
    if buggy.status == "passed":
        unrun = f", {buggy.not_run} of them not run (the fault could not take effect)" if buggy.not_run else ""
        return "not found", (f"the buggy release {buggy.release} passed all {buggy.cases} cases{unrun}: the matrix "
                             "does not reach the bug with the shipped adapter and workload")
    if not named:
        return "not found", (f"the buggy release {buggy.release} failed on {', '.join(buggy.checks) or 'no check'}, "
                             f"none naming the symptom ({', '.join(entry.symptom)})")
    if fixed.status != "passed":
        return "not found", (f"the fixing release {fixed.release} fails too ({', '.join(fixed.checks) or fixed.detail}): "
                             "what the buggy release shows is not this bug alone")
    return "found", (f"{buggy.release}: {buggy.failed}/{buggy.cases} cases fail ({', '.join(named)}); "
                     f"{fixed.release}: {fixed.cases}/{fixed.cases} pass")


_CONFLICT_MARKS = ("ResolutionImpossible", "conflicting dependencies", "Cannot install")


INTERRUPT_GRACE_S = 10.0
"""Seconds a child (a ``crashmatrix run`` writing its partial report) has to end after
the SIGINT :func:`_call` passes on, before its group is stopped."""


@dataclass
class _Guard:
    watchdog: Watchdog
    wheels: dict[Path, Path] = field(default_factory=dict)  # tree -> its wheel, built in the block


_GUARD: contextvars.ContextVar[_Guard | None] = contextvars.ContextVar("crashmatrix_bugs_guard", default=None)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Within this block, :func:`run_entry` and :func:`ensure_venv` run their children
    in sessions of their own registered with a watchdog started here, and the wheel's
    directory is registered too: however this process ends (SIGKILL included), the
    watchdog stops the children (SIGTERM, SIGKILL 2 s later) and removes the directory.
    The wheels built inside are removed when it ends. Raises
    :class:`~.errors.ServiceError` when the watchdog cannot start."""
    guard = _Guard(Watchdog.start())
    token = _GUARD.set(guard)
    try:
        yield
    finally:
        _GUARD.reset(token)
        for wheel in guard.wheels.values():
            shutil.rmtree(wheel.parent, ignore_errors=True)
            guard.watchdog.forget_path(wheel.parent)
        guard.watchdog.close()


def _call(cmd: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end, stdout and stderr captured as text; never raises on the
    exit code. Inside :func:`guarded` it runs in a session of its own, registered with
    the watchdog; as that session does not see the terminal's Ctrl-C, a
    ``KeyboardInterrupt`` here is passed on (SIGINT to its group, up to
    :data:`INTERRUPT_GRACE_S` to end) before the group is stopped. Raises
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the child stopped and
    reaped) and ``OSError`` when ``cmd`` cannot be executed."""
    guard = _GUARD.get()
    if guard is None:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    with subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        guard.watchdog.watch_pgid(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) and signal_group(proc.pid, signal.SIGINT):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(INTERRUPT_GRACE_S)
            stop_process_groups([proc], grace_s=2.0)  # type: ignore[list-item]
            raise
        finally:
            guard.watchdog.forget_pgid(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


_WHEELS: dict[Path, Path] = {}


def _wheel(tree: Path) -> Path:
    """crashmatrix's wheel built from ``tree``, once per process, or per :func:`guarded`
    block inside one (into a temporary directory removed at exit, or at the block's
    end). Raises ``subprocess.CalledProcessError`` when the build fails."""
    guard = _GUARD.get()
    wheels = _WHEELS if guard is None else guard.wheels
    if tree not in wheels:
        out = Path(tempfile.mkdtemp(prefix="crashmatrix-wheel-"))
        if guard is None:
            import atexit

            atexit.register(shutil.rmtree, out, True)
        else:
            guard.watchdog.watch_path(out)
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
               "-w", str(out), str(tree)]
        built = _call(cmd, timeout=INSTALL_TIMEOUT)
        if built.returncode != 0:
            shutil.rmtree(out, ignore_errors=True)
            if guard is not None:
                guard.watchdog.forget_path(out)
            raise subprocess.CalledProcessError(built.returncode, cmd, built.stdout, built.stderr)
        wheels[tree] = next(out.glob("crashmatrix-*.whl"))
    return wheels[tree]


def ensure_venv(dist: str, version: str, pins: tuple[str, ...] = (), *, cache: Path | None = None,
                tree: Path | None = None, log: Callable[[str], None] = print) -> tuple[Path, str, str]:
    """A venv holding crashmatrix (this tree) and ``dist==version`` (plus ``pins``),
    made once under ``cache`` and reused (a ``.crashmatrix-bugs`` marker records its
    requirements; crashmatrix itself is reinstalled from the tree on every call, so
    the worker side matches the controller). Returns ``(venv, status, detail)``:
    status ``ok``, ``install-conflict`` (the resolver found no solution) or
    ``install-failed`` (detail: the last line pip printed)."""
    cache = cache or cache_dir()
    tree = tree or source_tree()
    venv = cache / f"{dist}-{version}"
    marker = venv / ".crashmatrix-bugs"
    reqs = [f"{dist}=={version}", *pins]
    py = venv / "bin" / "python"

    def pip(args: list[str]) -> tuple[int, str]:
        p = _call([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                  timeout=INSTALL_TIMEOUT)
        return p.returncode, p.stdout + p.stderr

    if not (marker.is_file() and marker.read_text().split("\n") == reqs and py.exists()):
        log(f"  installing {' '.join(reqs)} into {venv}")
        cache.mkdir(parents=True, exist_ok=True)
        made = _call([sys.executable, "-m", "venv", "--clear", str(venv)], timeout=300)
        if made.returncode != 0:
            return venv, "install-failed", f"python -m venv: {(made.stderr or made.stdout).strip()[-300:]}"
        rc, out = pip([str(_wheel(tree)), *reqs])
        if rc != 0:
            lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
            status = "install-conflict" if any(m in out for m in _CONFLICT_MARKS) else "install-failed"
            return venv, status, (lines[-1] if lines else f"pip exited {rc}")[:300]
        marker.write_text("\n".join(reqs))
    else:
        rc, out = pip(["--no-deps", "--force-reinstall", str(_wheel(tree))])
        if rc != 0:
            return venv, "install-failed", f"reinstalling crashmatrix: {out.strip().splitlines()[-1:]}"
    return venv, "ok", ""


def run_side(entry: Entry, version: str, out_dir: Path, *, cache: Path | None = None,
             log: Callable[[str], None] = print) -> Side:
    """Install ``version`` (:func:`ensure_venv`) and run the entry's command against it
    in a child ``crashmatrix`` process; the JSON report is kept under ``out_dir``."""
    t0 = time.monotonic()
    side = Side(release=version)
    venv, status, detail = ensure_venv(entry.dist, version, entry.pins, cache=cache, log=log)
    side.venv = str(venv)
    if status != "ok":
        side.status, side.detail = status, detail
        side.seconds = round(time.monotonic() - t0, 1)
        return side
    report = out_dir / f"{entry.name}-{version}.json"
    report.unlink(missing_ok=True)
    exe = Path(sys.executable).with_name("crashmatrix")
    cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "crashmatrix.harness.cli"]),
           *entry.command(venv, report)]
    log(f"  {entry.name} {entry.dist}=={version}: {' '.join(cmd[1:])}")
    try:
        p = _call(cmd, timeout=RUN_TIMEOUT)
        side.exit = p.returncode
        tail = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
    except subprocess.TimeoutExpired:
        side.exit, tail = None, [f"timed out after {RUN_TIMEOUT:.0f} s"]
    figures: dict[str, Any] | None = None
    if report.exists():
        try:
            figures = read_report(report)
        except (OSError, ValueError, KeyError) as exc:
            tail = [f"unreadable report {report}: {exc}"]
    if figures is not None:
        side.cases, side.failed, side.checks = figures["cases"], figures["failed"], figures["checks"]
        side.harness_errors, side.first_failure = figures["harness_errors"], figures["first"]
        side.not_run = figures["not_run"]
        side.detail = figures["first_line"]
    if side.exit == 0:
        side.status = "passed"
    elif side.exit == 1 and side.failed:
        side.status = "failed"
    else:
        side.status = "error"
        why = figures["first_error"] if figures and figures["first_error"] else (tail[-1] if tail else "no output")
        side.detail = f"exit {side.exit}: {why}"[:300]
    side.seconds = round(time.monotonic() - t0, 1)
    return side


def run_entry(entry: Entry, out_dir: Path, *, cache: Path | None = None,
              log: Callable[[str], None] = print) -> Result:
    """Run one entry on its buggy and fixing releases and judge it (:func:`judge`).
    An entry with ``needs`` is judged without installing anything."""
    if entry.needs is not None:
        return Result(entry, *judge(entry, None, None))
    buggy = run_side(entry, entry.buggy, out_dir, cache=cache, log=log)
    fixed = run_side(entry, entry.fixed, out_dir, cache=cache, log=log)
    return Result(entry, *judge(entry, buggy, fixed), buggy=buggy, fixed=fixed)


def to_json(results: list[Result]) -> dict[str, Any]:
    """The corpus report as data: ``{"found": int, "entries": int, "results": [...]}``."""
    return {"found": sum(r.outcome == "found" for r in results), "entries": len(results),
            "results": [r.to_dict() for r in results]}


def _cell(side: Side | None) -> str:
    if side is None:
        return "-"
    if side.status in ("passed", "failed"):
        return f"{side.status}: {side.failed}/{side.cases} fail" + (f", {side.not_run} not run" if side.not_run else "")
    return side.status


def markdown(results: list[Result]) -> str:
    """The corpus table in Markdown: one row per entry (source, releases, command,
    outcome with its reason and figures)."""
    found = sum(r.outcome == "found" for r in results)
    lines = [f"**{found} of {len(results)} entries found** (fails on the buggy release with a check naming the "
             "symptom, passes on the fix).", "",
             "| entry | source | buggy → fixed | command | buggy | fixed | outcome |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        e = r.entry
        rel = f"{e.dist} {e.buggy or '?'} → {e.fixed or 'none'}"
        faults = f"`{e.plan}`" if e.plan else ",".join(e.kinds)
        cmd = (f"`{e.workload.rsplit('.', 1)[-1]}` on `{e.subject.rsplit('.', 1)[-1]}`, {faults}, "
               f"resume {e.resume}, {e.conversation}") if e.needs is None else "-"
        lines.append(f"| {e.name} | [{e.repo} {e.ref}]({e.url}): {e.title} | {rel} | {cmd} | {_cell(r.buggy)} | "
                     f"{_cell(r.fixed)} | **{r.outcome}**: {r.why} |")
    return "\n".join(lines) + "\n"


def write(results: list[Result], out: Path) -> tuple[Path, Path]:
    """Write ``out`` (JSON, :func:`to_json`) and ``out`` with ``.md`` (:func:`markdown`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_json(results), indent=1, sort_keys=True) + "\n")
    md = out.with_suffix(".md")
    md.write_text(markdown(results))
    return out, md
