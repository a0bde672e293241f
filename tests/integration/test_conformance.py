"""The committed resume-conformance table (docs/conformance.md, .json) is not stale: the
versions it claims are the installed ones, the page is what its JSON renders, and a
small sample of its cells replays to the same verdicts (a few cases, real services;
the whole table is the nightly ci job). harness/conformance.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from crashmatrix.harness.conformance import RUNTIMES, Row, load, runtime_versions, tabulate, to_markdown
from crashmatrix.harness.plan import Case

DOCS = Path(__file__).resolve().parents[2] / "docs"
HEADER, ROWS = load(DOCS / "conformance.json")


def test_the_table_has_a_row_for_every_runtime_and_each_installed_one_ran() -> None:
    assert [r.runtime.name for r in ROWS] == [r.name for r in RUNTIMES]
    for row, rt in zip(ROWS, RUNTIMES):
        made = tuple(getattr(row.runtime, f) for f in ("subject", "workload", "kinds", "sources", "packages"))
        assert made == (rt.subject, rt.workload, rt.kinds, rt.sources, rt.packages), \
            f"{rt.name}: the table's row was made with another matrix than RUNTIMES names now"
        if rt.installed():  # installed here: the table must have run it (not 'not installed', not an error)
            assert row.status in ("ran", "not run"), f"{rt.name}: {row.status} {row.error or ''}"
        else:
            assert row.status == "not installed", f"{rt.name} is not installed here but the table says {row.status}"
    assert sum(r.status == "ran" for r in ROWS) >= 8


@pytest.mark.parametrize("runtime", [r for r in RUNTIMES if r.installed()], ids=lambda r: r.name)
def test_the_versions_the_table_claims_are_the_installed_ones(runtime: object) -> None:
    [row] = [r for r in ROWS if r.runtime.name == runtime.name]  # type: ignore[attr-defined]
    if row.status == "ran":
        assert row.versions == runtime_versions(runtime), "docs/conformance.json is stale: run its command again"  # type: ignore[arg-type]


def test_the_page_is_what_the_json_renders() -> None:
    page = to_markdown(ROWS, HEADER["command"], HEADER["date"], tuple(HEADER["conversations"]), HEADER["shard"],
                       HEADER["seconds"])
    assert (DOCS / "conformance.md").read_text(encoding="utf-8") == page


def _sample() -> list[tuple[Row, str]]:
    """The cases to replay: the reference runtime's first kill sample, and the first
    failure of the first kill or term cell, in table order, of an installed runtime
    nobody here wrote, whose every case broke its property (a cell that fails only
    some of its cases may be a race of the runtime's: its replay could differ)."""
    ran = [r for r in ROWS if r.status == "ran"]
    ref = next(r for r in ran if r.runtime.name == "reference")
    chosen = [(ref, ref.cells["effect exactly-once"]["kill"].sample)]
    for row in ran:
        if row.runtime.name != "reference" and row.runtime.installed():
            failing = [c for kinds in row.cells.values() for k, c in kinds.items()
                       if k in ("kill", "term") and c.judged and c.failed == c.judged]
            if failing:
                chosen.append((row, failing[0].first_failure_case))
                break
    return chosen  # type: ignore[return-value]


def _claims(row: Row, case_id: str) -> dict[str, bool]:
    """Property -> broke, for each cell of ``row`` that names ``case_id`` (as its
    sample or as its first failure)."""
    out = {}
    for prop, kinds in row.cells.items():
        for cell in kinds.values():
            if cell.sample == case_id:
                out[prop] = bool(cell.sample_failed)
            if cell.first_failure_case == case_id:
                out[prop] = True
    return out


def test_a_sample_of_the_cells_replays_to_the_same_verdicts() -> None:
    from crashmatrix.harness.matrix import run_matrix

    sample = _sample()
    assert len(sample) == 2 and any(_claims(row, cid).values() for row, cid in sample), \
        "the sample should hold a failing cell, so the replay can disagree both ways"

    async def replay(row: Row, case_id: str) -> dict[str, bool]:
        case = Case.parse(case_id)
        report = await run_matrix(row.runtime.workload, row.runtime.subject, cases=[case], jobs=1, replay_failures=0)
        [result] = report.results
        assert result.outcome != "harness-error", result.error
        again = tabulate(row.runtime, [result], row.versions)
        return {p: any(c.failed for c in kinds.values()) for p, kinds in again.cells.items()}

    for row, case_id in sample:
        claims = _claims(row, case_id)
        got = asyncio.run(replay(row, case_id))
        assert {p: got.get(p) for p in claims} == claims, f"{row.runtime.name} {case_id}: the table is stale"
