"""How long one probe certification takes: every window, services included.

    python benchmarks/bench_probes.py [--runs 3] [--json out.json]

Certifies the payment probe ``--runs`` times and the document store's read-back probe
once (seed 0, default deadline 500 ms and bound 2000 ms) and prints, per run, the wall
seconds, the CPU seconds of this process and of the reaped provider processes, and the
load average; then the median wall time per window over the payment runs. Part of the
wall time is waiting by design: the deadline windows wait out the 500 ms deadline,
late.arrival waits 1.2 s for the held request, probe.blackhole waits out the probe's own
1 s timeout, and two provider restarts each start an interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

from crashmatrix.harness.certify import certify_probe_sync

E = "crashmatrix.scenarios.probes_examples"
TARGETS = {
    "payment": ("crashmatrix.scenarios.checkout.tools:charge", "crashmatrix.scenarios.checkout.tools:probe_charge",
                f"{E}:charge_truth"),
    "docstore": (f"{E}:CREATE_NOTE", None, f"{E}:note_truth"),
}


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def run(target: str) -> dict[str, object]:
    tool, probe, truth = TARGETS[target]
    load = os.getloadavg()[0]
    cpu0, kids0 = _cpu()
    started = time.monotonic()
    cert = certify_probe_sync(tool, probe, truth)
    wall = time.monotonic() - started
    cpu1, kids1 = _cpu()
    return {
        "target": target, "verdict": cert.verdict, "wall_s": round(wall, 2), "cpu_s": round(cpu1 - cpu0, 2),
        "children_cpu_s": round(kids1 - kids0, 2), "load": round(load, 1),
        "windows_ms": {w.name: w.ms for w in cert.windows},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = [run("payment") for _ in range(args.runs)] + [run("docstore")]
    print(f"{'target':9} {'verdict':10} {'wall s':>7} {'cpu s':>6} {'children cpu s':>15} {'load':>5}")
    for r in results:
        print(f"{r['target']:9} {r['verdict']:10} {r['wall_s']:7} {r['cpu_s']:6} {r['children_cpu_s']:15} {r['load']:5}")
    payment = [r for r in results if r["target"] == "payment"]
    print("\nmedian ms per window (payment):")
    for name in payment[0]["windows_ms"]:  # type: ignore[union-attr]
        print(f"  {name:30} {statistics.median(r['windows_ms'][name] for r in payment):8.0f}")  # type: ignore[index]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
