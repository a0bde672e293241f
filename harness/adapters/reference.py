"""The reference runtime's adapter: the first user of :class:`~crashmatrix.harness.adapter.Adapter`.

Mutants (``scenarios/defects``) subclass :class:`ReferenceAdapter` and override
:meth:`ReferenceAdapter.make_runtime` to swap one runtime component for a defective one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from crashmatrix.reference_runtime import Runtime, connect, migrate
from crashmatrix.reference_runtime.attempts import MAX_ATTEMPTS_WITHOUT_PROGRESS
from crashmatrix.reference_runtime.blobs import LocalBlobStore
from crashmatrix.reference_runtime.db import ConnectionKeeper, Db
from crashmatrix.reference_runtime.drain import WorkerDrain
from crashmatrix.reference_runtime.graph import RunGraph
from crashmatrix.reference_runtime.leases import LEASE_SECONDS
from crashmatrix.reference_runtime.logstore import CorruptRecord, StoredRecord, decode_row
from crashmatrix.reference_runtime.snapshots import DeltaSnapshotStore

from ..adapter import Adapter, EffectEntry, Environment, InvocationEntry, LogEntry, Observation, RunContext
from ..services.postgres import read_pool
from ..services.providers.clients import Resources


MAX_HAND_OFFS = 3
"""Operator decisions one worker acts on before it leaves the run to the next."""


def blob_store(env: Environment) -> LocalBlobStore:
    """The case's blob store: ``<workdir>/blobs``, shared by workers and the oracle."""
    return LocalBlobStore(Path(env.workdir) / "blobs")


_KEPT = ConnectionKeeper()
"""This worker process's database connection between runs (a long-lived worker runs
many: :mod:`crashmatrix.harness.resident`); a forked worker keeps it until it exits."""


_OBSERVE_SQL = """
SELECT r.status, r.input, r.lease_epoch, r.detail,
       ARRAY(SELECT (l.seq, l.node_id, l.record, l.lease_epoch) FROM cm_run_log l
             WHERE l.run_id = r.run_id ORDER BY l.seq) AS log,
       ARRAY(SELECT (e.idem_key, e.node_id, e.tool, e.status, e.result, e.lease_epoch) FROM cm_effects e
             WHERE e.run_id = r.run_id) AS effects,
       ARRAY(SELECT (i.lease_epoch, i.worker, i.traceparent, i.link) FROM cm_run_invocations i
             WHERE i.run_id = r.run_id ORDER BY i.lease_epoch) AS invocations
FROM cm_runs r WHERE r.run_id = $1
"""
"""A run's durable state in one statement (one snapshot, one round trip): its row, its
log in ``seq`` order, its effects, its invocations in ``lease_epoch`` order; the nested
rows come back as tuples in the column order written here."""


class ReferenceAdapter(Adapter):
    """The reference runtime (append-only log in PostgreSQL, effects ledger, leases)."""

    name = "reference"
    subject_packages = ("crashmatrix.reference_runtime",)
    #: a resume reads the run's input from ``cm_runs`` (the stored request): input-once
    expects_redelivery = False
    #: the attempt limit ends a crash loop ``failed`` (reference_runtime/attempts.py)
    crash_loop_status = "failed"
    #: the runtime's own attempt limit, read from it (reference_runtime/attempts.py)
    recovery_attempts_limit = MAX_ATTEMPTS_WITHOUT_PROGRESS
    #: the sweep takes a run over once its lease expired (reference_runtime/sweep.py)
    lease_seconds = float(LEASE_SECONDS)
    #: a record this build cannot read parks the run (executor.CANNOT_MIGRATE)
    cannot_migrate_statuses = ("cannot_migrate",)
    #: a run that waits on ``needs_human`` is handed to ``workload.operator`` (:meth:`_run`)
    answers_operator = ("operator",)
    #: a worker's calls build everything per run (connection, session, runtime)
    long_lived_workers = True
    #: leases in ``cm_runs`` on the harness's PostgreSQL (pause, db-restart)
    harness_db_leases = True
    #: rehydrates the oracle's view of a run (the runtime's ``Runtime.graph_class``)
    graph_class: type[RunGraph] = RunGraph
    #: the recovery branches a matrix should exercise, as labels the runtime reaches
    #: after a fault (:mod:`crashmatrix.harness.coverage`; docs/runtime.md)
    recovery_branches = {
        "probe.answer.applied": "a probe answered: applied (the effect's result recovered)",
        "probe.answer.not_applied": "a probe answered: not applied (the call made again)",
        "probe.answer.cannot_tell": "a probe answered: cannot tell (handed to a person)",
        "effect.unknown.resolved": "an effect left unknown, resolved by its probe",
        "drain.in_flight": "a drain with a node in flight (it finishes and appends)",
        "lease.taken_over": "a lease taken over from a worker that held it",
    }
    _pools: dict[str, asyncpg.Pool] | None = None  # per instance, per event loop
    _pools_loop: int | None = None

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        """Build the runtime for one worker; mutants override this."""
        return Runtime(db, agent, worker_id=ctx.worker_id, on_step=ctx.on_step, blobs=blob_store(ctx.env))

    async def prepare(self, env: Environment) -> None:
        db = await connect(env.dsn, application_name="crashmatrix-prepare")
        try:
            await migrate(db.conn)
        finally:
            await db.close()

    async def _run(self, ctx: RunContext, recover: bool = False, drain: WorkerDrain | None = None) -> str:
        """One worker: connect (the connection this process kept from its last run, if
        it answers: :class:`ConnectionKeeper`), build the runtime, then (``recover``) the sweep of
        ``ctx.scope``, or submit the run when handed its input (idempotent), say it was
        accepted, and run it (a resume handed no input reads it from ``cm_runs``).
        ``drain``: one the caller requests from a SIGTERM handler of its own (a server's);
        None: the runtime's own handler is installed for the whole call."""
        # first thing, as a worker's main should: a SIGTERM while this worker connects or
        # submits the run drains it too (reference_runtime.drain)
        with (contextlib.nullcontext(drain) if drain is not None else WorkerDrain.installed_here()) as drain:
            reconnect_ms = ctx.env.options.get("db_reconnect_deadline_ms")  # set by the network section
            db = await _KEPT.connect(ctx.env.dsn, application_name=ctx.worker_id,
                                     **({"reconnect_deadline_s": reconnect_ms / 1000} if reconnect_ms else {}))
            try:
                async with aiohttp.ClientSession() as session:
                    deadline_ms = ctx.env.options.get("provider_deadline_ms")  # set by the network section
                    resources = Resources(session, ctx.env.providers, ctx.worker_id, ctx.conversation,
                                          deadline_s=deadline_ms / 1000 if deadline_ms else None)
                    agent = ctx.workload.build_agent(ctx.conversation, resources)
                    runtime = self.make_runtime(db, agent, ctx)
                    if runtime.handle_sigterm:  # a mutant's make_runtime too
                        runtime.drain = drain
                    if runtime.blobs is None:  # a mutant's make_runtime: large outputs still go to blobs
                        runtime.blobs = blob_store(ctx.env)
                    if drain.requested:  # before the run was submitted: nothing is written
                        return "drained"
                    if recover:
                        if ctx.scope is None:
                            return "nothing to sweep: no queue"
                        found = await runtime.recover(ctx.scope, ctx.clock_offset_s)
                        return f"recovered {len(found)}: " + ", ".join(f"{r} {st}" for r, st in found.items())
                    if ctx.input_given:
                        # a resume after a crash before the run's row committed starts it from its
                        # input: submitting a run is idempotent (create_run)
                        await runtime.create_run(ctx.run_id, ctx.workload.name, ctx.run_input(), queue=ctx.scope)
                        ctx.accepted()  # stored: a caller would be told "accepted" now
                    status = await runtime.run(ctx.run_id)
                    return await self.hand_off(runtime, db, ctx, resources, status)
            finally:
                _KEPT.release(db)

    async def hand_off(self, runtime: Runtime, db: Db, ctx: RunContext, resources: Any, status: str) -> str:
        """A workload that brings its own human (``workload.operator(conn, run_id,
        resources) -> bool``, e.g. ``human_pause``): while the run stops
        ``needs_human`` and the operator decided something, run it again in this worker.
        SIGTERM while the operator acts drains as in the runtime (nothing runs after: the
        worker's drain, installed by :meth:`_run`, covers the operator too)."""
        operator = getattr(ctx.workload, "operator", None)
        for _ in range(MAX_HAND_OFFS):
            if status != "needs_human" or operator is None or runtime.drain_requested():
                break
            decided = await operator(db.conn, ctx.run_id, resources)
            if not decided or runtime.drain_requested():
                break
            status = await runtime.run(ctx.run_id)
        return status

    async def start(self, ctx: RunContext) -> str:
        return await self._run(ctx)

    async def resume(self, ctx: RunContext) -> str:
        return await self._run(ctx)

    async def recover(self, ctx: RunContext) -> str:
        """The sweep of ``ctx.scope`` (reference_runtime/sweep.py): every run whose lease
        expired by the clock advanced ``ctx.clock_offset_s``, taken over and run."""
        return await self._run(ctx, recover=True)

    async def _oracle_pool(self, dsn: str) -> asyncpg.Pool:
        """A pool for the controller's reads, one per event loop and DSN."""
        loop = id(asyncio.get_running_loop())
        if self._pools is None or self._pools_loop != loop:
            self._pools, self._pools_loop = {}, loop
        if dsn not in self._pools:
            self._pools[dsn] = await read_pool(dsn, "crashmatrix-oracle")
        return self._pools[dsn]

    async def aclose(self) -> None:
        pools, self._pools = self._pools or {}, None
        for pool in pools.values():
            await pool.close()

    async def observe(self, env: Environment, run_id: str) -> Observation:
        pool = await self._oracle_pool(env.dsn)
        run = await pool.fetchrow(_OBSERVE_SQL, run_id)
        if run is None:
            return Observation(run_id, "absent", log=[], effects=[], state=None, state_error="run does not exist")
        rows, effects, invocations = run["log"], run["effects"], run["invocations"]
        log: list[LogEntry] = []
        stored: list[StoredRecord] = []
        state_error = None
        for seq, node_id, record, epoch in rows:
            try:
                item = decode_row(run_id, seq, node_id, bytes(record))
            except CorruptRecord as exc:
                log.append(LogEntry(seq, node_id, (), "?", epoch, str(exc)))
                state_error = str(exc)
                continue
            stored.append(item)
            rec = item.record
            log.append(LogEntry(seq, node_id, tuple(rec.parents), rec.kind, epoch))
        state = None
        if state_error is None:
            try:
                graph = self.graph_class.rehydrate(run_id, json.loads(run["input"]), stored, blobs=blob_store(env))
                state = {
                    "transcript": graph.transcript(),
                    "answer": graph.final_answer(),
                    "budget": graph.budget(),
                    "pending": graph.pending(),
                }
            except Exception as exc:  # a state that cannot be rebuilt is an oracle finding
                state_error = f"rehydrate failed: {type(exc).__name__}: {exc}"
        return Observation(
            run_id,
            run["status"],
            log=log,
            effects=[
                EffectEntry(key, node_id, tool, status, json.loads(result) if result is not None else None, epoch)
                for key, node_id, tool, status, result, epoch in effects
            ],
            state=state,
            state_error=state_error,
            lease_epoch=run["lease_epoch"],
            invocations=[InvocationEntry(*i) for i in invocations],
            detail=run["detail"],
        )

    async def cancel_run(self, env: Environment, run_id: str) -> None:
        """The runtime's operator cancel (:func:`.cancellation.cancel`: status
        ``cancelled``, the worker fenced off at its next write)."""
        from crashmatrix.reference_runtime import cancellation

        await cancellation.cancel(await self._oracle_pool(env.dsn), run_id, by="crashmatrix")

    async def resume_cancelled(self, env: Environment, run_id: str) -> None:
        """The operator's resume after a cancel (:func:`.cancellation.resume`)."""
        from crashmatrix.reference_runtime import cancellation

        await cancellation.resume(await self._oracle_pool(env.dsn), run_id, by="crashmatrix")

    #: the operator's restore keeps the effects ledger: a tool call made again after a
    #: restore is answered from its recorded result (reference_runtime/restore.py)
    restore_effects = "replays recorded"
    #: the restore's handling of the ledger; the mutant that forgets it sets False
    restore_keeps_ledger = True

    async def restore_point(self, env: Environment, run_id: str) -> str | None:
        """The seq of the run's newest record (:func:`.restore.current_point`)."""
        from crashmatrix.reference_runtime import restore

        seq = await restore.current_point(await self._oracle_pool(env.dsn), run_id)
        return str(seq)

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        """The operator's restore to record ``point`` (:func:`.restore.restore`), in place."""
        from crashmatrix.reference_runtime import restore

        await restore.restore(await self._oracle_pool(env.dsn), run_id, int(point), by="crashmatrix",
                              keep_ledger=self.restore_keeps_ledger)
        return run_id


class ReferenceForkAdapter(ReferenceAdapter):
    """The reference runtime, restored by forking (:func:`.restore.fork`): a new run from
    the point, the original left as it was."""

    name = "reference-fork"
    #: the fork runs the nodes after the point again under its own run id: its effects
    #: get keys of their own and are sent once more
    restore_effects = "fresh attempt"

    async def restore_run(self, env: Environment, run_id: str, point: str) -> str:
        """A fork ``<run id>~fork-<point>`` from record ``point`` (:func:`.restore.fork`)."""
        from crashmatrix.reference_runtime import restore

        return await restore.fork(await self._oracle_pool(env.dsn), run_id, int(point), f"{run_id}~fork-{point}",
                                  by="crashmatrix")


class ReferenceDeltaAdapter(ReferenceAdapter):
    """The reference runtime with the delta-and-snapshot store (a snapshot every 3 records)."""

    name = "reference-delta"

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        return Runtime(db, agent, worker_id=ctx.worker_id, on_step=ctx.on_step, blobs=blob_store(ctx.env),
                       store=DeltaSnapshotStore(db, every=3))
