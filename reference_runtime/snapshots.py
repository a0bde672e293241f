"""The delta-and-snapshot store strategy (seed 000's shipped design), selectable instead
of the default append-only read path.

Writes: every record is appended to the log exactly as :class:`~.logstore.AppendOnlyLog`
does (one fenced statement that also moves the node's effect; the records after the
latest snapshot are the *deltas*); every ``every`` records the store also writes a full
:class:`~.records_pb2.Snapshot` of the log up to that ``seq`` to ``cm_run_snapshots``,
fenced by the lease epoch. Reads: the latest snapshot, then the deltas after it, in one
round trip.

Failure this module is built to make visible: a resume that applies the deltas in the
wrong order or misses one. Its guards, and what the harness checks when they are planted
away (``tests/walls/test_walls_store_strategies.py`` plants both):

- the deltas are read ``seq > upto_seq`` in ``seq`` order, and the assembled list must
  be exactly ``1..n`` with no gap or repetition (else :class:`~.logstore.CorruptRecord`
  naming the first bad position) before it is handed to the graph;
- a snapshot is written only from a prefix this process knows completely (it read the
  whole log on load and has appended every record since), and a crash between the
  append and the snapshot only leaves an older snapshot and more deltas: the snapshot
  is an optimisation, never the source of truth (the log rows are never deleted, so the
  oracle's own rehydrate from the full log still sees everything).

Cost: O(1) per turn for the append, plus an O(n) snapshot every ``every`` turns
(O(n / every) amortised); reads cost one snapshot decode plus at most ``every - 1``
deltas.
"""

from __future__ import annotations

from .db import Db
from .leases import Lease, LeaseLost
from .logstore import (
    LOG_FRAMES_SQL, RECORD_FORMAT_VERSION, AppendOnlyLog, CorruptRecord, EffectOutcome, StoredRecord, decode_row,
    split_frames,
)
from .records_pb2 import NodeRecord, Snapshot, SnapshotEntry

SNAPSHOT_FORMAT_VERSION = 1

_READ_SQL = f"""
WITH snap AS (
    SELECT upto_seq, snapshot FROM cm_run_snapshots WHERE run_id = $1 ORDER BY upto_seq DESC LIMIT 1
)
SELECT (SELECT upto_seq FROM snap) AS upto_seq,
       (SELECT snapshot FROM snap) AS snapshot,
       (SELECT {LOG_FRAMES_SQL} FROM cm_run_log
         WHERE run_id = $1 AND seq > coalesce((SELECT upto_seq FROM snap), 0)) AS frames
"""

_SNAPSHOT_SQL = """
WITH fence AS (SELECT 1 FROM cm_runs WHERE run_id = $1 AND lease_epoch = $4 FOR SHARE)
, ins AS (
    INSERT INTO cm_run_snapshots (run_id, upto_seq, snapshot, lease_epoch)
    SELECT $1, $2, $3, $4 FROM fence
    ON CONFLICT DO NOTHING RETURNING 1)
SELECT count(*) FROM fence
"""


class DeltaSnapshotStore:
    """Log appends (the deltas) plus a full snapshot every ``every`` records."""

    def __init__(self, db: Db, every: int = 10) -> None:
        if every < 1:
            raise ValueError(f"every={every} must be >= 1")
        self.db = db
        self.every = every
        self.log = AppendOnlyLog(db)
        self._known: dict[str, list[StoredRecord]] = {}

    async def append(self, lease: Lease, seq: int, record: NodeRecord, effect: EffectOutcome | None) -> bool:
        written = await self.log.append(lease, seq, record, effect)
        known = self._known.get(lease.run_id)
        if written and known is not None and len(known) == seq - 1:
            known.append(StoredRecord(seq, record.node_id, record))
            if seq % self.every == 0:
                await self.write_snapshot(lease, known)
        elif written:
            self._known.pop(lease.run_id, None)  # not a prefix this process knows: no snapshot
        return written

    async def append_many(
        self, lease: Lease, first_seq: int, items: list[tuple[NodeRecord, EffectOutcome | None]]
    ) -> list[bool]:
        """The log's group commit, then the snapshot if the batch reached a multiple of
        ``every`` (a snapshot up to the batch's last record). A subclass that overrides
        :meth:`append` gets one call per record."""
        if type(self).append is not DeltaSnapshotStore.append:
            return [await self.append(lease, first_seq + i, rec, eff) for i, (rec, eff) in enumerate(items)]
        written = await self.log.append_many(lease, first_seq, items)
        known = self._known.get(lease.run_id)
        if all(written) and known is not None and len(known) == first_seq - 1:
            known.extend(StoredRecord(first_seq + i, rec.node_id, rec) for i, (rec, _) in enumerate(items))
            if (first_seq - 1) // self.every != len(known) // self.every:
                await self.write_snapshot(lease, known)
        elif any(written):
            self._known.pop(lease.run_id, None)  # not a prefix this process knows: no snapshot
        return written

    async def write_snapshot(self, lease: Lease, records: list[StoredRecord]) -> None:
        snap = Snapshot(
            format_version=SNAPSHOT_FORMAT_VERSION,
            upto_seq=records[-1].seq,
            entries=[SnapshotEntry(seq=r.seq, record=r.record) for r in records],
        )
        ok = await self.db.fetchval(
            _SNAPSHOT_SQL, lease.run_id, records[-1].seq, snap.SerializeToString(deterministic=True), lease.epoch
        )
        if not ok:
            raise LeaseLost(f"run {lease.run_id}: snapshot refused, lease epoch {lease.epoch} is stale")

    async def read(self, run_id: str) -> list[StoredRecord]:
        row = await self.db.fetchrow(_READ_SQL, run_id)
        base: list[StoredRecord] = []
        if row is not None and row["snapshot"] is not None:
            base = self.snapshot_records(run_id, row["upto_seq"], bytes(row["snapshot"]))
        deltas = []
        if row is not None and row["frames"] is not None:
            deltas = [decode_row(run_id, s, n, d) for s, n, d in split_frames(row["frames"])]
        records = self.assemble(base, deltas)
        check_contiguous(run_id, records)
        self._known[run_id] = list(records)
        return records

    def snapshot_records(self, run_id: str, upto_seq: int, data: bytes) -> list[StoredRecord]:
        snap = Snapshot()
        try:
            snap.ParseFromString(data)
        except Exception as exc:
            raise CorruptRecord(f"run {run_id}: snapshot up to seq {upto_seq} does not decode: {exc}") from None
        if snap.format_version > SNAPSHOT_FORMAT_VERSION or snap.upto_seq != upto_seq:
            raise CorruptRecord(f"run {run_id}: snapshot up to seq {upto_seq} has format {snap.format_version}, "
                                f"upto_seq {snap.upto_seq}")
        out = []
        for e in snap.entries:
            record = e.record
            if record.format_version != RECORD_FORMAT_VERSION:  # an older record: upgraded (or refused) by decode_row
                out.append(decode_row(run_id, e.seq, record.node_id, record.SerializeToString()))
            else:
                out.append(StoredRecord(e.seq, record.node_id, record))
        return out

    def assemble(self, base: list[StoredRecord], deltas: list[StoredRecord]) -> list[StoredRecord]:
        """The snapshot's records, then the deltas after it (both in seq order)."""
        return base + deltas


def check_contiguous(run_id: str, records: list[StoredRecord]) -> None:
    """Refuse a gap, a repeat or a wrong order: seqs must be exactly 1..n."""
    for expected, item in enumerate(records, start=1):
        if item.seq != expected:
            raise CorruptRecord(
                f"run {run_id}: rehydrated records are not contiguous: position {expected} holds seq {item.seq} "
                f"(node {item.node_id!r}); a delta is missing or out of order"
            )
