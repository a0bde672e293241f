"""The golden runs must exercise what the workload declares before any case runs: a
workload whose every charge the payment provider refuses (a new user's ``"EUR"``) is
refused at the command line, exit 2, one line naming the provider and its answer, with
nothing left behind; a workload that declares no effects yet makes some is refused; a
sound one's report says, per provider, how many effects its golden runs applied."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import subprocess

import pytest

from crashmatrix.harness.errors import GoldenRunRefused
from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.plan import Case
from test_cli import CLI, _leftovers

pytestmark = pytest.mark.usefixtures("subjects_on_path")


def test_a_workload_whose_charges_are_all_refused_is_refused_before_any_case(cli_env, test_tag, tmp_path) -> None:
    env = dict(cli_env, PYTHONPATH=os.environ["PYTHONPATH"])
    proc = subprocess.run([*CLI, "run", "eurshop.workload:WORKLOAD", "--conversation", "conv1", "--kinds", "kill",
                           "--report", str(tmp_path / "r.json")],
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = [line for line in proc.stderr.strip().splitlines() if line.startswith("crashmatrix: error")]
    assert len(err) == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "applied no effect at payment, mail: payment answered 400 to POST /charges: currency: must be a " \
           "lowercase ISO 4217 code, got 'EUR'" in err[0], err
    assert "cases:" not in proc.stdout and not (tmp_path / "r.json").exists()
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_a_workload_that_declares_no_effects_but_makes_some_is_refused() -> None:
    with pytest.raises(GoldenRunRefused, match=r"applied 2 effect\(s\) \(payment 1, mail 1\), yet the workload "
                                               r"declares it makes none"):
        asyncio.run(run_matrix("eurshop.workload:NO_EFFECTS", cases=[Case.parse("eurshop.workload:NO_EFFECTS/conv1/golden")]))


def test_a_provider_answering_5xx_in_the_golden_run_is_refused_naming_its_message() -> None:
    with pytest.raises(GoldenRunRefused) as caught:
        asyncio.run(run_matrix("eurshop.workload:BROKEN_MODEL",
                               cases=[Case.parse("eurshop.workload:BROKEN_MODEL/conv1/golden")]))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the golden run of eurshop.workload:BROKEN_MODEL/conv1 on reference: "
                                                      "model answered 500 to POST /v1/complete: script_error: "), message
    assert "pricing table missing" in message


def test_the_report_says_how_many_effects_each_provider_applied() -> None:
    report = asyncio.run(run_matrix("checkout", cases=[Case.parse("checkout/conv2/kill@model.call.before[turn-2]#1")]))
    assert "golden runs applied effects: payment 1 (conv2 1); mail 1 (conv2 1)" in report.notes, report.notes
    assert any(n.startswith("golden runs' calls refused: conv2: payment answered 402 to POST /charges: card_declined")
               for n in report.notes), report.notes
    golden = report.to_dict()["golden"]["conv2"]
    assert golden["applied"] == {"payment": 1, "mail": 1}
    assert [r["http_status"] for r in golden["refusals"]] == [402]
    assert report.exit_code == 0
    # the runtime under test: here the reference runtime, shipped in crashmatrix's own distribution
    version = importlib.metadata.version("crashmatrix")
    assert report.to_dict()["releases"] == {"reference": {"crashmatrix": version}}
    assert report.notes[0] == f"runtime under test: crashmatrix {version}", report.notes


def test_the_command_lines_summary_says_how_many_effects_each_provider_applied(cli_env, test_tag, tmp_path) -> None:
    proc = subprocess.run([*CLI, "run", "checkout", "--conversation", "conv3", "--kinds", "term", "--kind-sample", "0",
                           "--shard", "1/40", "--report", str(tmp_path / "r.json")],
                          env=cli_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "golden runs applied effects: payment 2 (conv3 2); mail 1 (conv3 1)" in proc.stdout, proc.stdout
    assert _leftovers(test_tag, tmp_path) == ([], [])


def test_an_adapter_whose_observe_raises_is_one_line_naming_the_method(cli_env, test_tag, tmp_path) -> None:
    """An ``observe`` that raises on the golden run: exit 2, one line naming the method,
    the run and what it raised; no report, nothing left behind (it was a traceback)."""
    env = dict(cli_env, PYTHONPATH=os.environ["PYTHONPATH"])
    proc = subprocess.run([*CLI, "run", "checkout", "--conversation", "conv1", "--kinds", "kill",
                           "--subject", "misbehaving.adapter:ObserveRaises", "--report", str(tmp_path / "r.json")],
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crashmatrix: error: ObserveRaises.observe raised reading the "
                                                   "golden run of conv1"), proc.stderr
    assert "RuntimeError: column cm_runs.status2 does not exist" in lines[0]
    assert not (tmp_path / "r.json").exists() and _leftovers(test_tag, tmp_path) == ([], [])
