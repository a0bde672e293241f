"""``crashmatrix certify-probe`` against a service a workload declares: the ticketing
workload's ``open_ticket`` tool and its status-route probe, on the declared service
run by the harness (real process, SQLite ledger, SIGKILL restarts, the fault proxy)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = "crashmatrix.scenarios.ticketing.tools:OPEN_TICKET"
TRUTH = "crashmatrix.scenarios.probes_examples:ticket_truth"
WINDOWS = ("reset.downstream", "late.arrival", "provider.restart.after_apply", "neighbour.same_args")


def test_certify_probe_certifies_the_status_route_probe_of_a_declared_service(tmp_path: Path) -> None:
    report = tmp_path / "certificate.json"
    args = [a for w in WINDOWS for a in ("--window", w)]
    done = subprocess.run([sys.executable, "-P", "-m", "crashmatrix.harness.cli", "certify-probe", TOOL,
                           "--truth", TRUTH, *args, "--report", str(report)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "CERTIFIED" in done.stdout
    cert = json.loads(report.read_text())
    assert cert["verdict"] == "certified" and cert["failing_windows"] == []
    assert cert["probe"] == "crashmatrix.scenarios.ticketing.tools:probe_ticket"  # the Tool's own probe
    windows = {w["name"]: w for w in cert["windows"]}
    assert set(windows) == set(WINDOWS)
    applied = windows["reset.downstream"]["expected"]
    assert applied["answer"] == "applied" and applied["outcome"]["result"]["ticket_id"].startswith("TCK-")
    # the held request landed after the same-key retry, folded by the service into one row
    assert (windows["late.arrival"]["expected"]["rows"], windows["late.arrival"]["expected"]["attempts"]) == (1, 2)
    assert windows["neighbour.same_args"]["expected"]["answer"] == "not_applied"
