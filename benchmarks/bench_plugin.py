"""Benchmarks of the pytest plugin (figures in docs/benchmarks.md).

1. ``collect``: collection time of the whole checkout matrix (4 conversations x
   kill,term,cancel x step,label: 1,089 items) from a user's test file, cold (the
   golden runs computed under the lock, services started) and warm (read from the
   golden-trace cache), against pytest collecting a plain one-test file (pytest's own
   start-up). Wall and CPU seconds (user + system of the pytest process).
2. ``services``: the xdist question, two workers each running a slice of cases: one
   set of services per worker (each its own embedded PostgreSQL: what the plugin does)
   against one PostgreSQL shared by both (started once, as the first worker would
   start it under a lock while the other waits; each worker still has its own
   providers and zygote). Setup seconds (until both are ready), wall seconds for
   setup + cases, CPU seconds of the two processes and their children.

3. ``jobs``: pytest runs of a matrix slice (conv1 x ``--kinds`` x step,label; kill:
   82 items; ``--kinds default``: checkout's default matrix, 1,293 items), the variants alternating in each round: ``jobs1``, serial with
   ``--crashmatrix-jobs 1`` (one case at a time, as pytest runs items); ``serial``,
   the default (the matrix's cases run ahead in the CLI's case loop, twice the cores
   at once, kill cases pruned); ``xdist``, ``-n N`` (one share worker per 8 jobs runs
   its share of the matrix by crash state in its own loop with the same jobs, and the
   other workers' items take the results); ``xdist-shares``, ``-n N
   --crashmatrix-share-workers N`` (every worker a share and a harness session of its
   own, the jobs divided among them); ``xdist1``, ``-n N --crashmatrix-jobs 1`` (no
   shares: each worker one case at a time, its own item's). The cache is warm for all; each
   row gives wall and CPU seconds (user + system of pytest and its waited-for
   children), the CPU seconds of the pytest process alone (serial: everything a case
   does in that one process; xdist: the controller's), and the 1-minute load before
   and after. ``plain`` and ``plain-xdist``: as many trivial items (``pass``), serial and
   ``-n N``, the crashmatrix plugin not loaded: what xdist itself costs on this machine
   (its workers' start-up and collection), the floor under the ``xdist`` variants.

    python benchmarks/bench_plugin.py collect [--warm 3]
    python benchmarks/bench_plugin.py services [--cases 20] [--rounds 2]
    python benchmarks/bench_plugin.py jobs [--rounds 1] [--kinds kill|default] [-n 2] [--variants jobs1,serial,xdist]

Print the machine's load (``uptime``) with the figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MATRIX_TEST = textwrap.dedent("""
    import pytest

    @pytest.mark.crashmatrix("checkout", subject="reference")
    def test_checkout(crashmatrix_case):
        crashmatrix_case.check()
""")
PLAIN_TEST = "def test_plain():\n    pass\n"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    cpu0, t0 = _children_cpu(), time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall, cpu, proc.stdout


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRASHMATRIX_", "PYTEST_"))}
    env["TMPDIR"] = str(tmp)
    return env


def bench_collect(warm: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-plugin-"))
    try:
        (tmp / "proj").mkdir()
        (tmp / "plain").mkdir()
        (tmp / "proj" / "test_matrix.py").write_text(MATRIX_TEST)
        (tmp / "plain" / "test_plain.py").write_text(PLAIN_TEST)
        env = _env(tmp)
        base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]
        rows = []
        wall, cpu, out = _timed(base, tmp / "plain", env)
        rows.append(("plain one-test file", wall, cpu, out.strip().splitlines()[-1]))
        wall, cpu, out = _timed(base, tmp / "proj", env)
        rows.append(("matrix, cold cache", wall, cpu, out.strip().splitlines()[-1]))
        for i in range(warm):
            wall, cpu, out = _timed(base, tmp / "proj", env)
            rows.append((f"matrix, warm cache #{i + 1}", wall, cpu, out.strip().splitlines()[-1]))
        print(f"{'run':24} {'wall s':>7} {'cpu s':>7}  pytest says")
        for name, wall, cpu, last in rows:
            print(f"{name:24} {wall:7.2f} {cpu:7.2f}  {last}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_WORKER = textwrap.dedent("""
    import json, os, sys, time, resource
    from crashmatrix.harness.live import LiveHarness
    from crashmatrix.harness.enumeration import enumerate_cases
    dsn, k, n, ready_file = sys.argv[1] or None, int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    t0 = time.monotonic()
    with LiveHarness("reference", "checkout", dsn=dsn) as h:
        golden = h.golden("conv1")
        t_ready = time.monotonic()
        cases = enumerate_cases("checkout", {"conv1": golden}, ("kill",), ("step", "label"))[k::2][:n]
        outcomes = [h.run_case(c).outcome for c in cases]
        t_cases = time.monotonic()
    print(json.dumps({"ready": t_ready - t0, "cases": t_cases - t_ready, "n": len(outcomes),
                      "passed": outcomes.count("pass"), "total": time.monotonic() - t0}))
""")


def _pair(dsn: str | None, n: int, tmp: Path) -> dict[str, float]:
    env = _env(tmp)
    cpu0, t0 = _children_cpu(), time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, dsn or "", str(k), str(n), ""], env=env,
                              stdout=subprocess.PIPE, text=True) for k in (0, 1)]
    outs = [json.loads(p.communicate()[0]) for p in procs]
    wall = time.monotonic() - t0
    return {"ready": max(o["ready"] for o in outs), "wall": wall, "cpu": _children_cpu() - cpu0,
            "cases": sum(o["n"] for o in outs), "passed": sum(o["passed"] for o in outs),
            "case_seconds": max(o["cases"] for o in outs)}


def bench_services(n: int, rounds: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from crashmatrix.harness.services.postgres import start_postgres
    from crashmatrix.harness.services.watchdog import Watchdog

    tmp = Path(tempfile.mkdtemp(prefix="bench-services-"))
    rows = []
    try:
        for r in range(rounds):
            rows.append(("one set per worker", _pair(None, n, tmp)))
            cpu0, t0 = _children_cpu(), time.monotonic()
            with Watchdog.start() as wd:
                pg = start_postgres(tmp / f"shared-{r}", watchdog=wd)
                pg_start, pg_cpu = time.monotonic() - t0, _children_cpu() - cpu0
                try:
                    shared = _pair(pg.dsn, n, tmp)
                finally:
                    pg.close()
            shared["ready"] += pg_start
            shared["wall"] += pg_start
            shared["cpu"] += pg_cpu
            rows.append(("shared PostgreSQL", shared))
        print(f"{'services':20} {'setup s':>8} {'wall s':>7} {'cpu s':>7} {'cases':>6} {'cases/s':>8}")
        for name, d in rows:
            rate = d["cases"] / d["case_seconds"] if d["case_seconds"] else 0
            print(f"{name:20} {d['ready']:8.2f} {d['wall']:7.2f} {d['cpu']:7.2f} {d['passed']:>3}/{d['cases']:<3}"
                  f" {rate:8.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: ``python -m pytest`` that prints its own CPU seconds (user + system of the pytest
#: process alone: in a serial run the harness's event loop, the oracle and pytest's
#: item protocol, all in one process; the controller's under xdist) as its last line
_PYTEST_SELF_CPU = ("import resource, sys, pytest\n"
                    "rc = pytest.main(sys.argv[1:])\n"
                    "r = resource.getrusage(resource.RUSAGE_SELF)\n"
                    "print(f'{r.ru_utime + r.ru_stime:.2f}', flush=True)\n"
                    "sys.exit(rc)\n")

JOBS_VARIANTS = {
    "jobs1": ("serial, --crashmatrix-jobs 1", ["--crashmatrix-jobs", "1"]),
    "serial": ("serial (jobs = 2 x cores)", []),
    "xdist": ("-n {n} (a share per 8 jobs)", ["-n", "{n}"]),
    "xdist-shares": ("-n {n}, a share each", ["-n", "{n}", "--crashmatrix-share-workers", "{n}"]),
    "xdist1": ("-n {n}, one case each (jobs 1)", ["-n", "{n}", "--crashmatrix-jobs", "1"]),
    # xdist's own floor: as many trivial items, crashmatrix's plugin not loaded
    "plain": ("plain items, serial", ["-p", "no:crashmatrix"]),
    "plain-xdist": ("plain items, -n {n}", ["-p", "no:crashmatrix", "-n", "{n}"]),
}
PLAIN_ITEMS_TEST = "import pytest\n\n@pytest.mark.parametrize('i', range({count}))\ndef test_plain(i):\n    pass\n"


def bench_jobs(rounds: int, kinds: str, workers: int, variants: list[str]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    try:
        (tmp / "proj").mkdir()
        kinds_list = ", ".join(repr(k) for k in kinds.split(","))
        (tmp / "proj" / "test_matrix.py").write_text(MATRIX_TEST if kinds == "default" else MATRIX_TEST.replace(
            'subject="reference")', f'subject="reference", conversations=["conv1"], kinds=[{kinds_list}])'))
        env = _env(tmp)
        base = [sys.executable, "-c", _PYTEST_SELF_CPU, "-p", "no:cacheprovider", "-p", "no:langsmith_plugin", "-q"]
        _, _, collected = _timed([*base, "--collect-only"], tmp / "proj", env)  # warm the golden-trace cache
        count = int(re.search(r"(\d+) tests? collected", collected).group(1))  # type: ignore[union-attr]
        (tmp / "plain").mkdir()
        (tmp / "plain" / "test_plain.py").write_text(PLAIN_ITEMS_TEST.format(count=count))
        print(f"{'run':30} {'wall s':>7} {'cpu s':>7} {'pytest':>7}  {'load before/after':18} pytest says")
        for _ in range(rounds):
            for v in variants:
                name, extra = JOBS_VARIANTS[v]
                load0 = os.getloadavg()[0]
                where = tmp / ("plain" if v.startswith("plain") else "proj")
                wall, cpu, out = _timed([*base, *(a.format(n=workers) for a in extra)], where, env)
                lines = out.strip().splitlines()
                print(f"{name.format(n=workers):30} {wall:7.2f} {cpu:7.2f} {float(lines[-1]):7.2f}  "
                      f"{load0:5.1f} / {os.getloadavg()[0]:5.1f}      {lines[-2]}", flush=True)
                for line in lines:
                    if line.startswith("crashmatrix: each of") or line.startswith("crashmatrix: xdist workers"):
                        print(f"{'':30} {line}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--warm", type=int, default=3)
    s = sub.add_parser("services")
    s.add_argument("--cases", type=int, default=20, help="cases per worker")
    s.add_argument("--rounds", type=int, default=2)
    j = sub.add_parser("jobs")
    j.add_argument("--rounds", type=int, default=1)
    j.add_argument("--kinds", default="kill", help="the slice: conv1 x these kinds x step,label (kill: 82 items); "
                   "default: checkout's default matrix, every conversation (as crashmatrix run checkout)")
    j.add_argument("-n", "--workers", type=int, default=2, help="xdist workers of the xdist variants")
    j.add_argument("--variants", default="jobs1,serial,xdist",
                   help=f"comma-separated, run in this order each round: {','.join(JOBS_VARIANTS)}")
    args = ap.parse_args()
    print("load:", os.getloadavg())
    if args.what == "collect":
        bench_collect(args.warm)
    elif args.what == "jobs":
        variants = args.variants.split(",")
        unknown = [v for v in variants if v not in JOBS_VARIANTS]
        if unknown:
            ap.error(f"--variants: unknown {','.join(unknown)}; each must be one of {','.join(JOBS_VARIANTS)}")
        bench_jobs(args.rounds, args.kinds, args.workers, variants)
    else:
        bench_services(args.cases, args.rounds)
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
