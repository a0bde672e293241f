"""Payload codec: JSON values to versioned protobuf ``Payload`` messages and back.

Wall (DESIGN.md, "State codec"): never pickle anything durable. A payload is canonical
JSON (sorted keys, no floats for money: amounts are integer minor units) tagged with the
codec name and a format version, so a newer build can upgrade what an older one wrote.
Upgraders are registered per version: ``UPGRADERS[n]`` turns a version-``n`` value into
version ``n + 1``.

Large values (over :data:`~.blobs.DEFAULT_THRESHOLD` bytes once encoded) go to a blob
store when the caller passes one (:mod:`.blobs`); the payload then holds a pointer, and
:func:`decode` reads and verifies the blob. Field-level state (a schema, transient
fields) is :mod:`.state_codec`'s, built on this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .blobs import DEFAULT_THRESHOLD, BlobStore
from .records_pb2 import Payload

CODEC = "json"
FORMAT_VERSION = 1
UPGRADERS: dict[int, Callable[[Any], Any]] = {}


class CodecError(ValueError):
    """A payload cannot be encoded (a value JSON cannot hold) or decoded (unknown codec,
    a format version newer than this build, corrupt bytes). The message says which."""


def encode(value: Any, *, blobs: BlobStore | None = None, threshold: int = DEFAULT_THRESHOLD) -> Payload:
    """Encode a JSON-compatible ``value`` (dict, list, str, int, bool, None) as a Payload.

    With a ``blobs`` store, an encoding longer than ``threshold`` bytes is written there
    and the payload holds its pointer. Raises :class:`CodecError` naming the offending
    type for anything else; floats are refused too (money is integer minor units;
    durable state must compare exactly).
    """
    _check_durable(value, "payload")
    data = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    if blobs is not None and len(data) > threshold:
        return Payload(codec=CODEC, format_version=FORMAT_VERSION, blob=blobs.put(data))
    return Payload(codec=CODEC, format_version=FORMAT_VERSION, inline=data)


_SCALARS = frozenset({type(None), bool, int, str})


def _check_durable(value: Any, where: str) -> None:
    """Refuse what JSON would change or cannot hold: floats, non-string keys, objects.

    The check runs for every payload the executor writes, so it builds no path on the
    way; only for a value it refuses does :func:`_first_offence` walk again to name where
    the offending part is. A cyclic value ends in ``RecursionError``."""
    if not _durable(value):
        found = _first_offence(value, where)
        if found is None:
            raise AssertionError(f"_durable and _first_offence disagree on {where}")
        raise found


def _durable(value: Any) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is dict or isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                return False
            if type(item) not in _SCALARS and not _durable(item):
                return False
        return True
    if kind is list or isinstance(value, list):
        for item in value:
            if type(item) not in _SCALARS and not _durable(item):
                return False
        return True
    return isinstance(value, bool | int | str)  # subclasses: an IntEnum, a str subclass


def _first_offence(value: Any, where: str) -> CodecError | None:
    """The error naming the first value in ``value`` that :func:`_durable` refuses (in
    key order, with its path from ``where``), or None."""
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _first_offence(item, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return CodecError(f"cannot encode payload: {where} has a key of type {type(key).__name__} ({key!r}); keys must be str")
            found = _first_offence(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    return CodecError(f"cannot encode payload: {where} is a value of type {type(value).__name__}, which is not durable JSON")


def decode(payload: Payload, *, blobs: BlobStore | None = None) -> Any:
    """Decode a Payload written by this or an older build (applying upgraders).

    Raises :class:`CodecError` for an unknown codec, a newer format version, a blob
    pointer without a ``blobs`` store, or bytes that are not JSON;
    :class:`~.blobs.BlobError` when the blob is missing or fails its hash check.
    """
    if payload.codec != CODEC:
        raise CodecError(f"payload codec={payload.codec!r} is unknown (expected {CODEC!r})")
    version = payload.format_version
    if version > FORMAT_VERSION:
        raise CodecError(
            f"payload format_version={version} is newer than this build's {FORMAT_VERSION}"
        )
    body = payload.WhichOneof("body")
    if body == "blob":
        if blobs is None:
            raise CodecError(f"payload body is not inline but a blob pointer ({payload.blob.uri}); decoding it needs a blob store")
        data = blobs.get(payload.blob)
    elif body == "inline":
        data = payload.inline
    else:
        raise CodecError("payload has no body")
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"payload is not valid JSON: {exc}") from None
    while version < FORMAT_VERSION:
        value = UPGRADERS[version](value)
        version += 1
    return value
