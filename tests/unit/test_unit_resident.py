"""Which jobs run in a long-lived worker, and the zygote's check of its requests (pure
logic; the processes themselves: tests/integration/test_resident.py)."""

from __future__ import annotations

import dataclasses

import pytest

from crashmatrix.harness import registry, resident, zygote
from crashmatrix.harness.adapter import Environment
from crashmatrix.harness.plan import CrashPoint, Fault, FaultPlan
from crashmatrix.harness.worker import Job

AT = CrashPoint("label", "model.call.before", "turn-1")


def job(**kw: object) -> Job:
    base = Job("resume", "reference", "checkout", "conv1", "cm-run-1", "cmw-1",
               Environment("postgresql://x", {}, "/tmp"), FaultPlan(), "/tmp/cmw-1.jsonl")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "expected"), [
    ({}, True),  # a fault-free resume
    ({"role": "start", "plan": FaultPlan((Fault("cancel", AT),))}, True),  # the process outlives a cancel
    ({"plan": FaultPlan((Fault("cancel-edge", AT),))}, True),
    ({"role": "recover", "run_id": ""}, True),
    ({"role": "start", "plan": FaultPlan((Fault("kill", AT),))}, False),  # dies with its fault
    ({"plan": FaultPlan((Fault("term", AT),))}, False),  # a SIGTERM to the process
    ({"plan": FaultPlan((Fault("pause", AT),))}, True),  # stopped, woken with its links as they were
    ({"role": "start", "plan": FaultPlan((Fault("cancel-api", AT),))}, True),
    ({"role": "start", "plan": FaultPlan((Fault("db-restart", AT),))}, False),  # its server restarted under it
    ({"role": "start", "plan": FaultPlan((Fault("freeze", AT),))}, False),
    ({"plan": FaultPlan((Fault("cancel", AT), Fault("kill", AT)))}, False),
    ({"role": "start", "record_io": True}, False),  # a golden run: its I/O is the process's
    ({"start_gate": "/tmp/gate", "gate_parties": 2}, True),  # a concurrent round: its gate is files
    ({"await_points": True}, False),  # a task factory on the loop
    ({"role": "observe"}, False),  # a build's service role
])
def test_eligible_jobs(kw: dict[str, object], expected: bool) -> None:
    assert resident.eligible(job(**kw)) is expected


def test_a_subject_whose_adapter_does_not_declare_it_always_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = registry.subject("reference")
    assert reference.long_lived_workers is True

    class Undeclared:  # an adapter written before the attribute, or one that keeps state
        pass

    monkeypatch.setattr(registry, "subject", lambda name: Undeclared() if name == "theirs" else reference)
    assert resident.eligible(job(subject="reference"))
    assert not resident.eligible(job(subject="theirs"))


@pytest.mark.parametrize(("request_", "error"), [
    ({"token": 1, "log_path": "l", "job": {}}, None),
    ({"op": "resident", "token": 1, "log_path": "l", "socket": "\0s"}, None),
    ({"op": "resident", "token": 1, "log_path": "l"}, KeyError),
    ({"op": "fork", "token": 1, "log_path": "l"}, KeyError),
    ({"op": "exec", "token": 1, "log_path": "l", "job": {}}, ValueError),
])
def test_the_zygote_refuses_a_request_it_cannot_serve(request_: dict[str, object], error: type[Exception] | None) -> None:
    if error is None:
        zygote._check(request_)
        assert request_["op"] in ("fork", "resident")
    else:
        with pytest.raises(error):
            zygote._check(request_)
