"""The golden-run sanity check (golden.golden_effects): the summary's lines, and the
one-line refusal when the golden runs exercised nothing a case could fail on."""

from __future__ import annotations

from typing import Any

from crashmatrix.harness.adapter import Observation
from crashmatrix.harness.golden import GoldenRun, golden_effects
from crashmatrix.harness.oracle import Evidence


class Shop:
    providers = ("payment", "mail", "model")


class NoEffects(Shop):
    makes_no_effects = True


class Chatty(Shop):
    makes_no_effects = ("conv2",)


def golden(conv: str, applied: dict[str, int], refusals: list[dict[str, Any]] | None = None) -> GoldenRun:
    ev = Evidence(Observation("r", "completed"), {}, {"turn-1": 1}, [])
    return GoldenRun(conv, f"run-{conv}", [], ev, 0.1, applied=applied, refusals=refusals or [])


BAD_CURRENCY = {"provider": "payment", "method": "POST", "path": "/charges", "http_status": 400,
                "error": "currency: must be a lowercase ISO 4217 code, got 'EUR'"}


def test_the_summary_counts_each_providers_effects() -> None:
    lines, why = golden_effects("shop", Shop(), [golden("conv1", {"payment": 1, "mail": 1}),
                                                 golden("conv2", {"payment": 2, "mail": 0})])
    assert why is None
    assert lines == ["golden runs applied effects: payment 3 (conv1 1, conv2 2); mail 1 (conv1 1, conv2 0)"]


def test_a_run_that_applied_nothing_is_refused_naming_the_provider_and_its_message() -> None:
    lines, why = golden_effects("shop", Shop(), [golden("conv1", {"payment": 0, "mail": 0}, [BAD_CURRENCY])])
    assert why is not None and "\n" not in why
    assert why.startswith("the golden run of shop/conv1 applied no effect at payment, mail: payment answered 400 "
                          "to POST /charges: currency: must be a lowercase ISO 4217 code, got 'EUR'")
    assert any(line.startswith("golden runs' calls refused: conv1: payment answered 400") for line in lines)
    assert "declared provider(s) no golden run reached: mail" in lines


def test_a_run_no_request_reached_says_so() -> None:
    _, why = golden_effects("shop", Shop(), [golden("conv1", {"payment": 0, "mail": 0})])
    assert why is not None and "no request reached payment, mail" in why


def test_a_provider_5xx_is_refused_even_with_effects() -> None:
    boom = dict(BAD_CURRENCY, provider="model", path="/v1/complete", http_status=500, error="script_error: boom")
    _, why = golden_effects("shop", Shop(), [golden("conv1", {"payment": 1, "mail": 1}, [boom])])
    assert why is not None and "model answered 500 to POST /v1/complete: script_error: boom" in why


def test_a_workload_that_declares_no_effects_passes_without_any() -> None:
    lines, why = golden_effects("quiet", NoEffects(), [golden("conv1", {"payment": 0, "mail": 0})])
    assert why is None and not any("no golden run reached" in line for line in lines)


def test_a_workload_that_declares_no_effects_but_makes_some_is_refused() -> None:
    _, why = golden_effects("quiet", NoEffects(), [golden("conv1", {"payment": 2, "mail": 0})])
    assert why is not None and "applied 2 effect(s) (payment 2), yet the workload declares it makes none" in why


def test_a_conversation_may_be_declared_effect_free() -> None:
    ok = [golden("conv1", {"payment": 1, "mail": 1}), golden("conv2", {"payment": 0, "mail": 0})]
    assert golden_effects("chatty", Chatty(), ok)[1] is None
    assert golden_effects("chatty", Shop(), ok)[1] is not None
