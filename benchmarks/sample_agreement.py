"""The grouping's soundness as a matrix report records it: did every sampled member
agree with its representative?

    python benchmarks/sample_agreement.py REPORT.json [REPORT.json ...]

Each file is a ``crashmatrix run --report`` file. Printed per report: the workload,
its cases and outcomes, the kill points and crash states, the groups that have members
(a group of one point prunes nothing), their members, the sampled members and how
many agreed with their representative, the same for the shared resumes, and every
harness error (an unsound grouping is one). Exit code 1 when a sampled member or a
shared resume disagreed or a case is a harness error; 2 for a file that is not a
matrix report with a ``pruning`` section.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any


def summarise(path: str, report: dict[str, Any]) -> tuple[str, bool]:
    p = report["pruning"]
    outcomes = Counter(c["outcome"] for c in report["cases"])
    groups = p.get("groups", [])
    with_members = [g for g in groups if g.get("members")]
    members = sum(len(g["members"]) for g in groups)
    sample, shared = p.get("sample", []), p.get("share_sample", [])
    bad = [s for s in sample + shared if not s.get("agree")]
    errors = [c for c in report["cases"] if c["outcome"] == "harness-error"]
    line = (f"{path}: {report.get('workload')} on {report.get('subject')}, {len(report['cases'])} cases "
            f"{dict(outcomes)}; kill {p.get('points')} points -> {p.get('crash_states')} crash states, "
            f"{len(with_members)} groups with members, {members} members; "
            f"sample {sum(1 for s in sample if s.get('agree'))}/{len(sample)} agree; "
            f"shared resumes {p.get('shared_resumes')}, sample {sum(1 for s in shared if s.get('agree'))}/{len(shared)} agree")
    for s in bad:
        line += f"\n  DISAGREES: {s['case']} vs {s.get('representative') or s.get('owner')}: {s.get('differences')}"
    for c in errors:
        line += f"\n  harness error {c['id']}: {(c.get('error') or '').splitlines()[0][:200] if c.get('error') else ''}"
    return line, not bad and not errors


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    ok = True
    for path in argv:
        try:
            with open(path, encoding="utf-8") as f:
                report = json.load(f)
            line, good = summarise(path, report)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"sample_agreement: {path}: not a matrix report with a pruning section ({exc!r})", file=sys.stderr)
            return 2
        print(line)
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
