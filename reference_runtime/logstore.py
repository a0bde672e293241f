"""The append-only run log: one protobuf ``NodeRecord`` per completed node.

Walls (docs/design.md, "reference_runtime"):

- O(1) bytes per turn: a record holds only what its node produced, never the whole
  state again, so the cost of a turn does not grow with the run.
- One appender per run assigns ``seq`` in commit order (the worker holds the lease and
  serialises appends), so concurrent nodes still leave a contiguous log.
- The append is one statement that also checks the writer's lease epoch (a zombie's
  append is refused) and, for a node that made an effect, moves that effect to its final
  status in the same statement, hence the same transaction: ``succeeded`` exists exactly
  when the node's record does.
- A retried append of the same node (same bytes) is a no-op, a conflicting one an error:
  a record with an effect says which by ``ON CONFLICT DO NOTHING RETURNING``; a record
  without one (the fenced ``INSERT`` alone) by the unique violation the server raises,
  after which the existing row is compared.
- A lost acknowledgement (the connection broke with the append in flight: its COMMIT
  may or may not have landed) is resolved by re-reading the log on the new connection
  (:meth:`AppendOnlyLog.landed`): the record is there (the append counts as written) or
  it is not (it is sent again, still fenced); never guessed, never re-applied.

:class:`RunStore` is the interface a store strategy implements; :class:`AppendOnlyLog`
is the default.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, overload

import asyncpg

from .db import ConnectionLost, Db
from .leases import Lease, LeaseLost
from .records_pb2 import NodeRecord, RecordLog

RECORD_FORMAT_VERSION = 2
"""Layout version of the ``NodeRecord`` this build writes (history in records.proto)."""


def _upgrade_record_v1(record: NodeRecord) -> NodeRecord:
    """v1 -> v2: v2 added ``budget.wall_ms`` and ``state``. A v1 record has neither:
    its wall time is unknown (0) and it set no state field, which is what the proto3
    defaults already say, so only the version changes."""
    upgraded = NodeRecord()
    upgraded.CopyFrom(record)
    upgraded.format_version = 2
    return upgraded


RECORD_UPGRADERS: dict[int, Callable[[NodeRecord], NodeRecord]] = {1: _upgrade_record_v1}
"""``RECORD_UPGRADERS[n]`` turns a format-``n`` record into format ``n + 1`` on read, so a
log written by an older build rehydrates on this one (fixture: tests/walls/fixtures)."""


class LogConflict(RuntimeError):
    """An append collided with a different record for the same node or seq."""


class CorruptRecord(ValueError):
    """A stored record does not decode; names run, seq and node."""


@dataclass(frozen=True)
class EffectOutcome:
    """The final status of the effect a node made, committed with the node's record."""

    idem_key: str
    status: str  # "succeeded" or "failed"
    result: Any


class StoredRecord(NamedTuple):
    """One record as read from a store, with its ``seq`` (a tuple: a rehydrate makes one
    per record, and a frozen dataclass costs ~0.4 us more each)."""

    seq: int
    node_id: str
    record: NodeRecord


class LogFacts(NamedTuple):
    """What the graph's rebuild needs of a whole log, from the columns written beside its
    records (:func:`record_facts`): the totals of the recorded nodes, how many specs each
    record spawned (in seq order) and every spawned node id in record order."""

    turns: int
    tokens: int
    wall_ms: int
    spawned_counts: tuple[int, ...]
    spawned_ids: list[str]


def facts_of(records: Sequence[NodeRecord]) -> LogFacts:
    """The :class:`LogFacts` the default store's read sums on the server from the columns
    :func:`record_facts` wrote beside ``records`` (in seq order), computed here: what a
    test or a benchmark compares the server's with, or hands a :class:`LogRead` of records
    held in memory."""
    facts = [record_facts(r) for r in records]
    return LogFacts(sum(kind == "model" for kind, _, _, _ in facts), sum(tokens for _, tokens, _, _ in facts),
                    sum(wall_ms for _, _, wall_ms, _ in facts), tuple(len(ids) for _, _, _, ids in facts),
                    [i for _, _, _, ids in facts for i in ids])


class LogRead(Sequence[StoredRecord]):
    """The default store's read: records ``1..n`` in seq order (the parsed ``RecordLog``'s
    repeated field: a record's Python object is made when it is first read), with their
    row's node ids and (when every row has them) the :class:`LogFacts`. A sequence of
    :class:`StoredRecord`, each made when asked: :meth:`.graph.RunGraph.rehydrate` takes
    ``nodes``, ``records`` and ``facts`` as they are (no object per record)."""

    __slots__ = ("nodes", "records", "facts")

    def __init__(self, nodes: list[str], records: Sequence[NodeRecord], facts: LogFacts | None) -> None:
        self.nodes = nodes
        self.records = records
        self.facts = facts

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> StoredRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[StoredRecord]: ...
    def __getitem__(self, index: int | slice) -> StoredRecord | list[StoredRecord]:
        if isinstance(index, slice):
            return list(self)[index]
        i = range(len(self.records))[index]  # IndexError, negative indexes as a list's
        return StoredRecord(i + 1, self.nodes[i], self.records[i])

    def __iter__(self) -> Iterator[StoredRecord]:
        # tuple.__new__ straight from map: no Python frame per record (StoredRecord(...) has one)
        return map(tuple.__new__, itertools.repeat(StoredRecord), zip(itertools.count(1), self.nodes, self.records))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LogRead({list(self)!r})"


class RunStore(Protocol):
    """What the executor needs from a store strategy."""

    async def append(
        self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None
    ) -> bool:
        """Append ``record`` at ``seq``; True if written, False if the same record was
        already there. Raises LeaseLost (stale epoch) or LogConflict."""

    async def read(self, run_id: str) -> Sequence[StoredRecord]:
        """Every record of ``run_id`` in seq order, decoded. Raises CorruptRecord."""


# A record with an effect: the fence, the insert and the effect's final status in one
# statement (one transaction). The answer tells a stale epoch (fenced_ok = 0) from a
# conflict (seq is NULL).
_APPEND_SQL = """
WITH fence AS (
    SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $5 FOR SHARE
), ins AS (
    INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch, kind, tokens, wall_ms, spawned)
    SELECT $1, $2, $3, $4, $5, $9, $10, $11, $12 FROM fence
    ON CONFLICT DO NOTHING
    RETURNING seq
), eff AS (
    UPDATE cm_effects
       SET status = $7, result = $8::jsonb, lease_epoch = $5, updated_at = now()
     WHERE run_id = $1 AND idem_key = $6 AND $6 IS NOT NULL
       AND EXISTS (SELECT 1 FROM ins)
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced_ok,
       (SELECT seq FROM ins) AS seq,
       (SELECT count(*) FROM eff) AS effects
"""


# A record without an effect (most of them: model turns, plans, joins): the fenced insert
# alone, with no CTE to materialise and no ON CONFLICT (a speculative insertion checks
# both unique indexes first): 1.19-1.24x the one-row commit floor against the CTE
# statement's 1.33-1.38x (docs/benchmarks.md, "The append turn and the Db's turn"). The
# fence (an InitPlan, the statement's one-time filter) runs before anything is inserted,
# so the answer is exact: a row back means written; no row means the fence refused it (a
# stale epoch); a unique violation means the fence passed and the node or the seq was
# taken (this very record retried, or a conflict: AppendOnlyLog.append compares).
_APPEND_ALONE_SQL = """
INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch, kind, tokens, wall_ms, spawned)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
 WHERE EXISTS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $5 FOR SHARE)
RETURNING seq
"""


def record_facts(record: NodeRecord) -> tuple[str, int, int, list[str]]:
    """What the graph's rebuild needs of a record, written beside it (schema version 6:
    ``cm_run_log.kind``, ``tokens``, ``wall_ms``, ``spawned``) in the statement that
    appends it, so a rehydrate gets the run's totals and frontier from the server
    instead of walking every record in Python (:meth:`AppendOnlyLog.read`)."""
    budget = record.budget
    return record.kind, budget.tokens, budget.wall_ms, [spec.node_id for spec in record.spawned[:]]


# A batch for the group commit. Every array is text[] (records in base64, the spawned ids
# of each record as a JSON array): asyncpg has built-in codecs for text[] only, and any
# other array type makes each new connection run a type-introspection query first (see
# LOG_FRAMES_SQL).
_APPEND_MANY_SQL = """
WITH fence AS (
    SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $2 FOR SHARE
), batch AS (
    SELECT u.seq::bigint AS seq, u.node_id, decode(u.record, 'base64') AS record, u.idem_key, u.status, u.result,
           u.kind, u.tokens::bigint AS tokens, u.wall_ms::bigint AS wall_ms,
           ARRAY(SELECT jsonb_array_elements_text(u.spawned::jsonb)) AS spawned
      FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
                  $9::text[], $10::text[], $11::text[], $12::text[])
        AS u(seq, node_id, record, idem_key, status, result, kind, tokens, wall_ms, spawned)
), ins AS (
    INSERT INTO cm_run_log (run_id, seq, node_id, record, lease_epoch, kind, tokens, wall_ms, spawned)
    SELECT $1, b.seq, b.node_id, b.record, $2, b.kind, b.tokens, b.wall_ms, b.spawned FROM batch b, fence
    ON CONFLICT DO NOTHING
    RETURNING node_id
), eff AS (
    UPDATE cm_effects e
       SET status = b.status, result = b.result::jsonb, lease_epoch = $2, updated_at = now()
      FROM batch b JOIN ins USING (node_id)
     WHERE e.run_id = $1 AND e.idem_key = b.idem_key AND b.idem_key IS NOT NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced_ok,
       (SELECT array_agg(node_id) FROM ins) AS inserted,
       (SELECT count(*) FROM eff) AS effects
"""


LOG_FRAMES_SQL = (
    "string_agg(int8send(seq) || int4send(octet_length(convert_to(node_id, 'UTF8'))) "
    "|| convert_to(node_id, 'UTF8') || int4send(octet_length(record)) || record, ''::bytea ORDER BY seq)"
)
"""An aggregate over ``cm_run_log`` rows: the records in one value, as frames of
``seq (int8) | len (int4) | node_id (UTF-8) | len (int4) | record``, big-endian
(:func:`split_frames` reads it). One bytea rather than ``array_agg`` arrays, because
asyncpg has built-in codecs for ``text[]`` only: ``int8[]`` and ``bytea[]`` make every
new connection (every worker) run a type-introspection query over the catalogs first."""

_READ_SQL = f"SELECT {LOG_FRAMES_SQL} FROM cm_run_log WHERE run_id = $1"


def split_frames(frames: bytes) -> list[tuple[int, str, bytes]]:
    """Split a :data:`LOG_FRAMES_SQL` value into ``(seq, node_id, record)`` triples; raises
    :class:`CorruptRecord` if the frames are torn."""
    out = []
    view = memoryview(frames)
    pos, end = 0, len(frames)
    unpack_q, unpack_i = struct.Struct(">q").unpack_from, struct.Struct(">i").unpack_from
    try:
        while pos < end:
            (seq,) = unpack_q(view, pos)
            (n,) = unpack_i(view, pos + 8)
            node_id = bytes(view[pos + 12:pos + 12 + n]).decode()
            pos += 12 + n
            (m,) = unpack_i(view, pos)
            out.append((seq, node_id, bytes(view[pos + 4:pos + 4 + m])))
            pos += 4 + m
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"log frames torn at byte {pos} of {end}: {exc}") from None
    if pos != end:
        raise CorruptRecord(f"log frames torn: {pos - end} byte(s) past the end")
    return out

# The run's records as ONE bytea that parses as a ``RecordLog`` (field 1: repeated
# ``NodeRecord``): each record framed by the server as ``0x0a <len> record``, the length as
# a 4-byte varint (protobuf parsers accept non-minimal varints), so the client parses every
# record in one C call. Lengths must be < 2**28 (records are small: payloads over the blob
# threshold live in the blob store); ``longest`` says whether they are, and the seq column
# is checked to be exactly 1..n. Beside them, from the columns the append wrote with each
# record (:func:`record_facts`), what the graph's rebuild needs: the totals, how many specs
# each record spawned (int4 each, in seq order) and their node ids (joined by 0x1f, in
# record order); ``facts`` is false when a row lacks them (written before schema version 6),
# and the graph then walks the records instead. One scan, no unnest.
_VARINT4 = "substring(int8send(((({n} & 127) | 128)::bigint << 24) | (((({n} >> 7) & 127) | 128) << 16)" \
           " | (((({n} >> 14) & 127) | 128) << 8) | ({n} >> 21)) FROM 5)"
_READ_FRAMED_SQL = f"""
SELECT string_agg('\\x0a'::bytea || {_VARINT4.format(n="length(record)")} || record, ''::bytea ORDER BY seq) AS framed,
       array_agg(node_id ORDER BY seq) AS nodes, count(*) AS n, min(seq) AS first, max(seq) AS last,
       max(length(record)) AS longest,
       bool_and(octet_length(node_id) < 128 AND substring(record FROM 1 FOR 4 + octet_length(node_id))
                = '\\x0802'::bytea || '\\x12'::bytea || set_byte('\\x00'::bytea, 0, octet_length(node_id))
                  || convert_to(node_id, 'UTF8')) AS plain,
       bool_and(kind IS NOT NULL AND tokens IS NOT NULL AND wall_ms IS NOT NULL AND spawned IS NOT NULL) AS facts,
       count(*) FILTER (WHERE kind = 'model') AS turns, sum(tokens)::bigint AS tokens, sum(wall_ms)::bigint AS wall_ms,
       string_agg(int4send(coalesce(cardinality(spawned), 0)), ''::bytea ORDER BY seq) AS spawned_counts,
       string_agg(nullif(array_to_string(spawned, E'\\x1f'), ''), E'\\x1f' ORDER BY seq) AS spawned_ids
  FROM cm_run_log WHERE run_id = $1
"""
# ``plain``: every record starts with format_version = 2 (``08 02``, field 1 comes first in
# the serialisation) and then its row's node id (``12 <len> id``): current and named as its
# row says, so the client needs no per-record check.
MAX_FRAMED = 2**28 - 1


class AppendOnlyLog:
    """The default store: an append-only log in ``cm_run_log`` (see module docstring)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def append(
        self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None
    ) -> bool:
        """Append ``record`` at ``seq`` fenced by ``lease``'s epoch, with ``effect``'s final
        status in the same statement. True if written, False if this very record was
        already there (a retried append); raises LeaseLost (stale epoch) or LogConflict.
        A lost acknowledgement is resolved by re-reading the log (:meth:`landed`)."""
        data = record.SerializeToString(deterministic=True)
        if effect is None:
            sql: str = _APPEND_ALONE_SQL
            args: tuple[Any, ...] = (lease.run_id, seq, record.node_id, data, lease.epoch, *record_facts(record))
        else:
            import json

            sql = _APPEND_SQL
            args = (lease.run_id, seq, record.node_id, data, lease.epoch, effect.idem_key, effect.status,
                    json.dumps(effect.result, sort_keys=True), *record_facts(record))
        conflict = False
        while True:
            try:
                row = await self.db.fetchrow_once(sql, *args)
                break
            except asyncpg.UniqueViolationError:
                # _APPEND_ALONE_SQL's fence passed and the node or seq is taken (the CTE
                # statement does nothing on a conflict instead: seq comes back NULL)
                row, conflict = None, True
                break
            except ConnectionLost:
                # The COMMIT's acknowledgement was lost: the append may have landed.
                # Re-read the log on the new connection; send it again only if it did not.
                landed = await self.landed(lease.run_id, record.node_id, data)
                if landed is not None:
                    return landed == seq
        if not conflict:
            if row is None:  # _APPEND_ALONE_SQL: no row and no violation, the fence refused it
                fenced_ok = False
            elif effect is None:
                return True
            else:
                fenced_ok = row["fenced_ok"]
                if fenced_ok and row["seq"] is not None:
                    return True
            if not fenced_ok:
                raise LeaseLost(f"run {lease.run_id}: append of {record.node_id} refused, lease epoch {lease.epoch} is stale")
        existing = await self.db.fetchrow(
            "SELECT seq, record FROM cm_run_log WHERE run_id = $1 AND node_id = $2",
            lease.run_id,
            record.node_id,
        )
        if existing is not None and bytes(existing["record"]) == data:
            return False
        raise LogConflict(
            f"run {lease.run_id}: append of node {record.node_id!r} at seq {seq} conflicts "
            f"with an existing record"
            + (f" (that node is at seq {existing['seq']})" if existing else " (seq taken)")
        )

    async def append_many(
        self, lease: Lease, first_seq: int, items: list[tuple[NodeRecord, EffectOutcome | None]]
    ) -> list[bool]:
        """Append ``items`` at ``first_seq``, ``first_seq + 1``... in ONE statement (one
        transaction, one fsync: the executor's group commit), each record with its
        effect's final status, the whole batch fenced. Returns written/already-there per
        record, like :meth:`append`; raises LeaseLost or LogConflict. A lost
        acknowledgement is resolved as :meth:`append` resolves it (the batch is one
        transaction: all of it landed or none). A subclass that overrides :meth:`append`
        (a mutant, another strategy) gets one call per record."""
        if type(self).append is not AppendOnlyLog.append:
            return [await self.append(lease, first_seq + i, rec, eff) for i, (rec, eff) in enumerate(items)]
        import base64
        import json

        datas = [rec.SerializeToString(deterministic=True) for rec, _ in items]
        facts = [record_facts(rec) for rec, _ in items]
        args = (
            lease.run_id, lease.epoch,
            [str(first_seq + i) for i in range(len(items))], [rec.node_id for rec, _ in items],
            [base64.b64encode(d).decode() for d in datas],
            [eff.idem_key if eff else None for _, eff in items], [eff.status if eff else None for _, eff in items],
            [json.dumps(eff.result, sort_keys=True) if eff else None for _, eff in items],
            [kind for kind, _, _, _ in facts], [str(tokens) for _, tokens, _, _ in facts],
            [str(wall_ms) for _, _, wall_ms, _ in facts], [json.dumps(spawned) for _, _, _, spawned in facts],
        )
        while True:
            try:
                row = await self.db.fetchrow_once(_APPEND_MANY_SQL, *args)
                break
            except ConnectionLost:
                landed = await self.landed(lease.run_id, items[0][0].node_id, datas[0])
                if landed is not None:  # the whole batch committed
                    return [landed == first_seq] * len(items)
        assert row is not None
        if not row["fenced_ok"]:
            raise LeaseLost(f"run {lease.run_id}: append of {len(items)} records refused, lease epoch {lease.epoch} is stale")
        inserted = set(row["inserted"] or ())
        written = []
        for i, ((rec, _), data) in enumerate(zip(items, datas)):
            if rec.node_id in inserted:
                written.append(True)
                continue
            if await self.landed(lease.run_id, rec.node_id, data) is not None:
                written.append(False)  # a retried append of this very record
                continue
            raise LogConflict(f"run {lease.run_id}: append of node {rec.node_id!r} at seq {first_seq + i} conflicts "
                              f"with an existing record (seq taken)")
        return written

    async def landed(self, run_id: str, node_id: str, data: bytes) -> int | None:
        """After a lost acknowledgement: the seq at which ``node_id``'s record (exactly
        ``data``) is in the log, or None if it is not there. Raises :class:`LogConflict`
        when a different record for the node is."""
        existing = await self.db.fetchrow(
            "SELECT seq, record FROM cm_run_log WHERE run_id = $1 AND node_id = $2", run_id, node_id)
        if existing is None:
            return None
        if bytes(existing["record"]) != data:
            raise LogConflict(f"run {run_id}: node {node_id!r} is at seq {existing['seq']} with a different record "
                              f"(found after a lost acknowledgement)")
        return int(existing["seq"])

    async def read(self, run_id: str) -> Sequence[StoredRecord]:
        """Every record in seq order, in one round trip returning one value: the records
        framed by the server as one ``RecordLog`` message, parsed in one call (a row per
        record costs ~2 us of protocol overhead each, a parse per record ~5 us; see
        docs/benchmarks.md), with the :class:`LogFacts` the graph's rebuild needs (a
        :class:`LogRead`). A log that is not exactly seqs 1..n, a record that does not
        parse or is too long to frame falls back to :meth:`read_rows`, which names the
        offending row."""
        row = await self.db.fetchrow(_READ_FRAMED_SQL, run_id)
        if row is None or not row["n"]:
            return []
        n = row["n"]
        if row["first"] != 1 or row["last"] != n or row["longest"] > MAX_FRAMED:
            return await self.read_rows(run_id)
        try:
            records = RecordLog.FromString(row["framed"]).records
        except Exception:  # protobuf raises DecodeError, sometimes others: name the row
            return await self.read_rows(run_id)
        if len(records) != n:
            return await self.read_rows(run_id)
        nodes = row["nodes"]
        if row["plain"] and RECORD_FORMAT_VERSION == 2:
            facts = None
            if row["facts"]:
                counts = struct.unpack(f">{n}i", row["spawned_counts"])
                ids = row["spawned_ids"].split("\x1f") if row["spawned_ids"] else []
                if len(ids) == sum(counts):  # else an id holds 0x1f: the records say which is which
                    facts = LogFacts(row["turns"], row["tokens"], row["wall_ms"], counts, ids)
            return LogRead(nodes, records, facts)
        out = []
        for seq, (node_id, record) in enumerate(zip(nodes, records), start=1):
            if record.format_version != RECORD_FORMAT_VERSION or record.node_id != node_id:
                out.append(decode_row(run_id, seq, node_id, record.SerializeToString()))  # upgrade, or refuse naming it
            else:
                out.append(StoredRecord(seq, node_id, record))
        return out

    async def read_rows(self, run_id: str) -> list[StoredRecord]:
        """Every record in seq order, decoded one by one (:data:`LOG_FRAMES_SQL`, one
        round trip): the checks of :func:`decode_row` per row, naming the row that fails."""
        frames = await self.db.fetchval(_READ_SQL, run_id)
        if frames is None:
            return []
        return [decode_row(run_id, seq, node_id, data) for seq, node_id, data in split_frames(frames)]


def decode_row(run_id: str, seq: int, node_id: str, data: bytes) -> StoredRecord:
    """Decode one stored record; raise :class:`CorruptRecord` naming it on failure."""
    record = NodeRecord()
    try:
        record.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError, sometimes others
        raise CorruptRecord(f"run {run_id} seq {seq} node {node_id!r}: record does not decode: {exc}") from None
    if record.format_version > RECORD_FORMAT_VERSION:
        raise CorruptRecord(
            f"run {run_id} seq {seq} node {node_id!r}: record format_version={record.format_version} is newer "
            f"than this build's {RECORD_FORMAT_VERSION}"
        )
    if record.node_id != node_id:
        raise CorruptRecord(f"run {run_id} seq {seq}: record names node {record.node_id!r}, row says {node_id!r}")
    version = record.format_version
    if version < 1:
        raise CorruptRecord(f"run {run_id} seq {seq} node {node_id!r}: record has no format_version")
    while version < RECORD_FORMAT_VERSION:
        record = RECORD_UPGRADERS[version](record)
        version += 1
    return StoredRecord(seq, node_id, record)
