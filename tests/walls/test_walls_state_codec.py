"""State codec (reference_runtime/state_codec.py): field registry, transient fields,
unknown fields refused at write time with their name, versions and upgraders; and the
runtime never pickles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crashmatrix.reference_runtime import codec
from crashmatrix.reference_runtime.state_codec import (
    FieldCodec,
    StateCodecError,
    StateSchema,
    TrackedState,
    UnknownStateField,
    fold,
)

RUNTIME = Path(__file__).resolve().parents[2] / "reference_runtime"


class LiveClient:
    """Stands for an HTTP client / logger / tokenizer: not data."""

    def __init__(self, resources: object = None) -> None:
        self.resources = resources


def shop(version: int = 1) -> StateSchema:
    s = StateSchema("shop", version=version)
    s.field("cart")
    s.field("seen", FieldCodec(encode=sorted, decode=set))
    s.transient("client", LiveClient)
    return s


def test_registered_fields_round_trip_through_their_codecs() -> None:
    s = shop()
    payload = s.encode({"cart": [{"sku": "dock-1", "qty": 1}], "seen": {"b", "a"}})
    assert payload is not None
    assert s.decode(payload) == {"cart": [{"sku": "dock-1", "qty": 1}], "seen": {"a", "b"}}
    assert codec.decode(payload) == {"schema": "shop", "version": 1, "fields": {"cart": [{"qty": 1, "sku": "dock-1"}], "seen": ["a", "b"]}}


def test_unknown_field_fails_at_write_time_naming_it_and_its_type() -> None:
    with pytest.raises(UnknownStateField, match=r"state field 'session' \(a .*LiveClient\) is neither registered nor declared transient in state schema 'shop'"):
        shop().encode({"cart": [], "session": LiveClient()})


def test_transient_field_is_never_written_and_is_rebuilt_by_its_factory() -> None:
    s = shop()
    client = LiveClient()
    payload = s.encode({"cart": ["x"], "client": client})
    assert payload is not None and b"client" not in payload.inline
    assert s.encode({"client": client}) is None  # only transient fields: nothing to write
    rebuilt = s.rebuild(resources="res")
    assert isinstance(rebuilt["client"], LiveClient) and rebuilt["client"] is not client
    assert rebuilt["client"].resources == "res"


def test_encoder_output_must_be_durable_json() -> None:
    s = StateSchema("bad")
    s.field("ratio")
    with pytest.raises(StateCodecError, match=r"state field 'ratio' is a value of type float"):
        s.encode({"ratio": 0.5})


def test_a_field_cannot_be_both_durable_and_transient() -> None:
    s = shop()
    with pytest.raises(ValueError, match="already registered"):
        s.transient("cart", LiveClient)
    with pytest.raises(ValueError, match="already declared transient"):
        s.field("client")


def test_older_version_is_upgraded_on_read() -> None:
    v1 = StateSchema("shop", version=1)
    v1.field("items")
    old = v1.encode({"items": ["dock-1", "dock-1", "cable"]})
    v3 = StateSchema("shop", version=3)
    v3.field("cart")

    @v3.upgrader(1)
    def rename(fields: dict) -> dict:  # v2 renamed items -> cart (a list of skus)
        return {"cart": fields.pop("items")}

    @v3.upgrader(2)
    def count(fields: dict) -> dict:  # v3 counts quantities
        cart: dict[str, int] = {}
        for sku in fields["cart"]:
            cart[sku] = cart.get(sku, 0) + 1
        return {"cart": cart}

    assert old is not None
    assert v3.decode(old) == {"cart": {"dock-1": 2, "cable": 1}}


def test_missing_upgrader_newer_version_other_schema_and_unknown_stored_field_are_refused() -> None:
    v2 = StateSchema("shop", version=2)
    v2.field("items")
    v1 = StateSchema("shop", version=1)
    v1.field("items")
    p1, p2 = v1.encode({"items": []}), v2.encode({"items": []})
    with pytest.raises(StateCodecError, match="no upgrader from version 1 to 2"):
        v2.decode(p1)
    with pytest.raises(StateCodecError, match="has version 2, newer than this build's 1"):
        v1.decode(p2)
    other = StateSchema("crm")
    with pytest.raises(StateCodecError, match="belongs to schema 'shop', not 'crm'"):
        other.decode(p1)
    renamed = StateSchema("shop")
    renamed.field("cart")
    with pytest.raises(StateCodecError, match="holds field 'items'"):
        renamed.decode(p1)


def test_fold_applies_updates_in_order_and_tracked_state_reports_what_was_set() -> None:
    s = shop()
    payloads = [s.encode({"cart": [1]}), s.encode({"cart": [1, 2], "seen": {"x"}})]
    assert fold(s, payloads) == {"cart": [1, 2], "seen": {"x"}}
    with pytest.raises(StateCodecError, match="declares no state schema"):
        fold(None, payloads)
    t = TrackedState({"cart": [1], "client": "c"})
    t["cart"] = [1, 2]
    t.setdefault("seen", set())
    t.setdefault("client", "other")
    assert t.updates() == {"cart": [1, 2], "seen": set()}


PICKLE = re.compile(r"\b(pickle|cPickle|_pickle|dill|cloudpickle|shelve|marshal|jsonpickle|copyreg)\b")


def pickle_uses(root: Path) -> list[str]:
    """Code lines (not docstrings or comments) under ``root`` that use a pickle-like
    serialiser."""
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        in_doc = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            quotes = stripped.count('"""')
            if in_doc or stripped.startswith('"""') or stripped.startswith("#"):
                if quotes % 2 == 1:
                    in_doc = not in_doc
                continue
            if PICKLE.search(line.split("#", 1)[0]):
                offenders.append(f"{path.relative_to(root.parent)}:{n}: {stripped}")
    return offenders


def test_runtime_never_pickles_anything() -> None:
    assert list(RUNTIME.rglob("*.py")), "found no runtime sources"
    offenders = pickle_uses(RUNTIME)
    assert not offenders, "durable state must never be pickled:\n" + "\n".join(offenders)


def test_pickle_scan_catches_a_planted_use(tmp_path: Path) -> None:
    """The scanner is not vacuous: a planted pickle is found, a docstring naming it is not."""
    pkg = tmp_path / "rt"
    pkg.mkdir()
    (pkg / "ok.py").write_text('"""Never pickle anything durable."""\nimport json  # not pickle\n')
    (pkg / "bad.py").write_text('"""Store."""\n\ndef save(state):\n    import pickle\n    return pickle.dumps(state)\n')
    assert pickle_uses(pkg) == ["rt/bad.py:4: import pickle", "rt/bad.py:5: return pickle.dumps(state)"]
