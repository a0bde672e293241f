"""Mutant 7 of the catalogue: a pickle codec, and a message class that moves between
the crash and the resume.

The mutant's store pickles each record's output with its messages as objects of a
``Message`` class; its graph unpickles them. Build 1 (every start worker, the golden
run) has the class in :mod:`.pickle_build1`. A resume worker runs build 2, "deployed
between the crash and the resume": the class lives in :mod:`.pickle_build2` and the old
module is gone (:func:`install_build2`, in the forked resume worker only). Build 2 cannot
read what build 1 wrote.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.harness.adapters.reference import blob_store
from crashmatrix.reference_runtime import Runtime, codec
from crashmatrix.reference_runtime.blobs import BlobStore
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.graph import RunGraph
from crashmatrix.reference_runtime.leases import Lease
from crashmatrix.reference_runtime.logstore import AppendOnlyLog, EffectOutcome, RunStore
from crashmatrix.reference_runtime.records_pb2 import NodeRecord, Payload

from . import pickle_build1, pickle_build2
from ._base import MutantAdapter

PICKLE_CODEC = "pickle"
_BUILD: dict[str, type] = {"Message": pickle_build1.Message}
"""The message class this process's build pickles."""


def install_build2() -> None:
    """Make this process build 2: messages pickle as :class:`.pickle_build2.Message` and
    :mod:`.pickle_build1` can no longer be imported (as after a deploy that moved the
    class). Call it only in a forked worker: it changes ``sys.modules``."""
    _BUILD["Message"] = pickle_build2.Message
    sys.modules[pickle_build1.__name__] = None  # type: ignore[assignment]  # import now fails


class PickleLog(AppendOnlyLog):
    """Defect: the record's output is pickled (its messages as ``Message`` objects)
    instead of encoded as versioned JSON, so reading it back needs the class at the
    module path it had when it was written.

    A run that never resumes on a newer build never notices. A resume on build 2, after
    a crash left records of build 1, fails at the first turn that reads the transcript.
    Class: docs/design.md ("Never pickle anything durable"; catalogue item 7);
    maxencefaldor/cax#18 (a refactor moved ``models`` to ``systems`` and the pickled
    assets failed with ``ModuleNotFoundError``); getsentry/sentry#88821 (moving a class
    broke unpickling until the old import path was kept). Caught at the end by
    ``resume.runs`` (the resume worker fails) and ``run.status``.
    """

    def __init__(self, db: Db, blobs: BlobStore | None) -> None:
        super().__init__(db)
        self.blobs = blobs

    def message_class(self) -> type:
        """The class this build pickles messages as."""
        return _BUILD["Message"]

    async def append(self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None) -> bool:
        if record.output.codec != PICKLE_CODEC:  # in place: the executor's in-memory record matches the log
            value = dict(codec.decode(record.output, blobs=self.blobs))
            value["messages"] = [self.message_class()(**m) for m in value.get("messages", [])]
            record.output.CopyFrom(Payload(codec=PICKLE_CODEC, format_version=1, inline=pickle.dumps(value)))
        return await super().append(lease, seq, record, effect)


class PickledGraph(RunGraph):
    """Rehydrates outputs written by :class:`PickleLog` (and JSON ones as usual)."""

    def output(self, node_id: str) -> Any:
        payload = self.records[node_id].output
        if payload.codec != PICKLE_CODEC:
            return super().output(node_id)
        value = pickle.loads(payload.inline)
        return {**value, "messages": [m.to_dict() for m in value.get("messages", [])]}


class PickleRuntime(Runtime):
    """The reference runtime rehydrating with :class:`PickledGraph`."""

    graph_class = PickledGraph


class PickleCodecAdapter(MutantAdapter):
    """Mutant: pickled outputs, and resumes run a build where the class moved (PickleLog)."""

    name = "defect:pickle-codec"
    runtime_class = PickleRuntime
    graph_class = PickledGraph
    defect = "outputs are pickled; a newer build that moved the message class cannot resume the run"
    source = ("docs/design.md, state codec: never pickle anything durable (catalogue item 7); maxencefaldor/cax#18, "
              "getsentry/sentry#88821 (a moved class breaks unpickling)")
    caught_by = ("resume.runs", "run.status")
    fault_kinds = ("kill",)
    #: a resume deploys build 2 into its process (``install_build2``, ``sys.modules``):
    #: a worker that resumed once would start every later run under build 2
    long_lived_workers = False

    def make_store(self, db: Db, ctx: RunContext) -> RunStore | None:
        return PickleLog(db, blob_store(ctx.env))

    async def resume(self, ctx: RunContext) -> str:
        install_build2()  # the newer build, deployed between the crash and the resume
        return await super().resume(ctx)
