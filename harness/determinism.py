"""What a workload needs to be deterministic (docs/adapters.md, "Determinism").

The oracle compares every case with its golden run, and the explorer runs the golden run
twice before the first case: a value that differs between two clean runs, other than a
run-specific identifier, stops the matrix (``NondeterministicWorkload``, exit 2), because
no case could be judged against it. Randomness and time in a workload's tools or model
script must therefore come from a seed, never from ``random``'s global generator or the
wall clock:

- :func:`seed_of` ``(workload, conversation)``: a stable 64-bit seed, the same in every
  process and every run of the conversation (``RunContext.seed``);
- :func:`rng` ``(seed, *parts)``: a :class:`random.Random` for one step, seeded by the run's
  seed and the step's stable id (a node id, a tool-call ordinal): a resumed step draws
  the same numbers as the golden run's, whichever worker runs it;
- :data:`FROZEN_EPOCH` and :func:`clock`: a clock frozen at a fixed instant that steps by
  one second per step ordinal, so a "sent at" field is the same in every run
  (``RunContext.now``).

A run-specific identifier (a ``uuid4`` key stored before the send and reused on retry)
needs none of this: the oracle learns identifiers from the two golden runs and compares
by identity (:mod:`.normalize`).
"""

from __future__ import annotations

import hashlib
import random

FROZEN_EPOCH = 1_767_225_600.0
"""2026-01-01T00:00:00Z, in seconds since the Unix epoch: the frozen clock's instant."""


def seed_of(workload: str, conversation: str) -> int:
    """A stable 64-bit seed for one conversation of one workload (sha256 of both names)."""
    return int.from_bytes(hashlib.sha256(f"{workload}\x00{conversation}".encode()).digest()[:8], "big")


def rng(seed: int, *parts: object) -> random.Random:
    """A generator for one step: seeded by ``seed`` and the step's stable ``parts`` (say
    the node id), so every run and every resume of that step draws the same numbers."""
    text = "\x00".join([str(seed), *map(str, parts)])
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big"))


def clock(step: int = 0) -> float:
    """The frozen clock: :data:`FROZEN_EPOCH` plus ``step`` seconds (``step``: a stable
    ordinal of the step asking, e.g. the turn number; 0 for "the run's time")."""
    return FROZEN_EPOCH + step
