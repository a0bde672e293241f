"""A provider's durable ledger: one SQLite file per provider process.

The ledger is the provider's truth (docs/design.md, "Processes"): it lives outside the
subject's database and outside the worker, so neither a worker's death nor a
``db-restart`` takes it away. It is opened in WAL mode with ``synchronous=NORMAL`` by
default: a committed transaction is in the WAL file (in the OS page cache) before the
HTTP response is written, which is durable against the *provider process* being
killed. Pass ``synchronous="FULL"`` to also survive an OS crash (an fsync per commit).

Every call here is synchronous and runs on the server's event-loop thread, between two
awaits. That is what makes :meth:`Ledger.apply_once` atomic inside the process: no
other request can run between the look-up of a key and the insert of its row. The
transactions are ``BEGIN IMMEDIATE`` as well, and the server holds an exclusive lock
file next to the ledger, so a second process cannot write the same ledger either.

Row shape (what ``GET /ledger`` returns, in insertion order)::

    {
      "seq": 7,                 # global insertion order in this ledger (created order)
      "op": "charge",           # charge | refund | message | completion | document
      "key": "9f2c...",         # idempotency key (None for completions: never deduped;
                                #   "collection/doc_id" for documents)
      "run_id": "run-42",       # metadata.run_id of the request
      "ref": "ch_1a2b...",      # the provider-side object id (charge_id, refund_id, ...)
      "request": {...},         # the validated request fields (no metadata)
      "status": "succeeded",    # succeeded | declined | sent | billed | created
      "http_status": 200,       # the status the original request was answered with
      "result": {...},          # the body the original request was answered with
      "attempts": 1,            # requests that arrived with this key (1 for completions)
      "node_id": None,          # completions only: the node billed
      "call": None,             # completions only: 1-based call number for (run_id, node_id)
      "tokens": None,           # completions only: tokens billed
    }
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Ledger",
    "Decision",
    "NotRecorded",
    "Applied",
    "read_ledger_file",
    "LedgerFile",
    "ROW_FIELDS",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    op          TEXT    NOT NULL,
    key         TEXT,
    run_id      TEXT    NOT NULL,
    ref         TEXT,
    parent      TEXT,
    amount      INTEGER,
    request     TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    http_status INTEGER NOT NULL,
    result      TEXT    NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 1,
    node_id     TEXT,
    call        INTEGER,
    tokens      INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS ledger_op_key ON ledger(op, key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS ledger_run ON ledger(run_id, seq);
CREATE INDEX IF NOT EXISTS ledger_ref ON ledger(op, ref);
CREATE INDEX IF NOT EXISTS ledger_parent ON ledger(op, parent) WHERE parent IS NOT NULL;
CREATE INDEX IF NOT EXISTS ledger_node ON ledger(run_id, node_id) WHERE node_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS refusals (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT,
    method      TEXT    NOT NULL,
    path        TEXT    NOT NULL,
    http_status INTEGER NOT NULL,
    error       TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS refusals_run ON refusals(run_id, seq);
"""

ROW_FIELDS = (
    "seq",
    "op",
    "key",
    "run_id",
    "ref",
    "request",
    "status",
    "http_status",
    "result",
    "attempts",
    "node_id",
    "call",
    "tokens",
)
"""The keys of every ledger row dict, in order."""

_SELECT = (
    "SELECT seq, op, key, run_id, ref, request, status, http_status, result, attempts,"
    " node_id, call, tokens, amount FROM ledger"
)


_REFUSAL_FIELDS = ("seq", "run_id", "method", "path", "http_status", "error")
"""The keys of every refusal dict, in order."""
_SELECT_REFUSALS = "SELECT " + ", ".join(_REFUSAL_FIELDS) + " FROM refusals"


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Decision:
    """What a provider decided for a request it has not seen before; recorded as a row.

    ``amount`` (minor units) and ``parent`` (e.g. the charge a refund refers to) are
    indexed helper columns; they are not part of the row dict.
    """

    status: str
    http_status: int
    result: dict[str, Any]
    ref: str | None = None
    parent: str | None = None
    amount: int | None = None


class NotRecorded(Exception):
    """Raised by a decide function: answer ``http_status``/``body`` and record nothing
    (the request was refused before anything was applied, e.g. a refund of an unknown
    charge). A later request with the same key is decided afresh."""

    def __init__(self, http_status: int, body: dict[str, Any]) -> None:
        super().__init__(http_status, body)
        self.http_status = http_status
        self.body = body


@dataclass(frozen=True)
class Applied:
    """The outcome of :meth:`Ledger.apply_once`.

    ``replayed`` is True when the key had been seen before and the stored answer is
    returned; ``conflict`` is True when the key had been used with different request
    fields (the stored row is untouched except for ``attempts``).
    """

    http_status: int
    body: dict[str, Any]
    replayed: bool = False
    conflict: bool = False


class Ledger:
    """A provider ledger in the SQLite file at ``path`` (created if missing)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL") -> None:
        sync = synchronous.upper()
        if sync not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous={synchronous!r} must be NORMAL, FULL or EXTRA")
        self.path = Path(path)
        self._db = sqlite3.connect(str(self.path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={sync}")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    # -- writes ---------------------------------------------------------------------

    def apply_once(
        self,
        op: str,
        key: str,
        run_id: str,
        request: dict[str, Any],
        decide: Callable[[], Decision],
    ) -> Applied:
        """Apply the request ``(op, key)`` at most once.

        If a row with this op and key exists, its ``attempts`` is incremented and its
        stored answer is returned (``replayed=True``); if that row was made by a request
        with different fields or another run id, a 409 conflict is returned instead
        (Stripe's idempotency-key reuse error). Otherwise ``decide()`` runs inside the
        same transaction and its :class:`Decision` is inserted; a :class:`NotRecorded`
        raised by ``decide`` rolls back and answers without a row.

        Synchronous on purpose: the caller must not await between deciding to call this
        and its return, which makes check-and-insert atomic within the event loop.
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            found = db.execute(
                "SELECT seq, run_id, request, http_status, result FROM ledger"
                " WHERE op = ? AND key = ?",
                (op, key),
            ).fetchone()
            if found is not None:
                seq, old_run, old_request, http_status, result = found
                db.execute("UPDATE ledger SET attempts = attempts + 1 WHERE seq = ?", (seq,))
                db.execute("COMMIT")
                if old_run != run_id or old_request != _dumps(request):
                    return Applied(
                        409,
                        {
                            "error": (
                                "idempotency_key: reused with different parameters"
                                f" (first used by run {old_run!r} with {old_request})"
                            ),
                            "field": "idempotency_key",
                        },
                        replayed=True,
                        conflict=True,
                    )
                return Applied(http_status, json.loads(result), replayed=True)
            try:
                decision = decide()
            except NotRecorded as refused:
                db.execute("ROLLBACK")
                return Applied(refused.http_status, refused.body)
            db.execute(
                "INSERT INTO ledger (op, key, run_id, ref, parent, amount, request, status,"
                " http_status, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    op,
                    key,
                    run_id,
                    decision.ref,
                    decision.parent,
                    decision.amount,
                    _dumps(request),
                    decision.status,
                    decision.http_status,
                    _dumps(decision.result),
                ),
            )
            db.execute("COMMIT")
            return Applied(decision.http_status, decision.result)
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def bill(
        self,
        run_id: str,
        node_id: str,
        request: dict[str, Any],
        result: dict[str, Any],
        tokens: int,
        *,
        ref: str | None = None,
    ) -> int:
        """Record one billed model call (never deduplicated); return its ``call``
        number: 1 + the calls already billed for ``(run_id, node_id)``."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            (count,) = db.execute(
                "SELECT count(*) FROM ledger WHERE run_id = ? AND node_id = ?",
                (run_id, node_id),
            ).fetchone()
            call = count + 1
            db.execute(
                "INSERT INTO ledger (op, key, run_id, ref, request, status, http_status,"
                " result, node_id, call, tokens)"
                " VALUES ('completion', NULL, ?, ?, ?, 'billed', 200, ?, ?, ?, ?)",
                (run_id, ref, _dumps(request), _dumps(result), node_id, call, tokens),
            )
            db.execute("COMMIT")
            return call
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def refuse(self, run_id: str | None, method: str, path: str, http_status: int, error: str) -> None:
        """Record a request answered ``http_status`` >= 400 (``error``: the answer's
        message): refused input leaves no ledger row, so this is where a run's refused
        calls are kept (what the golden-run sanity check names)."""
        self._db.execute(
            "INSERT INTO refusals (run_id, method, path, http_status, error) VALUES (?, ?, ?, ?, ?)",
            (run_id, method, path, http_status, error[:500]),
        )

    def refusals(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Refused requests in arrival order (only ``run_id``'s when given):
        ``{"seq", "run_id", "method", "path", "http_status", "error"}``."""
        cur = (self._db.execute(_SELECT_REFUSALS + " ORDER BY seq") if run_id is None
               else self._db.execute(_SELECT_REFUSALS + " WHERE run_id = ? ORDER BY seq", (run_id,)))
        return [dict(zip(_REFUSAL_FIELDS, r)) for r in cur.fetchall()]

    # -- reads ----------------------------------------------------------------------

    def get(self, op: str, key: str) -> dict[str, Any] | None:
        """The row for ``(op, key)``, or None."""
        found = self._db.execute(_SELECT + " WHERE op = ? AND key = ?", (op, key)).fetchone()
        return None if found is None else _row(found)

    def get_by_ref(self, op: str, ref: str) -> dict[str, Any] | None:
        """The first row of ``op`` whose provider-side id is ``ref``, or None.
        The returned dict also carries the helper column ``amount``."""
        found = self._db.execute(
            _SELECT + " WHERE op = ? AND ref = ? ORDER BY seq LIMIT 1", (op, ref)
        ).fetchone()
        return None if found is None else _row(found, with_amount=True)

    def sum_amount(self, op: str, parent: str, status: str) -> int:
        """Sum of ``amount`` over rows of ``op`` with this ``parent`` and ``status``."""
        (total,) = self._db.execute(
            "SELECT coalesce(sum(amount), 0) FROM ledger WHERE op = ? AND parent = ?"
            " AND status = ?",
            (op, parent, status),
        ).fetchone()
        return int(total)

    def rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Rows in insertion order, only ``run_id``'s when given."""
        if run_id is None:
            cur = self._db.execute(_SELECT + " ORDER BY seq")
        else:
            cur = self._db.execute(_SELECT + " WHERE run_id = ? ORDER BY seq", (run_id,))
        return [_row(r) for r in cur.fetchall()]

    def close(self) -> None:
        """Checkpoint the WAL and close the file."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()


def _row(r: tuple[Any, ...], *, with_amount: bool = False) -> dict[str, Any]:
    row = dict(zip(ROW_FIELDS, r[: len(ROW_FIELDS)], strict=True))
    row["request"] = json.loads(row["request"])
    row["result"] = json.loads(row["result"])
    if with_amount:
        row["amount"] = r[len(ROW_FIELDS)]
    return row


class LedgerFile:
    """A running provider's ledger read from its file, read-only, by the process that
    judges runs (the controller): the same rows as ``GET /ledger?run_id=`` and ``GET
    /refusals?run_id=`` without a request through the provider's HTTP server. One
    connection, opened on the first read and kept; each read is its own snapshot of
    what the provider committed, which (WAL, the row committed before the answer is
    written: module docstring) includes every request the provider has answered.
    Raises ``sqlite3.Error`` when the file cannot be read."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            uri = self.path.resolve().as_uri() + "?mode=ro"
            # reads only, serialised by the caller's event loop; closed by close()
            self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout=5000")
        return self._db

    def rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """``run_id``'s ledger rows (every run's when None) in insertion order (shape:
        module docstring)."""
        db = self._connection()
        cur = (db.execute(_SELECT + " ORDER BY seq") if run_id is None
               else db.execute(_SELECT + " WHERE run_id = ? ORDER BY seq", (run_id,)))
        return [_row(r) for r in cur.fetchall()]

    def refusals(self, run_id: str) -> list[dict[str, Any]]:
        """``run_id``'s refused requests in arrival order (:meth:`Ledger.refusals`)."""
        cur = self._connection().execute(_SELECT_REFUSALS + " WHERE run_id = ? ORDER BY seq", (run_id,))
        return [dict(zip(_REFUSAL_FIELDS, r)) for r in cur.fetchall()]

    def close(self) -> None:
        """Close the connection (idempotent; a later read opens it again)."""
        if self._db is not None:
            self._db.close()
            self._db = None


def read_ledger_file(path: str | Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Read a ledger file directly (read-only), e.g. after its server is gone.

    Same rows as ``GET /ledger?run_id=``, read once (:class:`LedgerFile`). Safe while
    a server is writing (WAL readers do not block the writer)."""
    file = LedgerFile(path)
    try:
        return file.rows(run_id)
    finally:
        file.close()
