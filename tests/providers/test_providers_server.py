"""Provider servers over real sockets, in real processes (started by the launcher).

One set of servers serves the whole module; every test uses its own run id and keys,
so tests never see each other's rows (that is what ``GET /ledger?run_id=`` is for).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crashmatrix.harness.services.providers import clients
from crashmatrix.harness.services.providers.clients import ProbeResult
from crashmatrix.harness.services.providers.launcher import Providers, start_providers

T = TypeVar("T")
ECHO = "crashmatrix.scenarios.providers.demo_script:echo"
DECLINED_CARD = "4000000000000002"
GOOD_CARD = "4242424242424242"


@pytest.fixture(scope="module")
def providers(tmp_path_factory: pytest.TempPathFactory) -> Providers:
    with start_providers(tmp_path_factory.mktemp("providers")) as p:
        yield p


def run(fn: Callable[[aiohttp.ClientSession], Awaitable[T]]) -> T:
    async def main() -> T:
        async with aiohttp.ClientSession() as session:
            return await fn(session)

    return asyncio.run(main())


def new_run() -> str:
    return "run-" + uuid.uuid4().hex[:8]


def new_key() -> str:
    return hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def sha16(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


# -- payment: dedup ---------------------------------------------------------------------


def test_charge_sequential_same_key_applies_once(providers: Providers) -> None:
    url, run_id, key = providers.urls["payment"], new_run(), new_key()

    async def go(s: aiohttp.ClientSession) -> Any:
        first = await clients.charge(s, url, key=key, amount=1999, currency="eur", card=GOOD_CARD, run_id=run_id)
        again = await clients.charge(s, url, key=key, amount=1999, currency="eur", card=GOOD_CARD, run_id=run_id)
        return first, again, await clients.read_ledger(s, url, run_id)

    first, again, rows = run(go)
    assert first == again == {
        "charge_id": "ch_" + sha16(key),
        "status": "succeeded",
        "amount": 1999,
        "currency": "eur",
        "card": GOOD_CARD,
    }
    assert len(rows) == 1
    row = rows[0]
    assert (row["op"], row["key"], row["run_id"], row["status"], row["attempts"]) == (
        "charge", key, run_id, "succeeded", 2,
    )
    assert row["request"] == {"amount": 1999, "currency": "eur", "card": GOOD_CARD}
    assert row["result"] == first and row["http_status"] == 200
    assert row["ref"] == first["charge_id"]


@pytest.mark.parametrize("delays", [[150] * 8, [0, 150, 30, 100, 0, 60, 120, 10]])
def test_charge_concurrent_same_key_applies_once(providers: Providers, delays: list[int]) -> None:
    url, run_id, key = providers.urls["payment"], new_run(), new_key()

    async def go(s: aiohttp.ClientSession) -> Any:
        answers = await asyncio.gather(*(
            clients.charge(s, url, key=key, amount=500, currency="eur", card=GOOD_CARD, run_id=run_id, delay_ms=d)
            for d in delays
        ))
        return answers, await clients.read_ledger(s, url, run_id)

    answers, rows = run(go)
    assert all(a == answers[0] for a in answers)
    assert answers[0]["status"] == "succeeded"
    assert len(rows) == 1 and rows[0]["attempts"] == len(delays)


def test_decline_is_an_answer_recorded_and_deduplicated(providers: Providers) -> None:
    url, run_id, key = providers.urls["payment"], new_run(), new_key()

    async def go(s: aiohttp.ClientSession) -> Any:
        async with s.post(url + "/charges", json={
            "idempotency_key": key, "amount": 12900, "currency": "eur", "card": DECLINED_CARD,
            "metadata": {"run_id": run_id},
        }) as resp:
            raw = (resp.status, await resp.json())
        again = await clients.charge(s, url, key=key, amount=12900, currency="eur", card=DECLINED_CARD, run_id=run_id)
        probe = await clients.get_charge_status(s, url, key)
        return raw, again, probe, await clients.read_ledger(s, url, run_id)

    (status, body), again, probe, rows = run(go)
    assert status == 402
    assert body["error"] == "card_declined" and body["status"] == "declined"
    assert body["charge_id"] == "ch_" + sha16(key)
    assert again == body  # the client returns a decline, it does not raise
    assert probe == ProbeResult("applied", body)
    assert [(r["status"], r["http_status"], r["attempts"]) for r in rows] == [("declined", 402, 2)]


def test_key_reused_with_other_fields_is_refused(providers: Providers) -> None:
    url, run_id, key = providers.urls["payment"], new_run(), new_key()

    async def go(s: aiohttp.ClientSession) -> Any:
        await clients.charge(s, url, key=key, amount=100, currency="eur", card=GOOD_CARD, run_id=run_id)
        with pytest.raises(clients.DefiniteProviderError) as info:
            await clients.charge(s, url, key=key, amount=200, currency="eur", card=GOOD_CARD, run_id=run_id)
        with pytest.raises(clients.DefiniteProviderError) as other_run:
            await clients.charge(s, url, key=key, amount=100, currency="eur", card=GOOD_CARD, run_id=new_run())
        return info.value, other_run.value, await clients.read_ledger(s, url, run_id)

    err, err2, rows = run(go)
    assert err.status == err2.status == 409 and not err.retryable
    assert "idempotency_key" in err.body["error"]
    assert len(rows) == 1 and rows[0]["request"]["amount"] == 100


# -- payment: refunds and probes --------------------------------------------------------


def test_refund_dedup_and_refusals(providers: Providers) -> None:
    url, run_id = providers.urls["payment"], new_run()
    ck, rk, rk2, rk3 = new_key(), new_key(), new_key(), new_key()

    async def go(s: aiohttp.ClientSession) -> Any:
        ch = await clients.charge(s, url, key=ck, amount=1000, currency="eur", card=GOOD_CARD, run_id=run_id)
        r1 = await clients.refund(s, url, key=rk, charge_id=ch["charge_id"], amount=600, run_id=run_id)
        r1b = await clients.refund(s, url, key=rk, charge_id=ch["charge_id"], amount=600, run_id=run_id)
        errors = []
        for charge_id, amount in [("ch_0000000000000000", 1), (ch["charge_id"], 401)]:
            with pytest.raises(clients.DefiniteProviderError) as info:
                await clients.refund(s, url, key=rk2, charge_id=charge_id, amount=amount, run_id=run_id)
            errors.append(info.value)
        declined = await clients.charge(
            s, url, key=new_key(), amount=5, currency="eur", card=DECLINED_CARD, run_id=run_id
        )
        with pytest.raises(clients.DefiniteProviderError) as info:
            await clients.refund(s, url, key=rk3, charge_id=declined["charge_id"], amount=5, run_id=run_id)
        errors.append(info.value)
        probes = [await clients.get_refund_status(s, url, k) for k in (rk, rk2)]
        return ch, r1, r1b, errors, probes, await clients.read_ledger(s, url, run_id)

    ch, r1, r1b, errors, probes, rows = run(go)
    assert r1 == r1b == {
        "refund_id": "re_" + sha16(rk), "status": "succeeded", "charge_id": ch["charge_id"],
        "amount": 600, "currency": "eur",
    }
    assert [e.status for e in errors] == [404, 400, 400]
    assert errors[0].body["error"] == "no_such_charge"
    assert errors[1].body["field"] == "amount" and errors[2].body["field"] == "charge_id"
    assert probes == [ProbeResult("applied", r1), ProbeResult("not_applied")]
    assert [(r["op"], r["status"], r["attempts"]) for r in rows] == [
        ("charge", "succeeded", 1), ("refund", "succeeded", 2), ("charge", "declined", 1),
    ]


@pytest.mark.parametrize("key", ["a/b", "100% sure?", "spaces and #hash", "ключ-ü", "x" * 255])
def test_probe_applied_not_applied_with_awkward_keys(providers: Providers, key: str) -> None:
    url, run_id = providers.urls["payment"], new_run()
    key = key[:-8] + uuid.uuid4().hex[:8]

    async def go(s: aiohttp.ClientSession) -> Any:
        before = await clients.get_charge_status(s, url, key)
        body = await clients.charge(s, url, key=key, amount=1, currency="eur", card=GOOD_CARD, run_id=run_id)
        after = await clients.get_charge_status(s, url, key)
        return before, body, after

    before, body, after = run(go)
    assert before == ProbeResult("not_applied", None)
    assert after == ProbeResult("applied", body)


def test_probe_against_the_wrong_provider_is_unknown_not_not_applied(providers: Providers) -> None:
    async def go(s: aiohttp.ClientSession) -> Any:
        wrong = await clients.get_charge_status(s, providers.urls["mail"], "k")
        dead = await clients.get_charge_status(s, "http://127.0.0.1:9", "k")
        return wrong, dead

    wrong, dead = run(go)
    assert wrong.outcome == "unknown" and "no_such_route" in (wrong.error or "")
    assert dead.outcome == "unknown"


# -- mail -----------------------------------------------------------------------------


def test_mail_send_dedup_and_probe(providers: Providers) -> None:
    url, run_id, key = providers.urls["mail"], new_run(), new_key()

    async def go(s: aiohttp.ClientSession) -> Any:
        miss = await clients.get_mail_status(s, url, key)
        sent = await asyncio.gather(*(
            clients.send_mail(s, url, key=key, to="ada@example.com", subject="Receipt", body="", run_id=run_id,
                              delay_ms=50)
            for _ in range(3)
        ))
        hit = await clients.get_mail_status(s, url, key)
        return miss, sent, hit, await clients.read_ledger(s, url, run_id)

    miss, sent, hit, rows = run(go)
    assert miss.outcome == "not_applied"
    assert sent[0] == sent[1] == sent[2]
    assert sent[0]["message_id"] == "msg_" + sha16(key) and sent[0]["status"] == "sent"
    assert hit == ProbeResult("applied", sent[0])
    assert [(r["op"], r["status"], r["attempts"]) for r in rows] == [("message", "sent", 3)]
    assert rows[0]["request"] == {"to": "ada@example.com", "subject": "Receipt", "body": ""}


# -- ledger filtering ---------------------------------------------------------------------


def test_ledger_is_filtered_by_run_id_in_insertion_order(providers: Providers) -> None:
    url = providers.urls["payment"]
    runs = [new_run(), new_run()]
    keys = [new_key() for _ in range(6)]

    async def go(s: aiohttp.ClientSession) -> Any:
        for i, key in enumerate(keys):
            await clients.charge(s, url, key=key, amount=i, currency="eur", card=GOOD_CARD, run_id=runs[i % 2])
        return [await clients.read_ledger(s, url, r) for r in runs], await clients.read_ledger(s, url, new_run())

    (a, b), empty = run(go)
    assert [r["key"] for r in a] == keys[0::2] and [r["key"] for r in b] == keys[1::2]
    assert [r["request"]["amount"] for r in a] == [0, 2, 4]
    assert all(r["run_id"] == runs[0] for r in a)
    assert [r["seq"] for r in a] == sorted(r["seq"] for r in a)
    assert empty == []


# -- model ------------------------------------------------------------------------------


def test_model_fresh_ids_every_call_and_every_call_billed(providers: Providers) -> None:
    url, run_id = providers.urls["model"], new_run()
    messages = [{"role": "user", "content": "buy a dock"}]

    async def go(s: aiohttp.ClientSession) -> Any:
        calls = [
            await clients.complete(s, url, script=ECHO, conversation="conv1", node_id="plan", messages=messages,
                                   run_id=run_id),
            await clients.complete(s, url, script=ECHO, conversation="conv1", node_id="plan", messages=messages,
                                   run_id=run_id),
            await clients.complete(s, url, script=ECHO.replace(":echo", ":echo_async"), conversation="conv1",
                                   node_id="choose", messages=messages * 3, run_id=run_id),
        ]
        return calls, await clients.read_ledger(s, url, run_id)

    (a, b, c), rows = run(go)
    assert a["content"] == b["content"] == "[conv1] turn 1: buy a dock"
    assert [t["name"] for t in a["tool_calls"]] == ["lookup"] and a["tool_calls"][0]["arguments"] == {"turn": 1}
    assert a["tool_calls"][0]["id"] != b["tool_calls"][0]["id"]
    assert a["tool_calls"][0]["id"].startswith("call_") and len(a["tool_calls"][0]["id"]) == 17
    assert a["id"] != b["id"] and a["id"].startswith("cmpl_")
    assert c["tool_calls"] == []
    assert a["usage"] == {"tokens": len(a["content"]) + 10}
    assert [(r["op"], r["node_id"], r["call"], r["status"], r["tokens"]) for r in rows] == [
        ("completion", "plan", 1, "billed", len(a["content"]) + 10),
        ("completion", "plan", 2, "billed", len(b["content"]) + 10),
        ("completion", "choose", 1, "billed", len(c["content"]) + 10),
    ]
    assert [r["result"] for r in rows] == [a, b, c]
    assert rows[0]["request"]["n_messages"] == 1 and rows[2]["request"]["n_messages"] == 3
    assert rows[0]["request"]["messages_sha256"] == rows[1]["request"]["messages_sha256"]


@pytest.mark.parametrize(
    ("script", "status", "needle"),
    [
        ("crashmatrix.scenarios.providers.demo_script:nope", 400, "demo_script:nope"),
        ("no_such_package_xyz.mod:fn", 400, "no_such_package_xyz"),
        ("not a script name", 400, "script"),
        ("crashmatrix.scenarios.providers.demo_script:boom", 500, "boom"),
        ("crashmatrix.scenarios.providers.demo_script:malformed", 500, "content"),
    ],
)
def test_model_bad_scripts_bill_nothing(providers: Providers, script: str, status: int, needle: str) -> None:
    url, run_id = providers.urls["model"], new_run()

    async def go(s: aiohttp.ClientSession) -> Any:
        with pytest.raises(clients.ProviderError) as info:
            await clients.complete(s, url, script=script, conversation="c", node_id="n", messages=[], run_id=run_id)
        return info.value, await clients.read_ledger(s, url, run_id)

    err, rows = run(go)
    assert err.status == status and needle in err.body["error"]
    assert isinstance(err, clients.DefiniteProviderError if status == 400 else clients.AmbiguousProviderError)
    assert rows == []


# -- junk input -------------------------------------------------------------------------

JUNK: list[tuple[str, str, Any, str]] = [
    ("payment", "/charges", b"{not json", "body"),
    ("payment", "/charges", b"[1, 2]", "body"),
    ("payment", "/charges", b"", "body"),
    ("payment", "/charges", b"\xff\xfe\x00junk", "body"),
    ("mail", "/messages", b"[" * 200_000, "body"),
    ("payment", "/charges", {"amount": 1, "currency": "eur", "card": "1", "metadata": {"run_id": "r"}}, "idempotency_key"),
    ("payment", "/charges", {"idempotency_key": 7, "amount": 1, "currency": "eur", "card": "1", "metadata": {"run_id": "r"}}, "idempotency_key"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": 1.5, "currency": "eur", "card": "1", "metadata": {"run_id": "r"}}, "amount"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": -1, "currency": "eur", "card": "1", "metadata": {"run_id": "r"}}, "amount"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": "10", "currency": "eur", "card": "1", "metadata": {"run_id": "r"}}, "amount"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": True, "currency": "eur", "card": "1", "metadata": {"run_id": "r"}}, "amount"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": 10**30, "currency": "eur", "card": "1", "metadata": {"run_id": "r"}}, "amount"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": 1, "currency": "EURO", "card": "1", "metadata": {"run_id": "r"}}, "currency"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": 1, "currency": "eur", "card": None, "metadata": {"run_id": "r"}}, "card"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": 1, "currency": "eur", "card": "1"}, "metadata"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": 1, "currency": "eur", "card": "1", "metadata": {}}, "metadata.run_id"),
    ("payment", "/charges", {"idempotency_key": "k", "amount": 1, "currency": "eur", "card": "1", "metadata": {"run_id": "r", "delay_ms": "soon"}}, "metadata.delay_ms"),
    ("payment", "/refunds", {"idempotency_key": "k", "amount": 1, "metadata": {"run_id": "r"}}, "charge_id"),
    ("payment", "/refunds", {"idempotency_key": "k", "charge_id": "ch_1", "amount": [], "metadata": {"run_id": "r"}}, "amount"),
    ("mail", "/messages", {"idempotency_key": "k", "to": "nobody", "subject": "s", "body": "b", "metadata": {"run_id": "r"}}, "to"),
    ("mail", "/messages", {"idempotency_key": "k", "to": "a@b", "subject": 3, "body": "b", "metadata": {"run_id": "r"}}, "subject"),
    ("mail", "/messages", {"idempotency_key": "k", "to": "a@b", "subject": "s", "metadata": {"run_id": "r"}}, "body"),
    ("model", "/v1/complete", {"script": ECHO, "conversation": "c", "node_id": "n", "messages": {}, "metadata": {"run_id": "r"}}, "messages"),
    ("model", "/v1/complete", {"script": ECHO, "conversation": "c", "messages": [], "metadata": {"run_id": "r"}}, "node_id"),
    ("model", "/v1/complete", {"conversation": "c", "node_id": "n", "messages": [], "metadata": {"run_id": "r"}}, "script"),
]


@pytest.mark.parametrize(("kind", "path", "body", "field"), JUNK)
def test_junk_input_is_400_naming_the_field_and_leaves_no_row(
    providers: Providers, kind: str, path: str, body: Any, field: str
) -> None:
    url = providers.urls[kind]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def go(s: aiohttp.ClientSession) -> Any:
        async with s.post(url + path, data=data, headers={"Content-Type": "application/json"}) as resp:
            answer = (resp.status, await resp.json())
        return answer, await clients.read_ledger(s, url, "r")

    (status, answer), rows = run(go)
    assert status == 400, answer
    assert answer["field"] == field and answer["error"].startswith(field + ":")
    assert rows == []


_json_scalar = st.none() | st.booleans() | st.integers(-5, 10**13) | st.floats(allow_nan=False) | st.text(max_size=5)
_json_value = st.recursive(_json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.fixed_dictionaries(
        {},
        optional={
            "idempotency_key": _json_value | st.text(min_size=1, max_size=10),
            "amount": _json_value,
            "currency": st.sampled_from(["eur", "usd", "EUR", ""]) | _json_value,
            "card": st.sampled_from([GOOD_CARD, DECLINED_CARD]) | _json_value,
            "charge_id": _json_value,
            "metadata": st.fixed_dictionaries({}, optional={"run_id": _json_value | st.just("fuzz-run"),
                                                             "delay_ms": st.integers(-1, 2) | _json_value}),
        },
    ),
    path=st.sampled_from(["/charges", "/refunds"]),
)
def test_fuzzed_payment_bodies_never_500(providers: Providers, body: dict[str, Any], path: str) -> None:
    url = providers.urls["payment"] + path

    async def go(s: aiohttp.ClientSession) -> tuple[int, Any]:
        async with s.post(url, json=body) as resp:
            return resp.status, await resp.json()

    status, answer = run(go)
    assert status in (200, 400, 402, 404, 409), answer
    assert isinstance(answer, dict)
    if status == 400:
        assert answer["field"] and answer["error"].startswith(answer["field"])


def test_unknown_route_and_method_are_json_4xx(providers: Providers) -> None:
    async def go(s: aiohttp.ClientSession) -> Any:
        out = []
        for method, path in [("GET", "/nope"), ("POST", "/health"), ("POST", "/messages")]:
            async with s.request(method, providers.urls["payment"] + path) as resp:
                out.append((resp.status, await resp.json()))
        return out

    assert [status for status, _ in run(go)] == [404, 405, 404]


# -- classification of failures -----------------------------------------------------------


def test_timeout_is_ambiguous_and_the_probe_resolves_it(providers: Providers) -> None:
    url, run_id, key, worker = providers.urls["payment"], new_run(), new_key(), "w-" + uuid.uuid4().hex[:6]

    async def go(s: aiohttp.ClientSession) -> Any:
        with pytest.raises(clients.AmbiguousProviderError) as info:
            await clients.charge(s, url, key=key, amount=7, currency="eur", card=GOOD_CARD, run_id=run_id,
                                 worker_id=worker, delay_ms=800, timeout=0.05)
        during = await clients.inflight(s, url, worker)
        await clients.wait_inflight_zero(s, url, worker, deadline_s=5)
        return info.value, during, await clients.get_charge_status(s, url, key)

    err, during, probe = run(go)
    assert err.retryable and err.status is None
    assert during == 1  # the caller gave up; the provider did not
    assert probe.outcome == "applied" and probe.result["charge_id"] == "ch_" + sha16(key)


def test_unreachable_provider_is_a_definite_retryable_error() -> None:
    async def go(s: aiohttp.ClientSession) -> Any:
        with pytest.raises(clients.ProviderUnreachableError) as info:
            await clients.charge(s, "http://127.0.0.1:9", key="k", amount=1, currency="eur", card="1", run_id="r")
        return info.value

    err = run(go)
    assert isinstance(err, clients.DefiniteProviderError) and err.retryable


# -- in-flight accounting ----------------------------------------------------------------

_KILLED_CLIENT = """
import asyncio, sys, aiohttp
from crashmatrix.harness.services.providers import clients
async def main():
    async with aiohttp.ClientSession() as s:
        await clients.charge(s, sys.argv[1], key=sys.argv[2], amount=4200, currency="eur",
                             card="4242424242424242", run_id=sys.argv[3], worker_id=sys.argv[4],
                             delay_ms=int(sys.argv[5]))
        print("ANSWERED", flush=True)
asyncio.run(main())
"""


def test_inflight_outlives_a_killed_client_and_the_charge_still_lands(providers: Providers) -> None:
    url, run_id, key, worker = providers.urls["payment"], new_run(), new_key(), "w-" + uuid.uuid4().hex[:6]
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CLIENT, url, key, run_id, worker, "700"],
        stdout=subprocess.PIPE, start_new_session=True,
    )
    try:
        async def go(s: aiohttp.ClientSession) -> Any:
            deadline = time.monotonic() + 10
            while await clients.inflight(s, url, worker) == 0:
                assert proc.poll() is None and time.monotonic() < deadline, "request never arrived"
                await asyncio.sleep(0.01)
            total_during = await clients.inflight(s, url)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            after_kill = await clients.inflight(s, url, worker)
            not_yet = await clients.get_charge_status(s, url, key)
            t0 = time.monotonic()
            await clients.wait_inflight_zero(s, url, worker, deadline_s=5)
            waited = time.monotonic() - t0
            return total_during, after_kill, not_yet, waited, await clients.get_charge_status(s, url, key), \
                await clients.read_ledger(s, url, run_id)

        total_during, after_kill, not_yet, waited, probe, rows = run(go)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert total_during >= 1
    assert after_kill == 1  # the handler keeps running after its client died
    assert not_yet.outcome == "not_applied"
    assert waited > 0.1
    assert probe.outcome == "applied" and probe.result["amount"] == 4200
    assert [(r["key"], r["status"], r["attempts"]) for r in rows] == [(key, "succeeded", 1)]


def test_inflight_counts_per_worker(providers: Providers) -> None:
    url, run_id = providers.urls["mail"], new_run()
    a, b = "wa-" + uuid.uuid4().hex[:6], "wb-" + uuid.uuid4().hex[:6]

    async def go(s: aiohttp.ClientSession) -> Any:
        tasks = [
            asyncio.create_task(clients.send_mail(s, url, key=new_key(), to="x@y", subject="s", body="b",
                                                  run_id=run_id, worker_id=w, delay_ms=600))
            for w in (a, a, b)
        ]
        deadline = time.monotonic() + 5
        while (during := (await clients.inflight(s, url, a), await clients.inflight(s, url, b))) != (2, 1):
            assert time.monotonic() < deadline, during
            await asyncio.sleep(0.01)
        total = await clients.inflight(s, url)
        await asyncio.gather(*tasks)
        after = (await clients.inflight(s, url, a), await clients.inflight(s, url, b))
        return during, total, after

    during, total, after = run(go)
    assert during == (2, 1) and total >= 3 and after == (0, 0)


def test_health(providers: Providers) -> None:
    async def go(s: aiohttp.ClientSession) -> Any:
        return [await clients.health(s, providers.urls[k]) for k in ("payment", "mail", "model")]

    assert run(go) == ["payment", "mail", "model"]


def test_refused_requests_are_kept_with_their_run_id(providers: Providers) -> None:
    """A request answered 4xx leaves no ledger row but is kept at ``/refusals`` (what
    the golden-run sanity check names); a body with no readable run id is kept too."""
    run_id, url = new_run(), providers.urls["payment"]

    async def go(s: aiohttp.ClientSession) -> Any:
        body = {"idempotency_key": new_key(), "amount": 100, "currency": "EUR", "card": "4242-4242-4242-4242",
                "metadata": {"run_id": run_id}}
        async with s.post(url + "/charges", json=body) as resp:
            status = resp.status
        async with s.post(url + "/charges", data=b"{not json", headers={"Content-Type": "application/json"}):
            pass
        return status, await clients.read_refusals(s, url, run_id), await clients.read_refusals(s, url, None)

    status, mine, every = run(go)
    assert status == 400
    assert [(r["method"], r["path"], r["http_status"]) for r in mine] == [("POST", "/charges", 400)]
    assert mine[0]["error"].startswith("currency: must be a lowercase ISO 4217 code, got 'EUR'")
    assert every[-1]["run_id"] is None and every[-1]["http_status"] == 400
