"""Services a workload declares: the spec's rules, and the server the harness runs for it
(a real process, its SQLite ledger, real sockets)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from crashmatrix.harness.errors import InvalidArgument
from crashmatrix.harness.services.providers import EffectRoute, ServiceSpec, clients, workload_services
from crashmatrix.harness.services.providers.declared import derive_service_id
from crashmatrix.harness.services.providers.launcher import start_providers
from crashmatrix.harness.services.providers.ledger import read_ledger_file

CRM = ServiceSpec("crm", routes=(
    EffectRoute("POST", "/contacts", op="contact", key="idempotency_key", same_effect=("email", "name"),
                answer={"stage": "lead"}, id_field="contact_id", id_prefix="ct-",
                status_path="/contacts/by-key/{key}"),
    EffectRoute("PUT", "/accounts/{ref}/notes", op="note", key="path:ref", same_effect=("text", "header:X-Tenant"),
                echo=False, id_prefix="note:", status="stored", run_id="header:X-Run"),
))


def test_a_spec_names_the_field_at_fault() -> None:
    route = dict(method="POST", path="/t", op="t", key="header:Idempotency-Key", same_effect=("a",))
    EffectRoute(**route)  # the valid base
    for change, field in [({"method": "GET"}, "method"), ({"path": "t"}, "path"), ({"path": "/ledger"}, "path"),
                          ({"op": "T-1"}, "op"), ({"key": "path:nope"}, "key"), ({"key": "query:k"}, "key"),
                          ({"same_effect": "a"}, "same_effect"), ({"same_effect": ("a", "a")}, "same_effect"),
                          ({"same_effect": ("a.b",)}, "same_effect"), ({"answer": {"x": {1, 2}}}, "answer"),
                          ({"id_prefix": 7}, "id_prefix"),
                          ({"http_status": 202}, "http_status"), ({"status_path": "/t/by-key"}, "status_path")]:
        with pytest.raises(InvalidArgument, match=rf"^{field}"):
            EffectRoute(**{**route, **change})
    ok = EffectRoute(**route)
    for name, routes, field in [("payment", (ok,), "name"), ("Tickets", (ok,), "name"), ("t", (), "routes"),
                                ("t", (ok, ok), "routes")]:
        with pytest.raises(InvalidArgument, match=rf"^{field}"):
            ServiceSpec(name, routes)
    assert ServiceSpec.from_json(json.loads(json.dumps(CRM.to_json()))) == CRM
    assert CRM.route("note").key == "path:ref" and CRM.route("contact").same_effect == ("body:email", "body:name")


def test_a_workload_lists_each_declared_service_in_its_providers() -> None:
    class Workload:
        providers = ("model", "crm")
        services = (CRM,)

    assert workload_services(Workload()) == {"crm": CRM}
    Workload.providers = ("model",)
    with pytest.raises(InvalidArgument, match="'crm' must also be listed in workload.providers"):
        workload_services(Workload())
    Workload.services = ("crm",)  # type: ignore[assignment]
    with pytest.raises(InvalidArgument, match=r"services\[0\]='crm' must be a ServiceSpec"):
        workload_services(Workload())
    assert workload_services(object()) == {}
    with pytest.raises(InvalidArgument, match="or the declared services"):
        start_providers(Path("/nonexistent"), kinds=("crm", "tickets"), services=(CRM,))


async def _post(s: aiohttp.ClientSession, url: str, body: Any, **headers: str) -> tuple[int, dict[str, Any], str | None]:
    async with s.post(url, data=body if isinstance(body, bytes) else json.dumps(body).encode(),
                      headers={"Content-Type": "application/json", **headers}) as resp:
        return resp.status, await resp.json(), resp.headers.get("Idempotent-Replayed")


def test_the_declared_service_applies_a_key_once_refuses_conflicts_and_bad_input(tmp_path: Path) -> None:
    with start_providers(tmp_path, kinds=("crm",), services=(CRM,)) as p:
        url = p.urls["crm"]
        assert json.loads((tmp_path / "crm.service.json").read_text()) == CRM.to_json()

        async def main() -> None:
            async with aiohttp.ClientSession() as s:
                assert await clients.health(s, url) == "crm"
                contact = {"idempotency_key": "k1", "email": "a@example.test", "name": "Ada", "note": "ignored",
                           "metadata": {"run_id": "r1"}}
                missing = await clients.get_status(s, url, "/contacts/by-key/{key}", "k1")
                assert missing.outcome == "not_applied"
                first = await clients.request_effect(s, url, "/contacts", contact, worker_id="w1")
                assert first == {"stage": "lead", "email": "a@example.test", "name": "Ada",
                                 "contact_id": derive_service_id("ct-", "k1")}
                assert first["contact_id"] == "ct-" + hashlib.sha256(b"k1").hexdigest()
                # a repeat with the same effect fields (other fields may differ) gets the same answer
                status, again, replayed = await _post(s, url + "/contacts", {**contact, "note": "other"})
                assert (status, again, replayed) == (200, first, "true")
                probed = await clients.get_status(s, url, "/contacts/by-key/{key}", "k1")
                assert (probed.outcome, probed.result) == ("applied", first)
                # the key reused with another name, or from another run: 409, nothing applied
                for other in ({**contact, "name": "Bob"}, {**contact, "metadata": {"run_id": "r2"}}):
                    with pytest.raises(clients.DefiniteProviderError) as conflict:
                        await clients.request_effect(s, url, "/contacts", other)
                    assert conflict.value.status == 409 and conflict.value.body["field"] == "idempotency_key"
                # bad input: 400 naming the selector, no row
                for body, field in [(b"{", "body"), ([1], "body"), ({**contact, "idempotency_key": ""}, "body:idempotency_key"),
                                    ({k: v for k, v in contact.items() if k != "email"}, "body:email"),
                                    ({**contact, "idempotency_key": "k9", "metadata": {}}, "body:metadata.run_id")]:
                    status, answer, _ = await _post(s, url + "/contacts", body)
                    assert (status, answer["field"]) == (400, field), answer
                # a key in the path, a header among the effect fields, the run id in a header
                note = {"text": "call back"}
                headers = {"X-Tenant": "acme", "X-Run": "r1"}
                stored = await clients.request_effect(s, url, "/accounts/acc-7/notes", note, method="PUT", headers=headers)
                assert stored == {"id": "note:" + hashlib.sha256(b"acc-7").hexdigest()}
                with pytest.raises(clients.DefiniteProviderError) as other_tenant:
                    await clients.request_effect(s, url, "/accounts/acc-7/notes", note, method="PUT",
                                                 headers={**headers, "X-Tenant": "globex"})
                assert other_tenant.value.status == 409
                status, answer, _ = await _post(s, url + "/accounts/acc-8/notes", note)
                assert status == 405  # PUT only
                async with s.put(url + "/accounts/acc-8/notes", json=note, headers={"X-Run": "r1"}) as resp:
                    assert resp.status == 400 and (await resp.json())["field"] == "header:X-Tenant"
                # in flight per worker while the service holds a request (its delay)
                await clients.set_delay(s, url, 400)
                held = asyncio.ensure_future(clients.request_effect(
                    s, url, "/contacts", {**contact, "idempotency_key": "k2"}, worker_id="w2"))
                await asyncio.sleep(0.2)
                assert await clients.inflight(s, url, "w2") == 1 and await clients.inflight(s, url, "w1") == 0
                await held
                await clients.set_delay(s, url, 0)
                await clients.wait_inflight_zero(s, url, "w2", deadline_s=5)
                rows = await clients.read_ledger(s, url, "r1")
                assert [(r["op"], r["key"], r["status"], r["attempts"]) for r in rows] == [
                    ("contact", "k1", "created", 4), ("note", "acc-7", "stored", 2), ("contact", "k2", "created", 1)]
                assert rows[0]["request"] == {"email": "a@example.test", "name": "Ada"}
                assert rows[1]["request"] == {"text": "call back", "header:X-Tenant": "acme"}

        asyncio.run(main())
    assert p.exit_codes == {"crm": 0}
    assert len(read_ledger_file(p.ledger_paths["crm"])) == 3  # durable after the process is gone


def test_docs_quote_the_ticketing_example_as_it_is() -> None:
    """docs/adapters.md, "Services a workload declares", shows the example's code: every
    piece it quotes (up to an elided ``...``) is in the files it names."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "adapters.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(# scenarios/ticketing/tools.py\n.*?)```", page, re.S)
    pieces = 0
    for segment in re.split(r"^# (?=scenarios/ticketing/)", block, flags=re.M)[1:]:
        name, _, code = segment.partition("\n")
        source = (root / name).read_text(encoding="utf-8")
        for piece in re.split(r"\n\n\n", code):
            piece = piece.split("\n    ...", 1)[0].strip()
            if piece:
                pieces += 1
                assert piece in source, f"docs/adapters.md quotes code that is not in {name}:\n{piece[:400]}"
    assert pieces >= 4
