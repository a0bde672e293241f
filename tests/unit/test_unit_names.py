"""crashmatrix.harness.names: a matrix's names resolved and checked once, each bad one
a one-line error naming its field."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from crashmatrix.harness import faults, plan, registry
from crashmatrix.harness.errors import InvalidArgument, RegistryError
from crashmatrix.harness.matrix import run_matrix
from crashmatrix.harness.names import Names, choices, resolve


def test_resolve_gives_every_name_checked_and_frozen() -> None:
    names = resolve("checkout", kinds="kill, pause", sources=("label",), conversations=["conv2"])
    assert (names.workload, names.subject, names.kinds, names.sources, names.conversations) == (
        "checkout", "reference", ("kill", "pause"), ("label",), ("conv2",))
    assert names.workload_object is registry.workload("checkout") and names.upgrade is None
    assert resolve("checkout") == Names("checkout", "reference", plan.DEFAULT_KINDS, plan.DEFAULT_SOURCES, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        names.kinds = ("term",)  # type: ignore[misc]


def test_a_build_pair_is_parsed_once() -> None:
    names = resolve("checkout", "reference", resume_with="reference-next")
    assert names.subject == "reference>>reference-next"
    assert (names.upgrade.crash.subject, names.upgrade.resume.subject) == ("reference", "reference-next")


@pytest.mark.parametrize("call, error, line", [
    (lambda: resolve("chekout"), RegistryError, "workload='chekout' is not registered (did you mean 'checkout'?); known: "),
    (lambda: resolve("checkout", "nosuch"), RegistryError, "subject='nosuch' is not registered; known: "),
    (lambda: resolve("checkout", kinds="kill,boom"), InvalidArgument, "kinds='kill,boom': each item must be one of kill, term"),
    (lambda: resolve("checkout", kinds=" , "), InvalidArgument, "kinds=' , ': each item must be one of"),
    (lambda: resolve("checkout", sources=("label", "line")), InvalidArgument, "sources=('label', 'line'): each item must be one of step, label, await"),
    (lambda: resolve("checkout", conversations=("conv9",)), InvalidArgument, "conversation='conv9' is not one of conv1, conv2"),
])
def test_each_bad_name_is_one_line_naming_its_field(call, error, line) -> None:
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_choices_keeps_order_and_an_empty_sequence() -> None:
    assert choices("term,kill", faults.names(), "kinds") == ("term", "kill")
    assert choices((), faults.names(), "kinds") == ()  # a matrix of sampled kinds only


def test_run_matrix_takes_names_resolved_or_one_by_one_not_both() -> None:
    with pytest.raises(InvalidArgument, match="either resolved .Names. or one by one"):
        asyncio.run(run_matrix(resolve("checkout"), kinds=("kill",)))
    with pytest.raises(InvalidArgument, match="kinds='boom'"):  # checked before any service starts
        asyncio.run(run_matrix("checkout", kinds="boom"))  # type: ignore[arg-type]


def test_a_workload_without_its_required_members_is_one_line_naming_them() -> None:
    """A workload object the harness would trip over later (an AttributeError deep in a
    matrix) is refused before anything starts, naming what it lacks."""
    from types import SimpleNamespace

    from crashmatrix.harness.names import check_workload

    good = SimpleNamespace(name="w", conversations=("conv1",), providers=("payment",), run_input=lambda c: {})
    check_workload("m:W", good)
    bad = SimpleNamespace(name="w", conversations=(), providers="payment")
    with pytest.raises(InvalidArgument) as info:
        check_workload("m:W", bad)
    message = str(info.value)
    assert message.startswith("workload 'm:W' (SimpleNamespace) lacks conversations (a tuple of str, not empty), "
                              "providers (a tuple of str), run_input(conversation) (a method)"), message
    assert "\n" not in message and "The workload object" in message
