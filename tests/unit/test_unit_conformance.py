"""The conformance table (harness/conformance.py) from hand-built results: the counts of
a cell, what the Markdown shows, the JSON round trip and the command's bad input."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crashmatrix.harness import cli
from crashmatrix.harness.conformance import (
    RUNTIMES, Row, Runtime, cell_text, check_shard, command_line, headline, load, runtimes_named, tabulate,
    to_markdown, write,
)
from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.case import CaseResult
from crashmatrix.harness.oracle import Verdict
from crashmatrix.harness.plan import Case

RT = Runtime("toy", "Toy runtime", "reference", "checkout", ("kill", "term", "pause"), ("crashmatrix",))
VERSIONS = {"crashmatrix": "9.9"}


def _result(plan: str, outcome: str, *verdicts: tuple[str, bool | None]) -> CaseResult:
    return CaseResult(Case.parse(f"checkout/conv1/{plan}"), "reference", outcome,
                      verdicts=[Verdict(check, "end", valid) for check, valid in verdicts])


RESULTS: list[CaseResult] = [
    _result("kill@step.after[a-1]#1", "pass", ("effects.applied_once", True), ("transcript.exact", True)),
    _result("kill@step.after[b-2]#1", "fail", ("effects.applied_once", False), ("transcript.exact", True)),
    _result("kill@step.after[c-3]#1", "fail", ("provider.payment.ledger_equal", None)),  # unknown breaks it too
    _result("term@step.after[a-1]#1", "pass", ("term.drained", True), ("effects.applied_once", True)),
    _result("term@step.after[b-2]#1", "harness-error", ("effects.applied_once", False)),  # error set below
    _result("term@step.after[c-3]#1", "fail", ("run.ends", False)),
]


RESULTS[4].error = "the fault never fired\n(its worker's log: ...)"


def test_a_cell_counts_the_cases_of_its_kind_judged_on_its_property_and_the_first_failure() -> None:
    row = tabulate(RT, RESULTS, VERSIONS)
    once = row.cells["effect exactly-once"]
    assert (once["kill"].judged, once["kill"].failed) == (3, 2)
    assert once["kill"].first_failure == "crashmatrix replay 'checkout/conv1/kill@step.after[b-2]#1'"
    assert once["kill"].first_failure_case == "checkout/conv1/kill@step.after[b-2]#1"
    assert (once["kill"].sample, once["kill"].sample_failed) == ("checkout/conv1/kill@step.after[a-1]#1", False)
    # the harness error counts in no cell
    assert (once["term"].judged, once["term"].failed, once["term"].first_failure) == (1, 0, None)
    assert row.harness_errors == 1 and row.cases == 6
    assert row.first_harness_error == "crashmatrix replay 'checkout/conv1/term@step.after[b-2]#1'"
    assert row.harness_error_reason == "the fault never fired"
    assert row.cells["prefix continuation"]["kill"].judged == 2
    assert row.cells["drain"] == {"term": row.cells["drain"]["term"]} and row.cells["drain"]["term"].judged == 1
    # resumability is judged on every faulted case that was judged at all
    assert (row.cells["resumability"]["kill"].judged, row.cells["resumability"]["term"].failed) == (3, 1)
    assert (row.failing_cells, row.cell_count) == (2, 6)


def test_a_golden_run_that_breaks_an_invariant_is_a_golden_cell_not_a_resumability_one() -> None:
    golden = CaseResult(Case.parse("checkout/conv1/golden"), "reference", "fail",
                        verdicts=[Verdict("effects.applied_once", "end", False)])
    row = tabulate(RT, [golden], VERSIONS)
    assert set(row.cells) == {"effect exactly-once"}
    assert row.cells["effect exactly-once"]["golden"].failed == 1
    page = to_markdown([row, tabulate(RT, RESULTS, VERSIONS)], "crashmatrix conformance", "2026-01-02").splitlines()
    assert "| runtime | kill | term | pause | golden |" in page
    assert "| Toy runtime | · | · | · | **1/1** |" in page and "| Toy runtime | **2/3** | 0/1 | · | · |" in page


def test_the_markdown_shows_failed_over_judged_dashes_dots_and_each_first_failure() -> None:
    ran = tabulate(RT, RESULTS, VERSIONS)
    absent = Row(Runtime("gone", "Gone runtime", "x:Y", "x:Z", ("kill",), ("no-such-dist",)), "not installed",
                 {"no-such-dist": "not installed"})
    page = to_markdown([ran, absent], "crashmatrix conformance --shard 1/11", "2026-01-02", shard_spec="1/11")
    lines = page.splitlines()
    assert "Generated 2026-01-02 by `crashmatrix conformance --shard 1/11`" in page and "shard 1/11" in page
    section = lines[lines.index("## effect exactly-once"):]
    assert "| runtime | kill | term | pause |" in section
    assert "| Toy runtime | **2/3** | 0/1 | · |" in section
    assert "| Gone runtime | - | - | - |" in section
    assert "- Toy runtime, kill: `crashmatrix replay 'checkout/conv1/kill@step.after[b-2]#1'`" in section
    assert "| Gone runtime (`gone`) | not installed | no-such-dist not installed | - | - | - |" \
           " not installed here (`pip install 'crashmatrix[gone]'`) |" in lines
    assert "**1 of 2 runtimes ran (1 not installed); 6 cells, 2 failing; 6 cases, 1 harness errors.**" in lines
    assert "## fencing" not in lines  # no row judged it
    assert "- Toy runtime (1): `crashmatrix replay 'checkout/conv1/term@step.after[b-2]#1'`: the fault never fired" \
        in lines


def test_cell_text_where_the_runtime_cannot_take_the_kind_or_did_not_run() -> None:
    row = tabulate(RT, RESULTS, VERSIONS)
    assert [cell_text(row, "drain", k) for k in ("kill", "term", "cancel")] == ["·", "0/1", "-"]
    row.status = "not run"
    assert cell_text(row, "drain", "term") == "-"
    assert headline([row]) == "0 of 1 runtimes ran (1 not run); 0 cells, 0 failing; 0 cases, 0 harness errors"


def test_write_then_load_gives_the_same_rows(tmp_path: Path) -> None:
    rows = [tabulate(RT, RESULTS, VERSIONS), Row(RUNTIMES[-1], "not run")]
    md, js = write(rows, tmp_path / "out", "crashmatrix conformance", date="2026-01-02", seconds=12.3)
    header, back = load(js)
    assert header["date"] == "2026-01-02" and header["seconds"] == 12 and header["command"] == "crashmatrix conformance"
    assert [r.to_dict() for r in back] == [r.to_dict() for r in rows]
    assert back[0].runtime == RT and md.read_text().startswith("# Resume conformance")


def test_the_written_page_is_what_its_json_renders(tmp_path: Path) -> None:
    """Seconds are rounded in the JSON and versions sorted there; the page shows the
    rounded figure and the versions in the row's package order."""
    rt = Runtime("two", "Two packages", "reference", "checkout", ("kill",), ("zeta-pkg", "alpha-pkg"))
    row = tabulate(rt, RESULTS[:1], {"zeta-pkg": "2.0", "alpha-pkg": "1.0"})
    row.seconds = 327.46
    md, js = write([row], tmp_path, "crashmatrix conformance", date="2026-01-02", seconds=100.6)
    header, back = load(js)
    page = to_markdown(back, header["command"], header["date"], tuple(header["conversations"]), header["shard"],
                       header["seconds"])
    assert md.read_text() == page
    assert "| zeta-pkg 2.0, alpha-pkg 1.0 | 1 | 0 | 328 |" in page  # 327.46 is 327.5 in the JSON and "in 2 min of wall time" in page
    js.write_text(json.dumps({"version": 99}))
    with pytest.raises(InvalidArgument, match="version=99"):
        load(js)


def test_command_line_names_every_option_that_changes_the_table() -> None:
    line = command_line(["reference", "dbos"], ("conv1", "conv2"), "1/11", "out dir", 2)
    assert shlex.split(line) == ["crashmatrix", "conformance", "--out", "out dir", "--runtime", "reference",
                                 "--runtime", "dbos", "--conversation", "conv1", "--conversation", "conv2",
                                 "--shard", "1/11", "--jobs", "2"]
    assert command_line() == "crashmatrix conformance"


def test_runtimes_named_keeps_table_order_and_names_an_unknown_one() -> None:
    assert [r.name for r in runtimes_named(["dbos", "reference"])] == ["reference", "dbos"]
    assert len(runtimes_named(None)) == len(RUNTIMES) == len({r.name for r in RUNTIMES})
    with pytest.raises(InvalidArgument, match="'nope' is not one of reference"):
        runtimes_named(["nope"])


def test_a_shard_must_be_prime_to_each_rows_number_of_kinds() -> None:
    check_shard("1/11", RUNTIMES)
    with pytest.raises(InvalidArgument, match="N=8 shares a factor with the 4 fault kinds of toy"):
        check_shard("3/8", [RT, Runtime("toy", "", "", "", ("a", "b", "c", "d"), ("x",))])
    with pytest.raises(InvalidArgument, match="K/N"):
        check_shard("eleven", RUNTIMES)


def test_the_command_refuses_bad_input_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(cli.app, ["conformance", "--runtime", "nope", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "--runtime 'nope' is not one of" in bad.output
    shard = runner.invoke(cli.app, ["conformance", "--runtime", "burr", "--shard", "1/8", "--out", str(tmp_path)])
    assert shard.exit_code == 2 and "N=8 shares a factor with the 4 fault kinds of burr" in shard.output
    conv = runner.invoke(cli.app, ["conformance", "--conversation", "conv9", "--out", str(tmp_path)])
    assert conv.exit_code == 2 and "--conversation 'conv9' is not one of conv1, conv2, conv3, conv4" in conv.output
    assert list(tmp_path.iterdir()) == []


def test_the_nightly_job_runs_the_whole_table_with_options_the_command_has() -> None:
    """The nightly job (ci/conformance-nightly.yml, its GitLab twin, .ci/conformance-nightly)
    runs every conversation of the checkout workload, no shard, and only options
    ``crashmatrix conformance`` takes; it is scheduled, outside the push suite."""
    import re

    import yaml

    from crashmatrix.harness import registry

    root = Path(__file__).resolve().parents[2]
    gh = yaml.safe_load((root / "ci" / "conformance-nightly.yml").read_text())
    triggers = gh.get("on", gh.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert set(triggers) == {"schedule", "workflow_dispatch"} and triggers["schedule"][0]["cron"]
    steps = gh["jobs"]["conformance-table"]["steps"]
    assert any(s.get("run") == ".ci/conformance-nightly" for s in steps)
    assert any(s.get("if") == "always()" and str(s.get("uses", "")).startswith("actions/upload-artifact") for s in steps)
    gl = yaml.safe_load((root / "ci" / "conformance-nightly.gitlab-ci.yml").read_text())["conformance-table"]
    assert gl["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "schedule"'}] and gl["script"] == [".ci/conformance-nightly"]
    script = (root / ".ci" / "conformance-nightly").read_text()
    runs = [line for line in script.splitlines() if "crashmatrix conformance" in line and not line.startswith("#")]
    assert len(runs) == 2 and ".ci/conformance-nightly" not in (root / ".ci" / "run").read_text()
    conversations = re.findall(r"--conversation (\w+)", script)
    assert conversations == list(registry.workload("checkout").conversations)
    help_text = CliRunner().invoke(cli.app, ["conformance", "--help"], env={"COLUMNS": "200"}).output
    for run in runs:
        assert "--shard" not in run and "$all" in run
        for option in re.findall(r"(--[a-z-]+)", run):
            assert option in help_text, option
