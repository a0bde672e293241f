"""The document store provider kind and ``POST /admin/delay``, over real sockets in a real
process: create-once rows named by the client, read-back, conflicts, bad input."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from crashmatrix.harness.services.providers import clients
from crashmatrix.harness.services.providers.launcher import DEFAULT_KINDS, start_providers
from crashmatrix.harness.services.providers.ledger import read_ledger_file


def test_docstore_creates_once_reads_back_and_refuses_what_it_must(tmp_path: Path) -> None:
    assert "docstore" not in DEFAULT_KINDS  # the checkout sessions do not pay for it
    with start_providers(tmp_path, kinds=("docstore",)) as p:
        url = p.urls["docstore"]

        async def main() -> None:
            async with aiohttp.ClientSession() as s:
                doc = {"title": "t", "n": 1}
                missing = await clients.get_document_status(s, url, "notes", "k1")
                assert missing.outcome == "not_applied"
                first = await clients.create_document(s, url, collection="notes", doc_id="k1", document=doc, run_id="r")
                again = await clients.create_document(s, url, collection="notes", doc_id="k1", document=doc, run_id="r")
                assert first == again and first["rev"].startswith("1-") and first["document"] == doc
                back = await clients.get_document_status(s, url, "notes", "k1")
                assert (back.outcome, back.result) == ("applied", first)
                with pytest.raises(clients.DefiniteProviderError) as conflict:
                    await clients.create_document(s, url, collection="notes", doc_id="k1", document={"n": 2}, run_id="r")
                assert conflict.value.status == 409
                for bad_id, body in (("has space", {"document": {}, "metadata": {"run_id": "r"}}),
                                     ("k2", {"document": [1], "metadata": {"run_id": "r"}}),
                                     ("k3", {"metadata": {"run_id": "r"}})):
                    async with s.put(f"{url}/collections/notes/docs/{bad_id}", json=body) as resp:
                        assert resp.status == 400, (bad_id, await resp.text())
                async with s.post(f"{url}/admin/delay", json={"delay_ms": -1}) as resp:
                    assert resp.status == 400 and (await resp.json())["field"] == "delay_ms"
                await clients.set_delay(s, url, 300)
                started = time.monotonic()
                await clients.create_document(s, url, collection="notes", doc_id="k4", document=doc, run_id="r")
                assert time.monotonic() - started >= 0.3
                await clients.set_delay(s, url, 0)

        asyncio.run(main())
    rows = read_ledger_file(p.ledger_paths["docstore"])
    assert [(r["op"], r["key"], r["attempts"]) for r in rows] == [("document", "notes/k1", 3), ("document", "notes/k4", 1)]
