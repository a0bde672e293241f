"""The reference runtime with a race in its retry path: a subject whose verdict on the
same case differs from run to run, for the flaky-verdict tests.

When a resumed run re-executes a tool call whose effect row was already written
(the first attempt was interrupted between ``effect.started`` and the commit of the
node's record), it reuses the stable idempotency key only when a coin from
``os.urandom`` says so; otherwise it sends the effect again under a fresh key, as
``defect:unkeyed-retry`` always does (the charge applied twice:
``provider.payment.ledger_equal``). A first attempt always uses the stable key, so the
golden run and every case without such a retry are deterministic; the cases that
``defect:unkeyed-retry`` fails, this subject fails about half the time.

Lives with the tests (``tests/subjects`` on ``PYTHONPATH``); not a catalogue mutant,
whose verdicts must be deterministic.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.effects import idempotency_key
from crashmatrix.reference_runtime.executor import Execution

from crashmatrix.scenarios.defects.runtime_defects import UnkeyedRetryAdapter


class CoinRetryExecution(Execution):
    """Re-executes an interrupted effect under a fresh key when ``os.urandom`` says so."""

    fresh_key = False

    async def run_tool(self, spec: Any) -> None:
        call = codec.decode(spec.input)["call"]
        stable = idempotency_key(self.graph.run_id, call["id"])
        retry = await self.rt.ledger.get(self.graph.run_id, stable) is not None
        self.fresh_key = retry and os.urandom(1)[0] < 128
        await super().run_tool(spec)

    def effect_key(self, call: dict[str, Any]) -> str:
        if self.fresh_key:
            return idempotency_key(self.graph.run_id, f"{call['id']}:{uuid.uuid4().hex}")
        return super().effect_key(call)


class CoinRetryAdapter(UnkeyedRetryAdapter):
    """The reference adapter on :class:`CoinRetryExecution` (a racy retry); caught, when
    the coin says so, by the checks that catch ``defect:unkeyed-retry``."""

    name = "racyretry"
    execution = CoinRetryExecution
    defect = "a resumed call reuses its idempotency key only when a coin says so"
    source = "tests: a subject with a race, for flaky verdicts"
