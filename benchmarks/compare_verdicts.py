"""Compare two crashmatrix JSON reports case id by case id: same cases, same verdicts?

Usage::

    python benchmarks/compare_verdicts.py BEFORE.json AFTER.json [--details N]

Both files are ``crashmatrix run --report`` (or ``replay --report``) files, or both are
``crashmatrix selftest --report`` files.

- Matrix reports (``--subset``: AFTER ran a part of BEFORE's matrix, a shard or a
  conversation; cases only BEFORE has are not counted): each case id's ``outcome`` (pass, fail, harness-error) and its failed
  checks (every verdict that is not ``valid``) are compared. Printed: the cases only in
  one report, the cases whose outcome or failed checks differ (up to ``--details``,
  default 40, with the harness error if any), and the counts of each report.
- Selftest reports: per mutant, whether it was caught, by a check it names (a
  difference otherwise); which case caught it first, by which of its checks, and the
  failed-check counts are printed when they differ, as information only (``--fast``
  stops at the first catch in completion order, which depends on timing). Per baseline:
  whether it passed, and its failing cases.

Exit code: 0 the same case ids and verdicts; 1 a difference; 2 bad input (one line).
It is how a refactor of the case runner shows "the same verdicts before and after"
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any


class BadReport(Exception):
    """A file that is not a report this script reads."""


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise BadReport(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not ("cases" in data or "mutants" in data):
        raise BadReport(f"{path}: neither a matrix report (cases) nor a selftest report (mutants)")
    return data


def case_verdicts(report: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Case id -> (outcome, sorted failed checks) of a matrix report. A case id seen
    twice keeps its last record (a report never holds one twice)."""
    out = {}
    for case in report["cases"]:
        failed = tuple(sorted({v["check"] for v in case.get("verdicts", []) if v.get("verdict") != "valid"}))
        out[case["id"]] = (case["outcome"], failed)
    return out


def compare_matrix(a: dict[str, Any], b: dict[str, Any], details: int, subset: bool = False) -> int:
    va, vb = case_verdicts(a), case_verdicts(b)
    if subset:  # AFTER ran a part of BEFORE's matrix (a shard, a conversation): compare that part
        va = {cid: v for cid, v in va.items() if cid in vb}
    only_a, only_b = sorted(set(va) - set(vb)), sorted(set(vb) - set(va))
    changed = [cid for cid in va if cid in vb and va[cid] != vb[cid]]
    errors_b = {c["id"]: c.get("error") for c in b["cases"]}
    for name, ids in (("only in BEFORE", only_a), ("only in AFTER", only_b)):
        if ids:
            print(f"{len(ids)} case(s) {name}:")
            for cid in ids[:details]:
                print(f"  {cid}")
    if changed:
        print(f"{len(changed)} case(s) with a different verdict:")
        for cid in changed[:details]:
            (oa, fa), (ob, fb) = va[cid], vb[cid]
            print(f"  {cid}\n    before: {oa} {', '.join(fa) or '-'}\n    after:  {ob} {', '.join(fb) or '-'}")
            if ob == "harness-error" and errors_b.get(cid):
                print(f"    after's error: {errors_b[cid].splitlines()[0][:200]}")
    for label, v in (("BEFORE", va), ("AFTER", vb)):
        counts = Counter(o for o, _ in v.values())
        checks = Counter(c for _, f in v.values() for c in f)
        print(f"{label}: {len(v)} cases, " + ", ".join(f"{k} {counts[k]}" for k in ("pass", "fail", "harness-error"))
              + (f"; failed checks: {', '.join(f'{c} {n}' for c, n in sorted(checks.items()))}" if checks else ""))
    same = len(set(va) & set(vb))
    print(f"same case ids: {same}; only before: {len(only_a)}; only after: {len(only_b)}; "
          f"different verdicts: {len(changed)}")
    return 1 if only_a or only_b or changed else 0


def _pairs(a: list[dict[str, Any]], b: list[dict[str, Any]], what: str) -> tuple[list[tuple[str, Any, Any]], int]:
    """``(subject, before, after)`` for the subjects in both lists; prints the subjects
    only one has and counts those only BEFORE has (one only AFTER has was added)."""
    xa, xb = {m["subject"]: m for m in a}, {m["subject"]: m for m in b}
    missing = 0
    for subject in sorted(set(xa) ^ set(xb)):
        if subject in xb:  # a catalogue entry added since: an addition, not a changed verdict
            print(f"{what} {subject}: only in AFTER (added; caught={xb[subject].get('caught', xb[subject].get('ok'))})")
            continue
        print(f"{what} {subject}: only in BEFORE")
        missing += 1
    return [(s, xa[s], xb[s]) for s in sorted(set(xa) & set(xb))], missing


def compare_selftest(a: dict[str, Any], b: dict[str, Any]) -> int:
    mutants, diffs = _pairs(a["mutants"], b["mutants"], "mutant")
    for subject, x, y in mutants:
        if x["caught"] != y["caught"] or (y["caught"] and y.get("check") not in y.get("caught_by", [y.get("check")])):
            print(f"mutant {subject}: before caught={x['caught']} by {x.get('check')}; "
                  f"after caught={y['caught']} by {y.get('check')}")
            diffs += 1
            continue
        same = (x.get("first_case"), x.get("check"), x.get("failed_checks")) == (y.get("first_case"), y.get("check"), y.get("failed_checks"))
        if not same:  # --fast stops at the first catch in completion order: which case, and so which check, is timing
            print(f"mutant {subject}: caught both times; first catch {x.get('first_case')} by {x.get('check')} -> "
                  f"{y.get('first_case')} by {y.get('check')} (information: completion order"
                  + ("; failed-check counts equal)" if x.get("failed_checks") == y.get("failed_checks") else
                     f"; failed checks {x.get('failed_checks')} -> {y.get('failed_checks')})"))
    baselines, missing = _pairs(a["baselines"], b["baselines"], "baseline")
    diffs += missing
    for subject, x, y in baselines:
        fa = sorted((f["case"], f["outcome"]) for f in x.get("failures", []))
        fb = sorted((f["case"], f["outcome"]) for f in y.get("failures", []))
        if x["ok"] != y["ok"] or fa != fb:
            print(f"baseline {subject}: before ok={x['ok']} failures={fa}; after ok={y['ok']} failures={fb}")
            diffs += 1
    for label, r in (("BEFORE", a), ("AFTER", b)):
        caught = sum(1 for m in r["mutants"] if m["caught"])
        print(f"{label}: exit {r['exit_code']}; {caught}/{len(r['mutants'])} mutants caught; baselines "
              + ", ".join(f"{s['subject']} {'ok' if s['ok'] else 'NOT ok'} ({s['cases']['run']} cases)" for s in r["baselines"]))
    print(f"differences: {diffs}")
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--details", type=int, default=40, help="differing cases printed in detail")
    parser.add_argument("--subset", action="store_true",
                        help="AFTER ran part of BEFORE's matrix (a shard, a conversation): ignore cases only BEFORE has")
    args = parser.parse_args(argv)
    try:
        a, b = _load(args.before), _load(args.after)
        if ("cases" in a) != ("cases" in b):
            raise BadReport("one report is a matrix, the other a selftest")
    except BadReport as exc:
        print(f"compare_verdicts: {exc}", file=sys.stderr)
        return 2
    return compare_matrix(a, b, args.details, args.subset) if "cases" in a else compare_selftest(a, b)


if __name__ == "__main__":
    sys.exit(main())
