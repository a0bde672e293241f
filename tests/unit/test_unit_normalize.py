"""crashmatrix.harness.normalize.Normalizer: ids by order of first appearance, never masked."""

from __future__ import annotations

from crashmatrix.harness.normalize import Normalizer

CH_A = "ch_" + "a1" * 8
CH_B = "ch_" + "b2" * 8
CALL_A = "call_0123456789ab"
CALL_B = "call_fedcba987654"
KEY_A = "ab" * 32
KEY_B = "cd" * 32
RUN = "cm-run-00112233aabbccdd"


def test_first_appearance_numbering_per_prefix() -> None:
    n = Normalizer()
    assert n(CH_B) == "ch-1"  # first seen, whatever its value
    assert n(CALL_A) == "call-1"  # counters are per prefix
    assert n(CH_A) == "ch-2"
    assert n(CALL_B) == "call-2"
    assert n(KEY_A) == "key-1"
    assert n(RUN) == "run-1"
    assert n.counts == {"ch": 2, "call": 2, "key": 1, "run": 1}


def test_same_id_same_label_across_calls() -> None:
    n = Normalizer()
    assert n([CH_A, CH_B, CH_A]) == ["ch-1", "ch-2", "ch-1"]
    assert n({"id": CH_B}) == {"id": "ch-2"}  # remembered across calls


def test_two_distinct_charges_stay_distinct() -> None:
    """Masking would make a second charge look like the first: it must not."""
    n = Normalizer()
    once = Normalizer()([{"charge": CH_A}])
    twice = n([{"charge": CH_A}, {"charge": CH_B}])
    assert twice == [{"charge": "ch-1"}, {"charge": "ch-2"}]
    assert twice[0] != twice[1]
    assert once != twice


def test_two_runs_with_different_ids_normalise_equal() -> None:
    golden = {"messages": [{"tool_call_id": CALL_A, "content": {"id": CH_A, "key": KEY_A}}]}
    case = {"messages": [{"tool_call_id": CALL_B, "content": {"id": CH_B, "key": KEY_B}}]}
    assert Normalizer()(golden) == Normalizer()(case)


def test_nested_structures_and_keys() -> None:
    n = Normalizer()
    value = {
        CH_A: [1, {"inner": (CALL_A, None, True, 3)}],
        "list": [[[CH_A]]],
        7: "plain",
    }
    assert n(value) == {
        "ch-1": [1, {"inner": ["call-1", None, True, 3]}],
        "list": [[["ch-1"]]],
        7: "plain",
    }


def test_ids_inside_longer_strings() -> None:
    n = Normalizer()
    text = f"charged {CH_A} (key {KEY_A}) for run {RUN}; refunded {CH_A}, then {CH_B}."
    assert n(text) == "charged ch-1 (key key-1) for run run-1; refunded ch-1, then ch-2."


def test_lookalikes_untouched() -> None:
    n = Normalizer()
    for s in ["ch_12", "xch_aabbccdd", "ch_AABBCCDD", "a" * 63, "turn-3.tool-1", "cm-run-xyz"]:
        assert n(s) == s
    assert n.seen == {}


def test_non_strings_pass_through() -> None:
    n = Normalizer()
    for v in (1, 2.5, None, True):
        assert n(v) == v
