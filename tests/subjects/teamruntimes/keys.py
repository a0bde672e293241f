"""Reference-runtime variants whose idempotency key is not derived from ids but made
once per tool call, stored in the effect ledger before the request leaves, and read
back on every later attempt: the textbook design, in the formats teams use.

``*Adapter`` is correct; ``Fresh*Adapter`` plants the defect: it makes a new key on every
attempt instead of reading the stored one (a resume after the provider answered charges
again).
"""

from __future__ import annotations

import os
import secrets
import uuid
from typing import Any

from crashmatrix.harness.adapter import RunContext
from crashmatrix.harness.adapters.reference import ReferenceAdapter, blob_store
from crashmatrix.reference_runtime import Runtime, connect
from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.db import Db
from crashmatrix.reference_runtime.executor import Execution

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid() -> str:
    """A ULID: 48 bits of milliseconds and 80 random bits, Crockford base32 (26 characters)."""
    import time

    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


class StoredKeyExecution(Execution):
    """Keys made by :meth:`new_key` once per tool call; later attempts reuse the key the
    effect ledger holds for the node (``reuse = False``: the planted defect)."""

    reuse = True

    async def new_key(self) -> str:
        return str(uuid.uuid4())

    async def run_tool(self, spec: Any) -> None:
        call = codec.decode(spec.input)["call"]
        tool = self.agent_for(spec.node_id).tools[call["name"]]
        if getattr(tool, "effect", False):
            stored = None
            if self.reuse:
                stored = await self.rt.db.fetchval(
                    "SELECT idem_key FROM cm_effects WHERE run_id = $1 AND node_id = $2",
                    self.graph.run_id, spec.node_id)
            self.__dict__.setdefault("_keys", {})[call["id"]] = stored or await self.new_key()
        await super().run_tool(spec)

    def effect_key(self, call: dict[str, Any]) -> str:
        return self.__dict__["_keys"][call["id"]]


class UuidHexExecution(StoredKeyExecution):
    async def new_key(self) -> str:
        return uuid.uuid4().hex


class UlidExecution(StoredKeyExecution):
    async def new_key(self) -> str:
        return ulid()


class SequenceExecution(StoredKeyExecution):
    async def new_key(self) -> str:
        return str(await self.rt.db.fetchval("SELECT nextval('team_effect_keys')"))


class Base64Execution(StoredKeyExecution):
    async def new_key(self) -> str:
        return secrets.token_urlsafe(16)


class KeyAdapter(ReferenceAdapter):
    """The reference runtime with keys made by :attr:`execution` (stored, reused)."""

    execution: type[Execution] = StoredKeyExecution

    async def prepare(self, env: Any) -> None:
        await super().prepare(env)
        db = await connect(env.dsn, application_name="teamruntimes-prepare")
        try:
            await db.conn.execute("CREATE SEQUENCE IF NOT EXISTS team_effect_keys")
        finally:
            await db.close()

    def make_runtime(self, db: Db, agent: Any, ctx: RunContext) -> Runtime:
        execution = self.execution

        class KeyRuntime(Runtime):
            @property
            def execution_class(self) -> type[Execution]:
                return execution

        return KeyRuntime(db, agent, worker_id=ctx.worker_id, on_step=ctx.on_step, blobs=blob_store(ctx.env))


def _fresh(execution: type[StoredKeyExecution]) -> type[StoredKeyExecution]:
    return type(f"Fresh{execution.__name__}", (execution,), {"reuse": False})


class UuidKeyAdapter(KeyAdapter):
    """Keys: ``str(uuid.uuid4())``."""
    name = "team-uuid4"


class UuidHexKeyAdapter(KeyAdapter):
    """Keys: ``uuid.uuid4().hex``."""
    name = "team-uuid-hex"
    execution = UuidHexExecution


class UlidKeyAdapter(KeyAdapter):
    """Keys: ULIDs."""
    name = "team-ulid"
    execution = UlidExecution


class SequenceKeyAdapter(KeyAdapter):
    """Keys: integers from a PostgreSQL sequence."""
    name = "team-sequence"
    execution = SequenceExecution


class Base64KeyAdapter(KeyAdapter):
    """Keys: 16 random bytes, URL-safe base64."""
    name = "team-base64"
    execution = Base64Execution


class FreshUuidKeyAdapter(UuidKeyAdapter):
    """Planted defect: a fresh uuid4 on every attempt."""
    execution = _fresh(StoredKeyExecution)


class FreshSequenceKeyAdapter(SequenceKeyAdapter):
    """Planted defect: a fresh sequence number on every attempt."""
    execution = _fresh(SequenceExecution)


class FreshUlidKeyAdapter(UlidKeyAdapter):
    """Planted defect: a fresh ULID on every attempt."""
    execution = _fresh(UlidExecution)
