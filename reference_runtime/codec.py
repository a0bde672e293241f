"""Payload codec: JSON values to versioned protobuf ``Payload`` messages and back.

Wall (DESIGN.md, "State codec"): never pickle anything durable. A payload is canonical
JSON (sorted keys, no floats for money: amounts are integer minor units) tagged with the
codec name and a format version, so a newer build can upgrade what an older one wrote.
Upgraders are registered per version: ``UPGRADERS[n]`` turns a version-``n`` value into
version ``n + 1``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .records_pb2 import Payload

CODEC = "json"
FORMAT_VERSION = 1
UPGRADERS: dict[int, Callable[[Any], Any]] = {}


class CodecError(ValueError):
    """A payload cannot be encoded (a value JSON cannot hold) or decoded (unknown codec,
    a format version newer than this build, corrupt bytes). The message says which."""


def encode(value: Any) -> Payload:
    """Encode a JSON-compatible ``value`` (dict, list, str, int, bool, None) as a Payload.

    Raises :class:`CodecError` naming the offending type for anything else; floats are
    refused too (money is integer minor units; durable state must compare exactly).
    """
    _check_durable(value, "payload")
    data = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return Payload(codec=CODEC, format_version=FORMAT_VERSION, inline=data.encode())


def _check_durable(value: Any, where: str) -> None:
    """Refuse what JSON would change or cannot hold: floats, non-string keys, objects."""
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_durable(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CodecError(f"cannot encode payload: {where} has a key of type {type(key).__name__} ({key!r}); keys must be str")
            _check_durable(item, f"{where}[{key!r}]")
        return
    raise CodecError(f"cannot encode payload: {where} is a value of type {type(value).__name__}, which is not durable JSON")


def decode(payload: Payload) -> Any:
    """Decode a Payload written by this or an older build (applying upgraders).

    Raises :class:`CodecError` for an unknown codec, a newer format version, a blob
    pointer (not supported by this codec yet) or bytes that are not JSON.
    """
    if payload.codec != CODEC:
        raise CodecError(f"payload codec={payload.codec!r} is unknown (expected {CODEC!r})")
    version = payload.format_version
    if version > FORMAT_VERSION:
        raise CodecError(
            f"payload format_version={version} is newer than this build's {FORMAT_VERSION}"
        )
    if payload.WhichOneof("body") != "inline":
        raise CodecError("payload body is not inline; blob pointers need a blob store")
    try:
        value = json.loads(payload.inline)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"payload is not valid JSON: {exc}") from None
    while version < FORMAT_VERSION:
        value = UPGRADERS[version](value)
        version += 1
    return value
