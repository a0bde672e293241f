"""The probe certifier end to end: real provider processes with SQLite ledgers, the
embedded fault proxy on real sockets, real SIGKILLs for the restart windows.

Cost: two full certifications (payment, docstore: ~6 s each on a quiet machine, mostly
the deadline, late-arrival and blackhole waits and two provider restarts) and a few
one- or two-window certifications (~1.5 s each: provider start and calibration).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

import _probe_parts as parts
from crashmatrix.harness.certify import (
    CertifyError,
    assert_probe_certified,
    certify_probe_sync,
    summary_text,
    window_names,
)

E = "crashmatrix.scenarios.probes_examples"
CHARGE = "crashmatrix.scenarios.checkout.tools:charge"
PROBE_CHARGE = "crashmatrix.scenarios.checkout.tools:probe_charge"
TRUTH = f"{E}:charge_truth"
JUDGED = {"reached", "agrees", "stable", "read_only", "bounded", "retry.deduplicated"}


def _certify_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "crashmatrix-certify-*")))


def test_payment_probe_certifies_in_every_window_and_leaves_nothing_behind() -> None:
    dirs_before = _certify_dirs()
    parts.MADE.clear()
    cert = assert_probe_certified(CHARGE, PROBE_CHARGE, TRUTH, sandbox=parts.recording_payment_sandbox)
    assert [w.name for w in cert.windows] == window_names()
    for w in cert.windows:
        assert JUDGED <= {c.name for c in w.checks}, w.name
        assert all(c.ok for c in w.checks), (w.name, w.failures())
    # the windows really were ambiguous for the caller, and both outcomes occurred
    callers = {w.name: w.caller.kind for w in cert.windows if w.caller}
    assert callers["cancel.after_send"] == "cancelled" and callers["deadline.response"] == "deadline"
    assert callers["reset.downstream"] == callers["provider.restart.after_apply"] == "ambiguous"
    assert {w.expected["answer"] for w in cert.windows} == {"applied", "not_applied"}
    # late arrival: not applied while held, the same-key retry applied it, the held
    # request then landed as a duplicate the provider folded into the one row
    late = cert.window("late.arrival")
    assert [a.answer for a in late.observed if a.when == "in_flight"] == ["not_applied"]
    assert late.expected["rows"] == 1 and late.expected["attempts"] == 2
    assert late.retry is not None and late.retry.kind == "ok"
    # the flaky link reset every other answer, and the blackhole cost the probe's own
    # bound, not the certifier's
    flaky = [a.answer for a in cert.window("probe.flaky_link").observed if a.when.startswith("flaky#")]
    assert flaky == ["cannot_tell_yet", "applied"] * 3  # a broken probe link is transient
    hole = [a for a in cert.window("probe.blackhole").observed if a.when == "blackhole"][0]
    assert hole.answer == "cannot_tell_yet" and 900 <= hole.ms < cert.settings["bound_ms"]
    # the certificate as JSON
    body = json.loads(json.dumps(cert.to_json()))
    assert body["verdict"] == "certified" and body["failing_windows"] == []
    assert body["tool"] == CHARGE and body["probe"] == PROBE_CHARGE and body["provider_version"]
    assert body["windows"][0]["expected"]["answer"] == "not_applied"
    # cleanup: the three server processes (start + two restarts) are gone, the work dir too
    (box,) = parts.MADE
    assert len(box.started_pids) == 3 and box.restarts == 2
    assert not [pid for pid in box.started_pids if psutil.pid_exists(pid)]
    assert _certify_dirs() == dirs_before


def test_docstore_read_back_probe_certifies() -> None:
    cert = assert_probe_certified(f"{E}:CREATE_NOTE", truth=f"{E}:note_truth")
    assert (cert.tool, cert.probe) == (f"{E}:CREATE_NOTE", f"{E}:probe_note")  # the Tool's own probe
    applied = cert.window("reset.downstream")
    assert applied.expected["outcome"]["result"]["doc_id"] == applied.observed[0].outcome["result"]["doc_id"]


@pytest.mark.parametrize(
    ("tool", "probe", "windows", "lies_in"),
    [
        # applied whenever the key was seen in a log of requests sent
        (f"{E}:charge_logged", f"{E}:probe_sent_log", ["reset.upstream", "reset.downstream"], "reset.upstream"),
        # checks only the most recent charge
        (CHARGE, f"{E}:probe_most_recent", ["neighbour.same_args", "neighbour.after"], "neighbour.after"),
        # ignores the key and matches on amount
        (f"{E}:charge_logged", f"{E}:probe_by_amount", ["reset.downstream", "neighbour.same_args"],
         "neighbour.same_args"),
    ],
    ids=["sent-log", "most-recent", "by-amount"],
)
def test_wrong_probe_is_refused_in_the_window_that_exposes_it(
    tool: str, probe: str, windows: list[str], lies_in: str
) -> None:
    cert = certify_probe_sync(tool, probe, TRUTH, windows=windows)
    assert cert.verdict == "refused" and cert.exit_code == 1
    assert cert.failing() == [lies_in]
    lie = [c for c in cert.window(lies_in).failures() if c.name == "agrees"]
    assert lie and lie[0].detail.startswith("lie:")
    other = next(w for w in cert.windows if w.name != lies_in)
    assert other.verdict == "pass", other.failures()
    assert lies_in in summary_text(cert)


def test_a_raising_probe_fails_and_a_fault_that_never_landed_is_an_error() -> None:
    cert = certify_probe_sync(CHARGE, parts.probe_raises, TRUTH, windows=["reset.downstream"])
    assert cert.verdict == "refused"
    failed = {c.name: c.detail for c in cert.window("reset.downstream").failures()}
    assert failed["agrees"] == "probe raised: RuntimeError: provider client exploded"
    # a tool that goes around the fault proxy: the reset never reaches its call
    parts.MADE.clear()
    cert = certify_probe_sync(parts.charge_direct, PROBE_CHARGE, TRUTH, windows=["reset.upstream"],
                              sandbox=parts.recording_payment_sandbox)
    assert cert.verdict == "error" and cert.exit_code == 3
    reached = [c for c in cert.window("reset.upstream").checks if c.name == "reached"]
    assert not reached[0].ok and "the caller saw ok" in reached[0].detail
    # a truth that does not read the tool's rows cannot certify anything
    with pytest.raises(CertifyError, match="disagrees with the tool's own answer"):
        certify_probe_sync(CHARGE, PROBE_CHARGE, parts.truth_wrong, windows=["never_used"],
                           sandbox=parts.recording_payment_sandbox)


def test_bad_parts_are_refused_before_anything_starts() -> None:
    with pytest.raises(CertifyError) as info:
        certify_probe_sync("nope.missing:tool", "no_colon", TRUTH)
    assert "cannot import 'nope.missing'" in str(info.value) and "must be MODULE:NAME" in str(info.value)
    with pytest.raises(CertifyError, match="names no sandbox"):
        certify_probe_sync(CHARGE, PROBE_CHARGE, parts.truth_wrong)
    with pytest.raises(CertifyError, match="must be an async function"):
        certify_probe_sync(CHARGE, parts.truth_wrong, TRUTH)
    with pytest.raises(CertifyError, match="effect=False"):
        certify_probe_sync(_search_tool(), PROBE_CHARGE, TRUTH)
    with pytest.raises(CertifyError, match="windows=.*must be one of"):
        certify_probe_sync(CHARGE, PROBE_CHARGE, TRUTH, windows=["reset.sideways"])
    with pytest.raises(CertifyError, match="deadline_ms"):
        certify_probe_sync(CHARGE, PROBE_CHARGE, TRUTH, deadline_ms=0)


def _search_tool():  # type: ignore[no-untyped-def]
    from crashmatrix.scenarios.checkout.tools import TOOLS

    return TOOLS["search"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "crashmatrix.harness.cli", "certify-probe", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_cli_certify_probe_exit_codes_report_and_one_line_errors(tmp_path: Path) -> None:
    report = tmp_path / "certificate.json"
    done = _cli(f"{E}:charge_logged", "--probe", f"{E}:probe_sent_log", "--truth", TRUTH,
                "--window", "reset.upstream", "--report", str(report), "--provider-version", "sandbox-7", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "REFUSED" in done.stdout and "reset.upstream" in done.stdout and "lie:" in done.stdout
    body = json.loads(report.read_text())
    assert body["verdict"] == "refused" and body["failing_windows"] == ["reset.upstream"]
    assert body["provider_version"] == "sandbox-7"
    (window,) = body["windows"]
    assert window["expected"]["answer"] == "not_applied" and window["observed"][0]["answer"] == "applied"
    bad = _cli(CHARGE, "--probe", PROBE_CHARGE, "--truth", f"{E}:no_such_truth", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        f"crashmatrix: error: cannot certify: truth='{E}:no_such_truth': module '{E}' has no attribute 'no_such_truth'"]
