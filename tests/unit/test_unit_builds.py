"""Build pairs as data: build specs, the pair subject, case ids naming both builds,
replay lines, observations across a process boundary, and ``upgrade.migrated``."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from crashmatrix.harness import builds
from crashmatrix.harness.adapter import EffectEntry, InvocationEntry, LogEntry, Observation
from crashmatrix.harness.errors import InvalidArgument, PlanError
from crashmatrix.harness.case import replay_command
from crashmatrix.harness.oracle import Evidence
from crashmatrix.harness.plan import Case, CrashPoint, Fault, FaultPlan


def _venv(root: Path) -> Path:
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return root


def test_build_specs_name_their_environment(tmp_path: Path) -> None:
    plain = builds.parse_build("reference")
    assert (plain.label, plain.subject, plain.python, plain.path) == ("reference", "reference", None, ())
    assert builds.parse_build("pkg.mod:MyAdapter").label == "MyAdapter"
    venv = builds.parse_build(f"pkg.mod:MyAdapter@{_venv(tmp_path / 'main' / '.venv')}")
    assert venv.python == str((tmp_path / "main" / ".venv" / "bin" / "python").resolve())
    assert venv.label == "main" and venv.path == ()  # a venv named .venv takes its checkout's name
    tree = builds.parse_build(f"base=pkg.mod:MyAdapter@{tmp_path}")
    assert tree.path == (str(tmp_path.resolve()),) and tree.python is None and tree.label == "base"
    assert tree.subject == "pkg.mod:MyAdapter"


@pytest.mark.parametrize("spec, words", [
    ("@/x", "no subject"),
    ("reference@/does/not/exist", "does not exist"),
    ("bad label=reference", "not a subject name"),
])
def test_bad_build_specs_say_what_is_wrong(spec: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        builds.parse_build(spec)


def test_a_pair_needs_two_labels(tmp_path: Path) -> None:
    same = builds.parse_subject("reference>>reference")
    assert same is not None and same.label == "reference-a>reference-b"  # one environment: told apart
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "a").mkdir(parents=True)
    with pytest.raises(InvalidArgument, match="both labelled 'a'"):
        builds.parse_subject(f"x:Y@{tmp_path / 'a'}>>x:Y@{tmp_path / 'b' / 'a'}")
    assert builds.parse_subject("reference") is None


def test_case_ids_name_both_builds_and_replay_with_both() -> None:
    upgrade = builds.parse_subject("reference>>reference-next")
    assert upgrade is not None and upgrade.label == "reference>reference-next"
    plain = Case("checkout", "conv1", FaultPlan((Fault("kill", CrashPoint("label", "log.append.after", "turn-4", 1)),)))
    [case] = builds.label_cases([plain], upgrade)
    assert case.id == "checkout/conv1/kill@log.append.after[turn-4]#1/upgrade:reference>reference-next"
    assert Case.parse(case.id) == case
    assert replay_command(case, upgrade.subject) == (
        "crashmatrix replay 'checkout/conv1/kill@log.append.after[turn-4]#1/upgrade:reference>reference-next' "
        "--subject reference --resume-with reference-next")
    builds.check_case_label(case, upgrade)
    with pytest.raises(PlanError, match="--resume-with"):
        builds.check_case_label(case, None)
    with pytest.raises(PlanError, match="names no builds"):
        builds.check_case_label(plain, upgrade)
    with pytest.raises(PlanError, match="must look like upgrade:A>B"):
        Case.parse("checkout/conv1/kill@x[t]#1/upgrade:onlyone")
    assert upgrade.for_role("start").label == "reference" and upgrade.for_role("resume").label == "reference-next"


def test_observations_cross_the_process_boundary_as_json() -> None:
    import json

    obs = Observation("r", "cannot_migrate", log=[LogEntry(1, "turn-1", ("root",), "model", 2)],
                      effects=[EffectEntry("k", "turn-1.tool-0", "charge", "started", None, 2)],
                      state={"transcript": [{"role": "user", "content": "x"}], "budget": {"tokens": 3}},
                      lease_epoch=2, invocations=[InvocationEntry(1, "w", "00-a-b-01", None)], detail="cannot migrate: x")
    back = builds.observation_from_dict(json.loads(json.dumps(builds.observation_to_dict(obs))))
    assert back == obs


def _ev(status: str, detail: str | None = None) -> Evidence:
    return Evidence(Observation("r", status, detail=detail), {}, {})


def _result(*roles: str, resume_error: str | None = None) -> SimpleNamespace:
    from crashmatrix.harness.oracle import Verdict

    verdicts = [Verdict("resume.runs", "end", False, resume_error)] if resume_error else []
    return SimpleNamespace(workers=[{"role": r} for r in roles], verdicts=verdicts)


def test_upgrade_migrated_tells_finished_parked_and_stranded_apart() -> None:
    upgrade = builds.parse_subject("reference>>reference-next")
    assert upgrade is not None
    golden = _ev("completed")

    def check(final: Evidence, result: SimpleNamespace, declared: tuple[str, ...] = ("cannot_migrate",)) -> tuple:
        v = builds.check_migrated(golden, final, result, upgrade, declared)  # type: ignore[arg-type]
        return v.valid, v.details

    assert check(_ev("completed"), _result("start"))[1].startswith("not applicable")
    assert check(_ev("completed"), _result("start", "resume")) == (
        True, "crashed under reference, finished under reference-next: completed")
    ok, details = check(_ev("cannot_migrate", "cannot migrate: no upgrader from version 1 to 2"), _result("start", "resume"))
    assert ok and "no upgrader from version 1" in details
    assert check(_ev("cannot_migrate"), _result("start", "resume"))[0] is False  # parked without a reason
    ok, details = check(_ev("running"), _result("start", "resume", resume_error="resume 1 failed: KeyError: 'arguments_json'"))
    assert ok is False and "'running'" in details and "KeyError" in details
    ok, details = check(_ev("failed", "KeyError: 'send_receipt'"), _result("start", "resume"), declared=())
    assert ok is False and "declares none" in details and "send_receipt" in details


def test_check_subject_imports_only_the_controllers_own_builds(tmp_path: Path) -> None:
    from crashmatrix.harness.errors import RegistryError

    builds.check_subject("reference>>reference-next")
    builds.check_subject(f"nosuch.module:Adapter@{tmp_path}>>reference")  # its zygote imports it
    with pytest.raises(RegistryError):
        builds.check_subject("reference>>nosuch-subject")
    assert os.path.isdir(tmp_path)


def test_a_build_pair_has_a_cancel_api_only_when_both_builds_have_one(tmp_path) -> None:
    """``BuildAdapter.capabilities``: the resuming build's words, a cancel API (resumable
    or final, as B says) only when the crashing build has one too, never restore; a build
    whose describe answered only ``cancel_api`` (an older crashmatrix) counts as the
    default adapter with that API."""
    from crashmatrix.harness.builds import Build, BuildAdapter, Upgrade

    def pair(a: dict, b: dict) -> frozenset[str]:
        upgrade = Upgrade(Build("A", "reference"), Build("B", "reference-next"), {"A": a, "B": b})
        return BuildAdapter(SimpleNamespace(upgrade=upgrade), "checkout", tmp_path).capabilities()

    full = {"capabilities": ["cancel", "cancel-api", "leases", "restore"]}
    assert pair(full, full) == {"cancel", "cancel-api", "leases"}
    assert pair({"capabilities": ["cancel"]}, full) == {"cancel", "leases"}
    assert pair(full, {"capabilities": ["cancel", "cancel-final"]}) == {"cancel", "cancel-final"}
    assert pair({"cancel_api": True}, {"cancel_api": True, "cancel_is_final": True}) == {"cancel", "cancel-final"}
    assert pair({}, {}) == {"cancel"}
