"""Payload wire formats of the reference runtime's later builds, for build pairs.

The reference runtime's payload codec (:mod:`crashmatrix.reference_runtime.codec`)
tags every payload with a format version and upgrades older ones on read
(docs/design.md, "State codec"). These are the formats its next builds write, each a
change a real team makes, installed into a build's worker processes only
(:func:`install`: a build is a process of its own, :mod:`crashmatrix.harness.builds`):

- **version 2**: a tool call's ``arguments`` travel as a JSON string,
  ``arguments_json`` (as chat APIs send them); upgrader 1 -> 2 encodes the object;
- **version 3**: also a tool message's ``tool_call_id`` is ``call_id``; upgrader
  2 -> 3 renames it.

In memory every build sees the same values (``arguments`` an object, ``tool_call_id``):
:func:`to_wire` / :func:`from_wire` convert at the codec's boundary, so a run written
by one build and continued by another has the golden run's transcript when the
upgraders are right.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from crashmatrix.reference_runtime import codec

Upgrader = Callable[[Any], Any]


def _walk(value: Any, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``value`` with ``fn`` applied to every dict in it, innermost first."""
    if isinstance(value, dict):
        return fn({k: _walk(v, fn) for k, v in value.items()})
    if isinstance(value, list):
        return [_walk(v, fn) for v in value]
    return value


def _is_call(d: dict[str, Any]) -> bool:
    """A tool call (``{"id", "name", "arguments"}``): the only dicts with both keys."""
    return "id" in d and "name" in d


def _args_to_json(d: dict[str, Any]) -> dict[str, Any]:
    if _is_call(d):
        d = dict(d)
        d["arguments_json"] = json.dumps(d.pop("arguments"), sort_keys=True, separators=(",", ":"))
    return d


def _args_from_json(d: dict[str, Any]) -> dict[str, Any]:
    if _is_call(d):  # strict, as a real reader is: a call of format 2 has arguments_json
        d = dict(d)
        d["arguments"] = json.loads(d.pop("arguments_json"))
    return d


def _call_id_renamed(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("role") == "tool":
        d = dict(d)
        d["call_id"] = d.pop("tool_call_id")
    return d


def _call_id_back(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("role") == "tool":
        d = dict(d)
        d["tool_call_id"] = d.pop("call_id")
    return d


UPGRADE_1_TO_2: Upgrader = lambda value: _walk(value, _args_to_json)  # noqa: E731
UPGRADE_2_TO_3: Upgrader = lambda value: _walk(value, _call_id_renamed)  # noqa: E731


def to_wire(value: Any, version: int) -> Any:
    """The in-memory ``value`` as format ``version`` stores it."""
    if version >= 2:
        value = UPGRADE_1_TO_2(value)
    if version >= 3:
        value = UPGRADE_2_TO_3(value)
    return value


def from_wire(value: Any, version: int) -> Any:
    """A format-``version`` value back in memory. Strict, as a real reader is: a value
    of an older format (handed over by a no-op upgrader) raises ``KeyError``."""
    if version >= 3:
        value = _walk(value, _call_id_back)
    if version >= 2:
        value = _walk(value, _args_from_json)
    return value


def install(version: int, upgraders: dict[int, Upgrader]) -> None:
    """Make this process's reference runtime write format ``version`` and upgrade
    older payloads with ``upgraders`` (``{n: n -> n + 1}``). Idempotent; call it in a
    build's worker processes (its adapter's ``start``/``resume``/``observe``), never in
    a controller that serves other builds: it changes the codec module of this
    process."""
    if getattr(codec, "_wire_version", None) == version:
        return
    plain_encode = getattr(codec, "_plain_encode", codec.encode)
    plain_decode = getattr(codec, "_plain_decode", codec.decode)
    plain_encode_read = getattr(codec, "_plain_encode_read", codec.encode_read)
    plain_encode_trusted = getattr(codec, "_plain_encode_trusted", codec.encode_trusted)
    codec.FORMAT_VERSION = version
    codec.UPGRADERS.clear()
    codec.UPGRADERS.update(upgraders)

    def encode(value: Any, **kwargs: Any) -> Any:
        return plain_encode(to_wire(value, version), **kwargs)

    def decode(payload: Any, **kwargs: Any) -> Any:
        return from_wire(plain_decode(payload, **kwargs), version)

    def encode_read(value: Any, **kwargs: Any) -> Any:
        payload, read = plain_encode_read(to_wire(value, version), **kwargs)
        return payload, from_wire(read, version)

    def encode_trusted(value: Any) -> Any:
        return plain_encode_trusted(to_wire(value, version))

    codec._plain_encode, codec._plain_decode = plain_encode, plain_decode  # type: ignore[attr-defined]
    codec._plain_encode_read, codec._plain_encode_trusted = plain_encode_read, plain_encode_trusted  # type: ignore[attr-defined]
    codec.encode, codec.decode = encode, decode  # type: ignore[assignment]
    codec.encode_read, codec.encode_trusted = encode_read, encode_trusted  # type: ignore[assignment]
    codec._wire_version = version  # type: ignore[attr-defined]
