"""Junk input never yields a 5xx (other than the documented bind/resolve 500s) or a crash."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crashmatrix.harness.faultproxy import TOXIC_TYPES

from ._support import Api, EchoServer, connect, embedded_only

KEYS = ["name", "upstream", "listen", "enabled", "type", "stream", "toxicity", "attributes",
        "latency", "jitter", "rate", "delay", "timeout", "average_size", "size_variation",
        "bytes", "toxics", "Name", "LISTEN"]
VALUES = st.sampled_from(["127.0.0.1:0", "localhost:0", "bogus", "", "upstream", "downstream",
                          "latency", "bandwidth", "slicer", "limit_data", "timeout", "reset_peer",
                          "slow_close", "noop", "UPSTREAM", "127.0.0.1:1", "[::1]:0", ":0"])
INTS = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 2**63]))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12), VALUES)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)),
                                            inner, max_size=6)),
    max_leaves=20,
)
BODIES = st.one_of(JSON.map(lambda v: json.dumps(v).encode()), st.binary(max_size=64),
                   JSON.map(lambda v: (json.dumps(v) + "}{ trailing").encode()))
ENDPOINTS = st.sampled_from([
    ("POST", "/proxies"), ("POST", "/proxies/fz"), ("PATCH", "/proxies/fz"),
    ("POST", "/proxies/fz/toxics"), ("POST", "/proxies/fz/toxics/t"),
    ("PATCH", "/proxies/fz/toxics/t"), ("POST", "/populate"), ("POST", "/reset"),
    ("GET", "/proxies"), ("GET", "/proxies/fz/toxics"), ("DELETE", "/proxies/fz/toxics/nope"),
    ("GET", "/version"), ("PUT", "/proxies/fz"), ("GET", "/proxies/%zz"), ("GET", "//proxies"),
])
#: FAULTPROXY_FUZZ_EXAMPLES=N runs N random (not derandomised) examples per test.
_DEEP = int(os.environ.get("FAULTPROXY_FUZZ_EXAMPLES", "0"))


def _settings(examples: int) -> settings:
    return settings(max_examples=_DEEP or examples, deadline=None, derandomize=not _DEEP, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


#: 500s the spec mandates: bind and address-resolution failures carry Go's net error text.
EXPECTED_500 = ("listen tcp", "address ", "lookup ")


def _ok_status(r: Any) -> bool:
    if r.status_code < 500:
        return True
    if r.status_code != 500:
        return False
    try:
        message = json.loads(r.content)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return message.startswith(EXPECTED_500)


@pytest.fixture
def fuzz_api(api: Api, echo: EchoServer) -> Iterator[Api]:
    api.create(echo.addr, name="fz")
    api.toxic("fz", "latency", name="t", latency=1)
    api.existing = set(api.get("/proxies").json())  # type: ignore[attr-defined]
    yield api
    _restore(api, echo)


def _restore(api: Api, echo: EchoServer) -> None:
    for name in api.get("/proxies").json():
        if name not in api.existing:  # type: ignore[attr-defined]
            api.delete("/proxies/" + quote(name, safe=""))
    fz = api.get("/proxies/fz")
    if fz.status_code == 404:
        api.post("/proxies", {"name": "fz", "upstream": echo.addr, "listen": "127.0.0.1:0"})
    else:
        api.post("/proxies/fz", {"upstream": echo.addr, "listen": "127.0.0.1:0", "enabled": True})
    if api.get("/proxies/fz/toxics/t").status_code == 404:
        api.post("/proxies/fz/toxics", {"type": "latency", "name": "t", "attributes": {"latency": 1}})


@_settings(120)
@given(endpoint=ENDPOINTS, body=BODIES)
def test_random_bodies_never_5xx(fuzz_api: Api, echo: EchoServer, endpoint: tuple[str, str],
                                 body: bytes) -> None:
    method, path = endpoint
    r = fuzz_api.request(method, path, raw=body)
    assert _ok_status(r), (method, path, body, r.status_code, r.text)
    assert fuzz_api.get("/version").status_code == 200
    _restore(fuzz_api, echo)


ATTRS = st.dictionaries(st.sampled_from(["latency", "jitter", "rate", "delay", "timeout",
                                         "average_size", "size_variation", "bytes"]),
                        st.one_of(st.integers(-(2**63), 2**63 - 1),
                                  st.integers(-5, 200), st.sampled_from([0, 1, 2**62])),
                        max_size=4)


@embedded_only
@_settings(40)
@given(type_name=st.sampled_from(sorted(TOXIC_TYPES)), stream=st.sampled_from(["upstream", "downstream"]),
       attributes=ATTRS, toxicity=st.sampled_from([0, 0.5, 1, 2, -1]))
def test_random_toxics_under_traffic_never_crash(fuzz_api: Api, echo: EchoServer, type_name: str,
                                                 stream: str, attributes: dict[str, int],
                                                 toxicity: float) -> None:
    """Every accepted toxic runs on live traffic; removal stays prompt; the server lives."""
    listen = fuzz_api.get("/proxies/fz").json()["listen"]
    conn = connect(listen)
    stop = threading.Event()

    def pump() -> None:
        conn.settimeout(0.05)
        while not stop.is_set():
            try:
                conn.send(b"0123456789" * 50)
                conn.recv(65536)
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                return

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        r = fuzz_api.post("/proxies/fz/toxics", {"type": type_name, "stream": stream, "name": "fuzzed",
                                                 "toxicity": toxicity, "attributes": attributes})
        assert r.status_code in (200, 400), r.text
        time.sleep(0.02)
        if r.status_code == 200:
            r = fuzz_api.post("/proxies/fz/toxics/fuzzed", {"attributes": attributes})
            assert r.status_code in (200, 400), r.text
            start = time.monotonic()
            assert fuzz_api.delete("/proxies/fz/toxics/fuzzed").status_code == 204
            assert time.monotonic() - start < 1.0
        assert fuzz_api.get("/version").status_code == 200
    finally:
        stop.set()
        t.join(1)
        conn.close()
