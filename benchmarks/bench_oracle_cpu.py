"""The controller's renaming work on recorded evidence: CPU per case, and its outputs.

    python benchmarks/bench_oracle_cpu.py record FILE [--conversations conv1]
                                                      [--kinds kill,term,cancel] [--jobs 4]
                                                      [--subject reference]
    python benchmarks/bench_oracle_cpu.py replay FILE [--rounds 5] [--out OUT.json]

``record`` runs one pruned matrix slice of checkout on ``--subject`` (as
``bench_case_cpu.py --prune`` does; ``--kinds default``: the default matrix, sampled
kinds and policies included) and pickles every call the controller made of
:func:`.oracle.end_checks` (golden and case evidence, allowance, identifier model) and of
:func:`.pruning.state_document` (crash evidence, model), in one pickle, so that a golden
run's evidence stays one object as it is in the matrix.

``replay`` makes those calls again, in recorded order, ``--rounds`` times in one process
(each round starts with the oracle's caches of normalised documents and the ``re`` module's cache of
compiled patterns cleared, as a new matrix starts),
and prints the process CPU time (``time.process_time``) per recorded case of the
fastest and the median round: a figure of the code under test only, with no PostgreSQL,
worker or provider in the process, so the machine's load moves it far less than a
matrix's wall time. ``--out`` writes every call's result (each verdict's check, phase,
verdict and details; each state document), so that two trees' outputs on the same
inputs can be compared byte for byte (``cmp``): run ``replay`` with each tree's Python.

Exit 2 with one line on a file that is not a recording.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import re
import statistics
import sys
import time
from typing import Any


async def _record(path: str, conversations: list[str], kinds: tuple[str, ...], jobs: int, subject: str) -> None:
    from crashmatrix.harness import oracle, pruning, runner
    from crashmatrix.harness.defaults import default_matrix
    from crashmatrix.harness.enumeration import enumerate_cases
    from crashmatrix.harness.explorer import Options
    from crashmatrix.harness.session import open_session

    calls: list[tuple[str, tuple[Any, ...]]] = []
    end_checks, state_document = oracle.end_checks, pruning.state_document

    def recording_end_checks(golden, case, allowance, identifiers=None):
        calls.append(("end_checks", (golden, case, dict(allowance), identifiers)))
        return end_checks(golden, case, allowance, identifiers)

    def recording_state_document(ev, model):
        calls.append(("state_document", (ev, model)))
        return state_document(ev, model)

    oracle.end_checks, pruning.state_document = recording_end_checks, recording_state_document
    async with open_session(subject, "checkout", options=Options()) as explorer:
        goldens = {c: await explorer.golden(c) for c in conversations}
        if kinds == ("default",):  # crashmatrix run's matrix: every-point kinds, then the samples
            cases, _ = default_matrix().cases("checkout", goldens, ("step", "label"))
        else:
            cases = enumerate_cases("checkout", goldens, kinds, ("step", "label"))
        results, _ = await runner.run_loop(explorer, cases, goldens, jobs, options=pruning.options_of(True))
    with open(path, "wb") as f:
        pickle.dump({"cases": len(results), "calls": calls}, f, protocol=pickle.HIGHEST_PROTOCOL)
    n_end = sum(name == "end_checks" for name, _ in calls)
    print(f"{path}: {len(results)} cases, {n_end} end_checks calls, {len(calls) - n_end} state_document calls")


def _verdict(v: Any) -> list[Any]:
    return [v.check, v.phase, v.valid, v.details, list(v.diff)]


def _replay(path: str, rounds: int, out: str | None) -> None:
    from crashmatrix.harness import oracle, pruning

    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
        n, calls = data["cases"], data["calls"]
    except Exception as exc:  # noqa: BLE001  unpickling raises whatever the bytes lead it to
        print(f"{path}: not a recording of bench_oracle_cpu.py record ({exc})", file=sys.stderr)
        raise SystemExit(2) from None
    funcs = {"end_checks": oracle.end_checks, "state_document": pruning.state_document}
    per_kind: dict[str, list[float]] = {"end_checks": [], "state_document": []}
    totals, results = [], []
    for _ in range(rounds):
        oracle._GOLDEN_DOCS.clear()
        getattr(oracle, "_CASE_DOCS", {}).clear()
        re.purge()  # a case's identifiers are new to the matrix: so are the patterns made of them
        spent = dict.fromkeys(funcs, 0.0)
        results = []
        for name, args in calls:
            t0 = time.process_time()
            result = funcs[name](*args)
            spent[name] += time.process_time() - t0
            results.append(result)
        for name in funcs:
            per_kind[name].append(spent[name] * 1000 / n)
        totals.append(sum(spent.values()) * 1000 / n)
    print(f"{n} cases, {len(calls)} calls, {rounds} rounds: ms CPU per case, min / median")
    for name, values in per_kind.items():
        print(f"  {name:15s} {min(values):6.2f} / {statistics.median(values):6.2f}")
    print(f"  {'sum':15s} {min(totals):6.2f} / {statistics.median(totals):6.2f}")
    if out:
        shaped = [[_verdict(v) for v in r] if isinstance(r, list) else r for r in results]
        with open(out, "w", encoding="utf-8") as f:
            json.dump(shaped, f, sort_keys=True, default=str, indent=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("file")
    rec.add_argument("--conversations", default="conv1")
    rec.add_argument("--kinds", default="kill,term,cancel")
    rec.add_argument("--jobs", type=int, default=4)
    rec.add_argument("--subject", default="reference")
    rep = sub.add_parser("replay")
    rep.add_argument("file")
    rep.add_argument("--rounds", type=int, default=5)
    rep.add_argument("--out")
    args = ap.parse_args()
    if args.mode == "record":
        asyncio.run(_record(args.file, args.conversations.split(","), tuple(args.kinds.split(",")), args.jobs, args.subject))
    else:
        _replay(args.file, args.rounds, args.out)


if __name__ == "__main__":
    main()
