"""The reference runtime's codec walls between builds, and the later builds' formats:
a version without an upgrader is refused before anything is read; format 2 reads
format 1 through its upgrader; a no-op standing in for an upgrader misreads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.records_pb2 import Payload
from crashmatrix.reference_runtime.state_codec import StateSchema, UnreadableState
from crashmatrix.scenarios.upgrades import wire

MESSAGE = {"messages": [{"role": "assistant", "content": "x",
                         "tool_calls": [{"id": "call-1", "name": "charge", "arguments": {"amount": 12900}}]},
                        {"role": "tool", "tool_call_id": "call-1", "name": "charge", "content": {"ok": True}}]}


@pytest.fixture
def codec_restored() -> Iterator[None]:
    """A later build's codec installed for one test, the module as it was afterwards."""
    swapped = ("encode", "decode", "encode_read", "encode_trusted")  # what wire.install replaces
    added = ("_plain_encode", "_plain_decode", "_plain_encode_read", "_plain_encode_trusted", "_wire_version")
    saved = (codec.FORMAT_VERSION, dict(codec.UPGRADERS), {name: getattr(codec, name) for name in swapped})
    extra = [name for name in added if hasattr(codec, name)]
    yield
    codec.FORMAT_VERSION, upgraders, functions = saved
    for name, function in functions.items():
        setattr(codec, name, function)
    codec.UPGRADERS.clear()
    codec.UPGRADERS.update(upgraders)
    for name in added:
        if name not in extra and hasattr(codec, name):
            delattr(codec, name)


def test_a_newer_or_unupgradable_payload_is_unreadable_never_half_read() -> None:
    newer = Payload(codec="json", format_version=codec.FORMAT_VERSION + 1, inline=b"{}")
    with pytest.raises(codec.UnreadablePayload, match="newer than this build"):
        codec.decode(newer)
    with pytest.raises(codec.UnreadablePayload, match="unknown"):
        codec.decode(Payload(codec="pickle", format_version=1, inline=b"x"))
    with pytest.raises(codec.CodecError) as err:
        codec.encode({"amount": 1.5})
    assert not isinstance(err.value, codec.UnreadablePayload)  # writing is not migrating


def test_next_format_reads_the_current_one_and_round_trips(codec_restored: None) -> None:
    v1 = codec.encode(MESSAGE)
    assert v1.format_version == 1
    wire.install(2, {1: wire.UPGRADE_1_TO_2})
    v2 = codec.encode(MESSAGE)
    assert v2.format_version == 2 and b"arguments_json" in v2.inline and b'"arguments"' not in v2.inline
    assert codec.decode(v1) == MESSAGE == codec.decode(v2)


def test_a_missing_upgrader_is_refused_and_a_no_op_one_misreads(codec_restored: None) -> None:
    v1 = codec.encode(MESSAGE)
    wire.install(3, {2: wire.UPGRADE_2_TO_3})
    with pytest.raises(codec.UnreadablePayload, match="no upgrader from version 1 to 2"):
        codec.decode(v1)
    wire.install(4, {})  # reinstall as another build: the mutant's chain, a no-op for 1
    wire.install(3, {1: lambda value: value, 2: wire.UPGRADE_2_TO_3})
    with pytest.raises(KeyError, match="arguments_json"):
        codec.decode(v1)


def test_a_state_field_another_build_dropped_is_unreadable() -> None:
    old = StateSchema("shop", version=1)
    old.field("cart")
    old.field("shipping")
    payload = old.encode({"cart": {"sku": "dock-1"}, "shipping": "Ada"})
    assert payload is not None
    dropped = StateSchema("shop", version=1)
    dropped.field("cart")
    with pytest.raises(UnreadableState, match="'shipping'"):
        dropped.decode(payload)
    bumped = StateSchema("shop", version=2)
    bumped.field("cart")
    with pytest.raises(UnreadableState, match="no upgrader from version 1 to 2"):
        bumped.decode(payload)
    assert isinstance(UnreadableState("x"), codec.UnreadablePayload)
