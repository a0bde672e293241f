"""Pure logic of the plugin, the fuzzing strategies, the golden-trace cache, the source
hash and the reports (no services; the cache's lock is a real file lock across real
processes)."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from crashmatrix.harness import goldencache, plan
from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness import faults
from crashmatrix.harness.fuzz import fault_plans, order_kinds
from crashmatrix.harness.html_report import render_html
from crashmatrix.harness.plan import Case, FaultPlan
from crashmatrix.harness.plugin_settings import SETTINGS, resolve_settings
from crashmatrix.harness.report import failure_text

from _plugin_support import run_pytest

# -- settings precedence ----------------------------------------------------------------


class FakeConfig:
    """Just what :func:`resolve_settings` reads of a pytest config (unit test of pure
    logic: the precedence)."""

    def __init__(self, ini: dict[str, str], cli: dict[str, str]) -> None:
        self.ini, self.cli = ini, cli
        self.stash = pytest.Stash()

    def getini(self, name: str) -> str:
        return self.ini.get(name, "")

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.cli.get(name, default)


def test_settings_precedence_ini_env_cli_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    ini = {"crashmatrix_kinds": "kill", "crashmatrix_sources": "label", "crashmatrix_shard": "1/2",
           "crashmatrix_seed": "1", "crashmatrix_subject": "defect:unkeyed-retry"}
    cfg = FakeConfig(ini, {})
    s = resolve_settings(cfg)  # type: ignore[arg-type]
    assert (s.kinds, s.sources, s.shard, s.seed) == (("kill",), ("label",), "1/2", 1)
    assert s.origin["kinds"] == "crashmatrix_kinds (ini)"
    monkeypatch.setenv("CRASHMATRIX_KINDS", "term")
    monkeypatch.setenv("CRASHMATRIX_SEED", "2")
    s = resolve_settings(cfg)  # type: ignore[arg-type]
    assert (s.kinds, s.seed, s.sources) == (("term",), 2, ("label",))
    cfg.cli = {"crashmatrix_kinds": "cancel,kill", "crashmatrix_shard": "2/2"}
    s = resolve_settings(cfg)  # type: ignore[arg-type]
    assert (s.kinds, s.shard, s.seed) == (("cancel", "kill"), "2/2", 2)
    assert s.replay_failures == 1 and s.origin["replay_failures"] == "default"
    marker = pytest.mark.crashmatrix("drift", kinds=["pause"], subject="reference", replay_failures=0).mark
    s = resolve_settings(cfg, marker)  # type: ignore[arg-type]
    assert (s.workload, s.kinds, s.subject, s.shard, s.replay_failures) == ("drift", ("pause",), "reference", "2/2", 0)
    assert s.origin["kinds"] == "kinds (marker)" and s.origin["shard"] == "--crashmatrix-shard (command line)"
    # report paths are not marker settings; a seed left unset is drawn once per run
    with pytest.raises(InvalidArgument, match=r"unknown argument\(s\) report"):
        resolve_settings(cfg, pytest.mark.crashmatrix(report="x.json").mark)  # type: ignore[arg-type]
    monkeypatch.delenv("CRASHMATRIX_SEED")
    cfg.ini.pop("crashmatrix_seed")
    a, b = resolve_settings(cfg), resolve_settings(cfg)  # type: ignore[arg-type]
    assert a.seed == b.seed and a.origin["seed"] == "drawn for this run"


def test_no_kinds_set_expands_crashmatrix_runs_default_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no kinds set anywhere, a marked test's matrix is :func:`.defaults.default_matrix`'s
    (the sampled kinds and resume policies included), drawn with the seed set, else with
    crashmatrix run's seed 0; kinds set anywhere run whole."""
    from crashmatrix.harness.defaults import default_matrix

    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    monkeypatch.delenv("CRASHMATRIX_PG_DSN", raising=False)
    cfg = FakeConfig({}, {})
    s = resolve_settings(cfg)  # type: ignore[arg-type]
    assert s.matrix() == default_matrix() and s.origin["seed"] == "drawn for this run" and s.sample_seed == 0
    s = resolve_settings(cfg, pytest.mark.crashmatrix("checkout", kind_sample=3, seed=9).mark)  # type: ignore[arg-type]
    assert s.matrix() == default_matrix(kind_sample=3) and s.sample_seed == 9
    s = resolve_settings(cfg, pytest.mark.crashmatrix("checkout", resume="concurrent").mark)  # type: ignore[arg-type]
    assert s.matrix().sampled_policies == () and s.matrix().sampled_kinds == default_matrix().sampled_kinds
    cfg.ini = {"crashmatrix_kinds": "kill,term,cancel"}
    assert resolve_settings(cfg).matrix() == default_matrix(("kill", "term", "cancel"))  # type: ignore[arg-type]
    monkeypatch.setenv("CRASHMATRIX_PG_DSN", "postgresql://u@h/db")
    cfg.ini = {}
    assert "db-restart" not in dict(resolve_settings(cfg).matrix().sampled_kinds)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"kind_sample \(marker\)=-1: -1 must be an integer >= 0"):
        resolve_settings(cfg, pytest.mark.crashmatrix(kind_sample=-1).mark)  # type: ignore[arg-type]


def test_resume_with_makes_the_subject_a_build_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    cfg = FakeConfig({"crashmatrix_resume_with": "reference-next"}, {})
    s = resolve_settings(cfg)  # type: ignore[arg-type]
    assert (s.subject, s.resume_with) == ("reference>>reference-next", "reference-next")
    marker = pytest.mark.crashmatrix("checkout", subject="shop-v1", resume_with="shop-folded").mark
    assert resolve_settings(cfg, marker).subject == "shop-v1>>shop-folded"  # type: ignore[arg-type]
    from crashmatrix.harness.builds import label_cases, parse_subject

    [case] = label_cases([Case.parse("checkout/conv1/kill@x[t]#1")], parse_subject(resolve_settings(cfg).subject))  # type: ignore[arg-type]
    assert case.id.endswith("/upgrade:reference>reference-next")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("crashmatrix_kinds", "kill,explode", "crashmatrix_kinds (ini)='kill,explode': 'kill,explode': each item must be one of"),
    ("crashmatrix_sources", "steps", "crashmatrix_sources (ini)='steps'"),
    ("crashmatrix_shard", "3/2", "K must be between 1 and N"),
    ("crashmatrix_seed", "-4", "must be a non-negative integer"),
    ("crashmatrix_replay_failures", "-1", "crashmatrix_replay_failures (ini)='-1': '-1' must be an integer >= 0"),
])
def test_bad_settings_name_the_setting_and_its_source(key: str, value: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        resolve_settings(FakeConfig({key: value}, {}))  # type: ignore[arg-type]
    assert message in str(info.value)


def test_plugin_disabled_by_name_and_bad_ini_is_one_line(matrix_project: Path) -> None:
    off = run_pytest(matrix_project, "-p", "no:crashmatrix", "-q")
    assert off.returncode != 0
    assert "fixture 'crashmatrix_case' not found" in off.output, off.output[-2000:]
    (matrix_project / "pytest.ini").write_text("[pytest]\ncrashmatrix_kinds = kill,boom\n")
    bad = run_pytest(matrix_project, "--collect-only", "-q")
    assert bad.returncode == 4, bad.output[-2000:]
    errors = [line for line in bad.stderr.splitlines() if "crashmatrix" in line]
    assert errors == ["ERROR: crashmatrix: crashmatrix_kinds (ini)='kill,boom': 'kill,boom': each item must be one "
                      "of kill, term, cancel, pause, db-restart"] or errors[0].startswith(
                          "ERROR: crashmatrix: crashmatrix_kinds (ini)='kill,boom'"), bad.stderr


# -- fault-plan strategies ----------------------------------------------------------------

TRACE = [("step", "step.before", "turn-1", 1), ("label", "log.append.before", "turn-1", 1),
         ("label", "log.append.after", "turn-1", 1), ("step", "step.after", "turn-1", 1),
         ("label", "tool.request.before", "turn-1.tool-0", 1), ("label", "tool.request.after", "turn-1.tool-0", 1)]
RESUME = [("label", "log.append.before", "turn-2", 1), ("label", "log.append.after", "turn-2", 1)]


def _resume(p: FaultPlan) -> list[Any]:
    return RESUME if len(p.faults) == 1 else [("label", "log.append.before", "turn-3", 1)]


SETTINGS_FIND = settings(database=None, max_examples=500)


def test_plans_shrink_to_fewer_faults_earlier_points_simpler_kinds() -> None:
    plans = fault_plans(TRACE, kinds=("cancel", "term", "kill"), max_faults=3, resume_trace=_resume)
    # any plan with a term fault: the minimal one is one term at the first point
    p = find(plans, lambda p: any(f.kind == "term" for f in p.faults), settings=SETTINGS_FIND)
    assert [f.label() for f in p.faults] == ["term@step.before[turn-1]#1"]
    # a plan that reaches a tool point: one kill (simplest) at the first tool point
    p = find(plans, lambda p: any(f.point.task.endswith("tool-0") for f in p.faults), settings=SETTINGS_FIND)
    assert [f.label() for f in p.faults] == ["kill@tool.request.before[turn-1.tool-0]#1"]
    # needing a second fault: it lands in the resume's own trace (turn-2), not the golden one
    p = find(plans, lambda p: len(p.faults) >= 2, settings=SETTINGS_FIND)
    assert [f.label() for f in p.faults] == ["kill@step.before[turn-1]#1", "kill@log.append.before[turn-2]#1"]
    p = find(plans, lambda p: len(p.faults) == 3, settings=SETTINGS_FIND)
    assert p.faults[2].point.task == "turn-3"


def test_any_kind_follows_any_kind_and_sources_filter() -> None:
    plans = fault_plans(TRACE, kinds=("pause", "db-restart", "kill"), sources=("label",), max_faults=3,
                        resume_trace=_resume)
    p = find(plans, lambda p: p.faults[0].kind == "pause", settings=SETTINGS_FIND)
    assert len(p.faults) == 1 and p.faults[0].point.source == "label"
    # a pause or a db-restart is followed by a fault in the resume (the pause's: the worker
    # that takes the run over while it sleeps), and lands in a resume itself
    p = find(plans, lambda p: p.faults[0].kind == "pause" and len(p.faults) == 2, settings=SETTINGS_FIND)
    assert [f.label() for f in p.faults] == ["pause@log.append.before[turn-1]#1", "kill@log.append.before[turn-2]#1"]
    p = find(plans, lambda p: any(f.kind == "db-restart" for f in p.faults[1:]), settings=SETTINGS_FIND)
    assert p.faults[1].point.task == "turn-2"
    with pytest.raises(NoSuchExample):
        find(plans, lambda p: any(f.point.source == "step" for f in p.faults), settings=SETTINGS_FIND)
    # a resume that failed (None) ends the plan after its faults
    stop = fault_plans(TRACE, kinds=("kill",), min_faults=2, max_faults=2, resume_trace=lambda p: None)
    assert len(find(stop, lambda p: True, settings=SETTINGS_FIND).faults) == 1


def test_kinds_come_from_the_parameter_and_later_kinds_are_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    assert order_kinds(["db-restart", "net", "cancel", "kill", "term", "kill"]) == (
        "kill", "term", "cancel", "net", "db-restart")

    class BrandNew(faults.FaultKind):  # a kind registered later: drawn by default, ranked last
        name = "brand-new"

    monkeypatch.setitem(faults.KINDS, "brand-new", BrandNew())
    assert "brand-new" in plan.fault_kinds()
    assert order_kinds(["brand-new", "net", "kill"]) == ("kill", "net", "brand-new")
    plans = fault_plans(TRACE, max_faults=1)  # default: every kind of this build (net needs its toxics)
    p = find(plans, lambda p: p.faults[0].kind == "brand-new", settings=SETTINGS_FIND)
    assert p.faults[0].kind == "brand-new"
    with pytest.raises(NoSuchExample):
        find(plans, lambda p: p.faults[0].kind == "net", settings=SETTINGS_FIND)


def test_net_faults_land_where_a_link_is_in_use() -> None:
    from crashmatrix.harness.plan import CrashPoint, NetToxic

    heal = CrashPoint("label", "db.reconnect", "db", 1)
    toxics = {"log.append.before": [NetToxic("db", "reset_peer", (), "downstream", heal),
                                    NetToxic("db", "reset_peer", (), "downstream", None)]}
    plans = fault_plans(TRACE, kinds=("net", "kill"), max_faults=2, resume_trace=_resume,
                        net_toxics=lambda p: toxics.get(p.name, []))
    p = find(plans, lambda p: p.faults[0].kind == "net", settings=SETTINGS_FIND)
    assert [f.label() for f in p.faults] == ["net:db.reset_peer@log.append.before[turn-1]#1~db.reconnect[db]#1"]
    p = find(plans, lambda p: p.faults[0].kind == "net" and p.faults[0].net.heal is None, settings=SETTINGS_FIND)
    assert p.faults[0].net == toxics["log.append.before"][1]
    p = find(plans, lambda p: p.faults[0].kind == "net" and len(p.faults) == 2, settings=SETTINGS_FIND)
    assert p.faults[1].kind == "kill" and p.faults[1].point.task == "turn-2"
    # a later net fault lands at a point of the resume's trace that has a toxic
    p = find(plans, lambda p: any(f.kind == "net" for f in p.faults[1:]), settings=SETTINGS_FIND)
    assert p.faults[1].label() == "net:db.reset_peer@log.append.before[turn-2]#1~db.reconnect[db]#1"
    with pytest.raises(NoSuchExample):
        find(plans, lambda p: any(f.kind == "net" and f.point.name != "log.append.before" for f in p.faults),
             settings=SETTINGS_FIND)
    with pytest.raises(InvalidArgument, match="need net_toxics"):
        fault_plans(TRACE, kinds=("net",))
    with pytest.raises(InvalidArgument, match="has a net toxic"):
        fault_plans(TRACE, kinds=("net",), net_toxics=lambda p: [])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_faults": 0}, "min_faults=0 must be"),
    ({"max_faults": 2}, "needs resume_trace"),
    ({"kinds": ("kill", "explode")}, "kinds=('kill', 'explode') must be"),
    ({"kinds": ()}, "must be non-empty"),
    ({"sources": ("await",)}, "no point of these sources"),
])
def test_bad_strategy_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        fault_plans(TRACE, **kwargs)


# -- golden-trace cache -------------------------------------------------------------------


def _compute_in_process(cache_dir: str, log: str, out: str) -> None:
    def compute(missing: list[str]) -> dict[str, Any]:
        with open(log, "a") as f:
            f.write(",".join(missing) + "\n")
        time.sleep(0.5)  # the others wait on the lock meanwhile
        return {c: {"trace": [["label", "x.before", "turn-1", 1], ["step", "step.after", "turn-1", 1]], "seconds": 0.1}
                for c in missing}

    traces, computed = goldencache.load_traces(Path(cache_dir), "checkout", "reference", "ab" * 32, ["conv1"], compute)
    Path(out).write_text(json.dumps({"traces": traces, "computed": computed}))


def test_cache_computes_once_under_the_lock_across_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    log = tmp_path / "computed.log"
    procs = [ctx.Process(target=_compute_in_process, args=(str(tmp_path / "c"), str(log), str(tmp_path / f"{i}.json")))
             for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert log.read_text() == "conv1\n"  # one process computed, two read its file
    outs = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(3)]
    assert sorted(len(o["computed"]) for o in outs) == [0, 0, 1]
    assert all(o["traces"] == outs[0]["traces"] for o in outs)
    # another code hash is another file; the stale one is removed when it is written
    def compute(missing: list[str]) -> dict[str, Any]:
        return {c: {"trace": [("label", "y", "turn-1", 1)], "net_cases": ["checkout/conv1/kill@y[turn-1]#1"]}
                for c in missing}

    entries, computed = goldencache.load_traces(tmp_path / "c", "checkout", "reference", "cd" * 32, ["conv1"], compute)
    assert computed == ["conv1"] and entries["conv1"]["trace"] == [("label", "y", "turn-1", 1)]
    assert entries["conv1"]["net_cases"] == ["checkout/conv1/kill@y[turn-1]#1"]
    assert [p.name for p in (tmp_path / "c" / "goldens").glob("*.json")] == ["checkout--reference--cdcdcdcdcdcdcdcd.json"]
    assert goldencache.trace_mismatch([("label", "y", "turn-1", 1)], [("label", "z", "turn-1", 1)])
    assert goldencache.trace_mismatch([("label", "y", "turn-1", 1)], [("label", "y", "turn-1", 1)]) is None


def test_code_hash_follows_the_subjects_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crashmatrix.harness.sources import point_location, subject_sources

    pkg = tmp_path / "teamruntime"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "adapter.py").write_text(
        "from crashmatrix.harness.adapters.reference import ReferenceAdapter\n"
        "from crashmatrix.harness import crashpoint as cp\n"
        "from crashmatrix.harness.crashpoint import DRAIN_BEGIN, crashpoint\n\n"
        "class TeamAdapter(ReferenceAdapter):\n    def hook(self):\n        crashpoint('team.point')\n"
        "        crashpoint(DRAIN_BEGIN)\n        cp.crashpoint(cp.NODE_LAUNCH)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    first = subject_sources("teamruntime.adapter:TeamAdapter", "checkout")
    assert "teamruntime" in first.files and "crashmatrix.reference_runtime" in first.files
    assert point_location("team.point", "label", first) == "teamruntime/adapter.py:7"
    # a label named by crashpoint's constant is found as its name (the reference runtime's style)
    assert "teamruntime/adapter.py:8" in first.label_locations()["drain.begin"]
    assert "teamruntime/adapter.py:9" in first.label_locations()["node.launch"]
    assert any("reference_runtime/executor.py" in loc for loc in first.label_locations()["log.append.before"])
    assert first.label_locations() is first.label_locations()  # parsed once per SourceSet, not per case
    (pkg / "extra.py").write_text("X = 1\n")
    assert subject_sources("teamruntime.adapter:TeamAdapter", "checkout").code_hash() != first.code_hash()


# -- reports ------------------------------------------------------------------------------


def _record(cid: str, outcome: str) -> dict[str, Any]:
    from crashmatrix.harness.plan import Case

    case = Case.parse(cid)
    failed = outcome == "fail"
    return {
        "id": cid, "subject": "defect:x", "plan": case.plan.to_dict(), "outcome": outcome,
        "failed_check": "provider.payment.ledger_equal" if failed else None, "error": None, "run_id": "cm-run-1",
        "verdicts": [{"check": "provider.payment.ledger_equal", "phase": "end", "verdict": "invalid" if failed else "valid",
                      "details": "1 more row(s) than golden </script>", "diff": ["--- golden", "+++ case", "+ row"]}],
        "diff": [], "workers": [{"role": "start", "pid": 1, "returncode": None, "signal": 9, "seconds": 0.1,
                                 "timed_out": False, "cpu_ms": 3.0}],
        "seconds": 0.2, "replay": f"crashmatrix replay '{cid}' --subject defect:x", "location": "executor.py:325",
    }


def test_failure_text_and_html_structure() -> None:
    bad = _record("checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1+term@log.append.before[turn-5]#1", "fail")
    text = failure_text(bad)
    first, *rest = text.splitlines()
    assert first == (f"{bad['id']} failed provider.payment.ledger_equal (subject defect:x); "
                     f"replay: crashmatrix replay '{bad['id']}' --subject defect:x")
    assert "  fault 1: kill at label point tool.request.after of task turn-4.tool-0, occurrence 1 (in the first " \
           "worker), at executor.py:325" in rest
    assert "  fault 2: term at label point log.append.before of task turn-5, occurrence 1 (in resume 1)" in rest
    assert "    + row" in rest and rest[-1] == f"  replay: {bad['replay']}"
    cases = [_record("checkout/conv1/kill@step.after[turn-1]#1", "pass"),
             _record("checkout/conv1/term@step.after[turn-1]#1", "harness-error"),
             _record("checkout/conv2/kill@log.append.before[turn-2]#1", "pass"), bad]
    page = render_html({"workload": "checkout", "subject": "defect:x", "kinds": ["kill", "term"],
                        "sources": ["step", "label"], "summary": {"cases": 4}, "cases": cases})
    assert page.count('class="cell pass"') == 2 and page.count('class="cell harness-error"') == 1
    assert page.count('class="cell none"') == 1  # conv2's point has no term case
    assert 'class="case-row fail has-failure"' in page  # the two-fault plan is listed under the heatmap
    assert "</script>\"" not in page and "<\\/script>" in page  # data cannot close its script tag
    assert "http://" not in page and "https://" not in page


def test_html_heatmap_gives_each_toxic_at_one_point_its_own_column() -> None:
    """The network section lands several toxics at one crash point; one "net" column
    kept only the last of them, so a failing toxic could hide behind a passing one."""
    point = "log.append.before[turn-4]#1"
    blip = _record(f"checkout/conv1/net:db.reset_peer@{point}~db.reconnect[db]#1", "fail")
    cut = _record(f"checkout/conv1/net:db.timeout(timeout=200)@{point}", "pass")
    kill = _record(f"checkout/conv1/kill@{point}", "pass")
    page = render_html({"workload": "checkout", "subject": "defect:x", "kinds": ["kill", "net"],
                        "sources": ["label"], "summary": {"cases": 3}, "cases": [kill, blip, cut]})
    heatmap = page[page.index('<table class="heatmap"'):page.index("</table>")]
    assert "<th>net:db.reset_peer~db.reconnect[db]#1</th>" in heatmap and "<th>net:db.timeout(timeout=200)</th>" in heatmap
    assert "<th>net</th>" not in heatmap
    assert heatmap.count('class="cell pass"') == 2 and heatmap.count('class="cell fail"') == 1


# -- CI templates for other teams ---------------------------------------------------------


def test_ci_templates_run_shards_in_parallel_and_keep_both_reports() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2] / "ci"
    gh = yaml.safe_load((root / "github-actions.yml").read_text())
    job = gh["jobs"]["kill-matrix"]
    shards = job["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, len(shards) + 1)) and len(shards) > 1 and job["strategy"]["fail-fast"] is False
    run = next(s["run"] for s in job["steps"] if "crashmatrix run" in str(s.get("run", "")))
    assert "--shard ${{ matrix.shard }}/${{ env.SHARDS }}" in run and int(job["env"]["SHARDS"]) == len(shards)
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    assert {"crashmatrix-${{ matrix.shard }}.json", "crashmatrix-${{ matrix.shard }}.html"} <= set(
        upload["with"]["path"].splitlines())
    gl = yaml.safe_load((root / "gitlab-ci.yml").read_text())["crashmatrix"]
    assert gl["parallel"] > 1 and gl["artifacts"]["when"] == "always"
    script = " ".join(gl["script"])
    assert '--shard "$CI_NODE_INDEX/$CI_NODE_TOTAL"' in script and "--html" in script and "--report" in script
    assert {"crashmatrix-*.json", "crashmatrix-*.html"} <= set(gl["artifacts"]["paths"])


def test_ci_upgrade_jobs_crash_under_the_base_and_use_only_options_the_command_has() -> None:
    """The templates' deploy gate (docs/plugin.md, "Upgrade check"): the whole history is
    fetched, the base ref is the target branch, and every option of the command line is
    one ``crashmatrix upgrade-check`` takes."""
    import re

    import yaml
    from typer.testing import CliRunner

    from crashmatrix.harness.cli import app

    root = Path(__file__).resolve().parents[2] / "ci"
    gh = yaml.safe_load((root / "github-actions.yml").read_text())["jobs"]["upgrade-check"]
    checkout = next(s for s in gh["steps"] if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0 and gh["if"] == "github.event_name == 'pull_request'"
    gh_run = next(s["run"] for s in gh["steps"] if "upgrade-check" in str(s.get("run", "")))
    gl = yaml.safe_load((root / "gitlab-ci.yml").read_text())["crashmatrix-upgrade"]
    gl_run = next(line for line in gl["script"] if "upgrade-check" in line)
    assert gl["variables"]["GIT_DEPTH"] == 0
    assert '--base "origin/${{ github.base_ref }}"' in gh_run
    assert '--base "origin/$CI_MERGE_REQUEST_TARGET_BRANCH_NAME"' in gl_run
    help_text = CliRunner().invoke(app, ["upgrade-check", "--help"], env={"COLUMNS": "200"}).output
    for run in (gh_run, gl_run):
        assert '"$CRASHMATRIX" {dir}' in run  # the base's environment gets crashmatrix and the project
        for option in re.findall(r"(--[a-z-]+)", run):
            assert option in help_text, option


def test_crashmatrix_profiles_load_from_the_command_line(fuzz_project: Path) -> None:
    # Hypothesis's plugin loads --hypothesis-profile at configure; ours registers the
    # crashmatrix-* profiles first (nothing runs: collection only)
    run = run_pytest(fuzz_project, "--collect-only", "-q", "--hypothesis-profile=crashmatrix-nightly")
    assert run.returncode == 0 and "1 test collected" in run.stdout, run.output[-2000:]


def test_html_anchors_are_case_ids_unique_across_matrices_and_an_early_stop_is_said() -> None:
    from crashmatrix.harness.html_report import anchor_ids

    cid = "checkout/conv1/kill@tool.request.after[turn-4.tool-0]#1"
    flaky = {**_record(cid, "fail"), "outcome": "flaky", "outcomes": ["fail", "pass"],
             "replays": [{"outcome": "pass", "failed_check": None, "error": None, "verdicts": [], "seconds": 0.1,
                          "run_id": "cm-run-2"}]}
    m = {"workload": "checkout", "subject": "defect:x", "kinds": ["kill"], "sources": ["label"],
         "summary": {"cases": 1, "flaky": 1}, "cases": [flaky]}
    data = {"version": 1, "seed": 1, "complete": False, "reason": "interrupted (KeyboardInterrupt)",
            "matrices": [m, {**m, "test": "t2"}]}
    assert anchor_ids(data["matrices"]) == [[cid], [f"matrix-2/{cid}"]]
    page = render_html(data)
    assert page.count(f'id="{cid}"') == 1 and page.count(f'id="matrix-2/{cid}"') == 1
    assert page.count('class="cell flaky"') == 2 and "1 flaky" in page
    assert '<p class="incomplete">incomplete: interrupted (KeyboardInterrupt)</p>' in page
    assert 'tr class="point-row has-failure"' in page and 'id="failing-only"' in page


def test_a_run_stopped_before_any_case_ended_still_writes_its_reports(tmp_path: Path) -> None:
    """Ctrl-C under xdist before a worker reported a case: the controller has no record,
    and the reports say the run was interrupted instead of not being written."""
    from types import SimpleNamespace

    from crashmatrix.harness.plugin import _write_reports

    settings_ = SimpleNamespace(report=str(tmp_path / "r.json"), html=str(tmp_path / "r.html"), seed=3)
    _write_reports(SimpleNamespace(settings=settings_, records=[]), "interrupted (KeyboardInterrupt)")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["complete"] is False and data["matrices"] == [] and data["reason"].startswith("interrupted")
    assert "incomplete: interrupted" in (tmp_path / "r.html").read_text()
    other = tmp_path / "finished"
    other.mkdir()
    settings_ = SimpleNamespace(report=str(other / "r.json"), html=None, seed=3)
    _write_reports(SimpleNamespace(settings=settings_, records=[]), None)  # no crashmatrix item ran
    assert not (other / "r.json").exists()
