"""Mutants of a deploy: build B resumes what build A left, and B is wrong.

Each is the *new* build (the subject), with ``crash_with`` naming the build the runs
crashed under (:mod:`crashmatrix.harness.builds`: ``crashmatrix run checkout --subject
CRASH_WITH --resume-with defect:NAME``); ``crashmatrix selftest`` runs them as pairs and
their baseline is the clean pair ``reference`` -> ``reference-next`` (the reference
runtime's next build, with its upgrader: docs/runtime.md, "Codec versions").

- ``pickle-moved-class``: the catalogue's pickle codec in its real two-build form, two
  source trees of one app (``pickle_trees/v1`` and ``v2``): build 2 moved the pickled
  class to another module, so it cannot read build 1's records.
- ``missing-upgrader``: build 3 of the payload format ships the upgrader from 2 but a
  no-op for 1 (:mod:`crashmatrix.scenarios.upgrades.wire`), so records of format 1 are
  read as format 2.
- ``renamed-step``: build B renamed a tool (``send_receipt`` -> ``email_receipt``); a
  run that crashed after the model asked for the old name has a step B cannot run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.reference_runtime.agent import Agent
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.logstore import RunStore
from crashmatrix.scenarios.checkout import ScriptedModel
from crashmatrix.scenarios.checkout.script import respond
from crashmatrix.scenarios.upgrades import wire
from crashmatrix.scenarios.upgrades.builds import LaterBuildAdapter

from ._base import MutantAdapter
from .pickle_codec import PickledGraph, PickleLog, PickleRuntime

TREES = Path(__file__).resolve().parent / "pickle_trees"
CLEAN_PAIR = "reference>>reference-next"
"""The baseline of every upgrade mutant: the reference runtime and its next build."""


class UpgradeMutant(MutantAdapter):
    """Base of the upgrade mutants: the new build, run after ``crash_with``."""

    fault_kinds = ("kill",)
    baseline = CLEAN_PAIR
    crash_with = "reference"


class MovedClassLog(PickleLog):
    """Pickles messages as the ``Message`` class of the app tree on this build's path
    (``cm_pickleshop.MESSAGE``: build 1's lives in ``cm_pickleshop.messages``, build
    2's in ``cm_pickleshop.model``)."""

    def message_class(self) -> type:
        import cm_pickleshop  # type: ignore[import-not-found]  # the build's own tree (module docstring)

        return cm_pickleshop.MESSAGE


class PickleMovedClassAdapter(UpgradeMutant):
    """Mutant: records pickled as app objects, and the next build moved the class.

    Build 1 (``pickle_trees/v1`` on the path) pickles each record's messages as
    ``cm_pickleshop.messages.Message``; build 2 (``pickle_trees/v2``) has the class at
    ``cm_pickleshop.model.Message`` and no ``messages`` module, so a resume on it fails at
    the first turn that reads the transcript (``ModuleNotFoundError``), and the run is left
    failed, not parked with a reason. The real two-build form of mutant 7
    (``pickle-codec``, which fakes the move inside one build). Class: docs/design.md
    ("Never pickle anything durable"); seed 000's first upgrade (~340 in-flight runs
    died); LangGraph issues 6970 and 7066 (a moved class loads as a dict);
    maxencefaldor/cax#18. Caught by ``upgrade.migrated`` (and ``resume.runs``: the
    resume worker fails)."""

    name = "defect:pickle-moved-class"
    runtime_class = PickleRuntime
    graph_class = PickledGraph
    defect = "records are pickled app objects; the next build moved the class, so it cannot resume the runs"
    source = ("docs/design.md, state codec: never pickle anything durable; seed 000 (the first upgrade); LangGraph "
              "issues 6970, 7066; maxencefaldor/cax#18")
    caught_by = ("upgrade.migrated", "resume.runs")
    crash_with = f"v1=defect:pickle-moved-class@{TREES / 'v1'}"
    build_path = str(TREES / "v2")

    def make_store(self, db: Db, ctx: RunContext) -> RunStore | None:
        from crashmatrix.harness.adapters.reference import blob_store

        return MovedClassLog(db, blob_store(ctx.env))


class _NoOpUpgraderBuild(LaterBuildAdapter):
    """Payload format 3 with the upgrader from 2 and a no-op registered for 1."""

    wire_version = 3
    upgraders = {1: lambda value: value, 2: wire.UPGRADE_2_TO_3}


class MissingUpgraderAdapter(_NoOpUpgraderBuild, UpgradeMutant):
    """Mutant: build 3 of the payload format, whose upgrader from format 1 was never
    written (a no-op stands in for it, so old payloads "load").

    A record of format 1 is read as if it were format 2: its tool calls have no
    ``arguments_json``, and the strict reader of format 3 fails on them (``KeyError``)
    at the first turn that reads the transcript; the run is left failed. The reference
    codec refuses a missing upgrader (``UnreadablePayload``: the run parks
    ``cannot_migrate`` with the reason); this build papered over it. Class: an upgrader
    chain with a gap (docs/design.md, "State codec": older versions are upgraded on
    read, one version at a time). Caught by ``upgrade.migrated`` (and
    ``resume.runs``)."""

    name = "defect:missing-upgrader"
    defect = "the upgrader from format 1 is a no-op, so format-1 records are misread by the format-3 build"
    source = "docs/design.md, state codec: every blob carries a format version, older versions are upgraded on read"
    caught_by = ("upgrade.migrated", "resume.runs")


OLD_NAME, NEW_NAME = "send_receipt", "email_receipt"


def respond_renamed(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkout script of build B, whose receipt tool is ``email_receipt``."""
    seen = [{**m, "name": OLD_NAME} if m.get("name") == NEW_NAME else m for m in messages]
    reply = respond(conversation, seen)
    calls = [{**c, "name": NEW_NAME} if c["name"] == OLD_NAME else c for c in reply.get("tool_calls", [])]
    return {**reply, "tool_calls": calls}


class RenamedStepAdapter(UpgradeMutant):
    """Mutant: build B renamed a step (the tool ``send_receipt`` is ``email_receipt``),
    and keeps no alias for runs in flight.

    A run that crashed under A after the model turn that asked for ``send_receipt``
    (recorded, its tool node pending) resumes on B with a step B does not have: the
    node fails (``KeyError``) and the run ends ``failed``. Runs that crashed earlier
    finish, with a transcript that names the new tool. Class: a step identity that
    changed between builds (DBOS records each step's function name and refuses a
    recovered workflow whose step names changed; Temporal's non-determinism errors).
    Caught by ``upgrade.migrated``."""

    name = "defect:renamed-step"
    defect = "a tool was renamed between builds without an alias; runs in flight that asked for it cannot resume"
    source = "DBOS step identity by function name (unexpected step on recovery); Temporal non-determinism errors"
    caught_by = ("upgrade.migrated",)
    conversations = ("conv1",)

    def make_runtime(self, db: Db, agent: Agent, ctx: RunContext) -> Any:
        tools = {NEW_NAME if name == OLD_NAME else name: tool for name, tool in agent.tools.items()}
        model = ScriptedModel(agent.resources, "crashmatrix.scenarios.defects.upgrade_defects:respond_renamed")
        return super().make_runtime(db, dataclasses.replace(agent, model=model, tools=tools), ctx)
