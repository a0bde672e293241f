"""Unit checks of the pieces the conformance tests cannot see directly."""

from __future__ import annotations

import asyncio
import random

import pytest

from crashmatrix.harness.faultproxy import TOXIC_TYPES, Toxic
from crashmatrix.harness.faultproxy._gojson import (GoJSONError, StructField, decode, decode_struct,
                                                    dumps, Float32, format_float32)
from crashmatrix.harness.faultproxy._proxy import _AddrError, lookup_port, split_host_port
from crashmatrix.harness.faultproxy._stream import Channel, Chunk, ToxicStub
from crashmatrix.harness.faultproxy._toxics import SlicerToxic, attributes_of


@pytest.mark.parametrize("value, text", [
    (1.0, "1"), (0.5, "0.5"), (0.25, "0.25"), (0.2, "0.2"), (-1.0, "-1"), (2.0, "2"),
    (0.1, "0.1"), (1e-7, "1e-7"), (1e21, "1e+21"), (123456.0, "123456"), (0.0, "0"),
])
def test_float32_shortest_form(value: float, text: str) -> None:
    assert format_float32(value) == text


@pytest.mark.parametrize("body, message", [
    (b"", "EOF"), (b"  \n", "EOF"), (b"{", "unexpected EOF"), (b'{"a":', "unexpected EOF"),
    (b'"abc', "unexpected EOF"), (b"x", "invalid character 'x' looking for beginning of value"),
    (b"{x", "invalid character 'x' looking for beginning of object key string"),
    (b'{"a" 1}', "invalid character '1' after object key"),
    (b'{"a":1 "b":2}', "invalid character '\"' after object key:value pair"),
    (b"[1 2]", "invalid character '2' after array element"),
    (b"tx", "invalid character 'x' in literal true (expecting 'r')"),
    (b"NaN", "invalid character 'N' looking for beginning of value"),
    (b'"a\\x"', "invalid character 'x' in string escape code"),
])
def test_syntax_errors_use_go_wording(body: bytes, message: str) -> None:
    with pytest.raises(GoJSONError) as info:
        decode(body)
    assert str(info.value) == message


def test_first_value_only_and_case_insensitive_fields() -> None:
    fields = (StructField("name", "string"), StructField("n", "int64"), StructField("on", "*bool"))
    value = decode(b'{"NAME": "a", "name": "b", "n": 5, "on": null, "x": [1]} garbage')
    out, err = decode_struct(value, fields, struct_name="S", go_type="pkg.S")
    assert err is None and out == {"name": "b", "n": 5, "on": None}
    out, err = decode_struct(decode(b'{"n": 1.5, "name": 3}'), fields, struct_name="S", go_type="pkg.S")
    assert err == "json: cannot unmarshal number 1.5 into Go struct field S.n of type int64"
    _, err = decode_struct(decode(b'{"n": 9223372036854775808}'), fields, struct_name="S", go_type="pkg.S")
    assert err == "json: cannot unmarshal number 9223372036854775808 into Go struct field S.n of type int64"
    _, err = decode_struct(decode(b"[1]"), fields, struct_name="S", go_type="pkg.S")
    assert err == "json: cannot unmarshal array into Go value of type pkg.S"


def test_encoding_escapes_like_go() -> None:
    assert dumps({"a": "<&>", "t": Float32(0.5), "n": None, "l": [1, True]}) == \
        '{"a":"\\u003c\\u0026\\u003e","t":0.5,"n":null,"l":[1,true]}'


@pytest.mark.parametrize("addr, message", [
    ("bogus", "address bogus: missing port in address"),
    ("a:b:c", "address a:b:c: too many colons in address"),
    ("[::1", "address [::1: missing ']' in address"),
    ("[::1]", "address [::1]: missing port in address"),
])
def test_go_address_errors(addr: str, message: str) -> None:
    with pytest.raises(_AddrError) as info:
        split_host_port(addr)
    assert str(info.value) == message


def test_ports() -> None:
    assert split_host_port("[::1]:80") == ("::1", "80")
    assert lookup_port("") == 0 and lookup_port("8474") == 8474
    with pytest.raises(_AddrError, match="address 99999: invalid port"):
        lookup_port("99999")
    with pytest.raises(_AddrError, match="lookup tcp/nope-x: unknown port"):
        lookup_port("nope-x")


def test_registry_fields_are_the_attributes() -> None:
    assert sorted(TOXIC_TYPES) == ["bandwidth", "latency", "limit_data", "noop", "reset_peer",
                                   "slicer", "slow_close", "timeout"]
    for name, cls in TOXIC_TYPES.items():
        toxic = cls()
        assert isinstance(toxic, Toxic) and toxic.type_name == name
        assert all(v == 0 for v in attributes_of(toxic).values())


def _pieces(avg: int, var: int, size: int, seed: int = 0) -> list[tuple[int, int]]:
    async def run() -> list[tuple[int, int]]:
        stub = ToxicStub(Channel(), Channel(), rng=random.Random(seed))
        return SlicerToxic(avg, var, 0)._bounds(stub, size)

    return asyncio.run(run())


def test_slicer_piece_counts_match_toxiproxy_tests() -> None:
    assert _pieces(1, 0, 24) == [(i, i + 1) for i in range(24)]
    pieces = _pieces(1024, 512, 480 * 1024)
    assert 240 <= len(pieces) <= 720
    assert pieces[0][0] == 0 and pieces[-1][1] == 480 * 1024
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert all(b - a <= 1024 + 512 for a, b in pieces)


def test_channel_close_and_flush() -> None:
    async def run() -> None:
        ch = Channel(1)
        await ch.put(Chunk(b"a", 0.0))
        ch.push(Chunk(b"b", 0.0))  # a flush may exceed capacity
        ch.close()
        got = [await ch.get(), await ch.get(), await ch.get(), await ch.get()]
        assert [c.data if c else None for c in got] == [b"a", b"b", None, None]

    asyncio.run(run())
