"""How much the default matrix's resume-policy sample changes from session to session.

    python benchmarks/sample_stability.py [--workload support_desk]
                                          [--conversations exchange,declined,goodwill] [--runs 4]

Each run starts a session (the services) and runs the workload's golden runs (as ``crashmatrix
run`` does), then lists the default matrix's cases (:func:`.defaults.default_matrix`)
and keeps the kill cases resumed ``concurrent`` and ``warm-worker``: one per sampled
crash state. A workload with concurrent tool calls may cut its golden trace into a
crash state more or fewer from one session to the next (the golden runs' reads inside
the concurrent stretch land at points of their timing). Printed: each run's crash
state count, and for each draw how many of the first run's picks every later run
replaced: ``ranked`` (what the matrix draws, :func:`.matrix._ranked_sample`: a
state's first case picked by a draw of its own id) and ``positional`` (one seeded
``random.sample`` over the list of states, the draw it replaced), on the same golden
runs. Exit code 0; a session that cannot start raises.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re

from crashmatrix.harness import matrix
from crashmatrix.harness.defaults import default_matrix
from crashmatrix.harness.session import open_session

POLICIES = ("concurrent", "warm-worker")


def _positional(found: list, indices: list[int], n: int, stream: str) -> list[int]:
    return indices if len(indices) <= n else sorted(random.Random(stream).sample(indices, n))


async def _session(workload: str, conversations: list[str]) -> tuple[dict[str, set[str]], str]:
    """The sampled policy case ids by draw, and the crash-state count from the note."""
    async with open_session("reference", workload) as explorer:
        goldens = {c: await explorer.golden(c) for c in conversations}
    ranked = matrix._ranked_sample
    out: dict[str, set[str]] = {}
    note = ""
    try:
        for name, draw in (("ranked", ranked), ("positional", _positional)):
            matrix._ranked_sample = draw
            cases, notes = default_matrix().cases(workload, goldens, ("step", "label"))
            out[name] = {c.id for c in cases if c.resume.label() in POLICIES}
            note = notes[-1]
    finally:
        matrix._ranked_sample = ranked
    states = re.search(r"concurrent \d+ of (\d+) crash states", note)
    return out, states.group(1) if states else "?"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="support_desk")
    ap.add_argument("--conversations", default="exchange,declined,goodwill")
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        picks, states = await _session(args.workload, args.conversations.split(","))
        runs.append(picks)
        print(f"run {i + 1}: {states} crash states, {len(picks['ranked'])} policy cases", flush=True)
    for name in ("ranked", "positional"):
        first = runs[0][name]
        replaced = [len(first - r[name]) for r in runs[1:]]
        print(f"{name:10s} picks replaced against the first run: {replaced} of {len(first)}")


if __name__ == "__main__":
    asyncio.run(main())
