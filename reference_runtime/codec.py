"""Payload codec: JSON values to versioned protobuf ``Payload`` messages and back.

Wall (docs/design.md, "State codec"): never pickle anything durable. A payload is canonical
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
import json.encoder as _json_encoder
from collections.abc import Callable
from typing import Any

from .blobs import DEFAULT_THRESHOLD, BlobStore
from .records_pb2 import Payload

_c_make_encoder = _json_encoder.c_make_encoder

CODEC = "json"
FORMAT_VERSION = 1
UPGRADERS: dict[int, Callable[[Any], Any]] = {}


class CodecError(ValueError):
    """A payload cannot be encoded (a value JSON cannot hold) or decoded (unknown codec,
    a format version newer than this build, corrupt bytes). The message says which."""


class UnreadablePayload(CodecError):
    """A durable payload this build cannot read: another codec, a format version newer
    than this build's or one it has no upgrader from, bytes that are not JSON. What a
    resume on another build meets (the executor stops the run ``cannot_migrate`` with
    this message as the reason: docs/runtime.md, "Codec versions")."""


def encode(value: Any, *, blobs: BlobStore | None = None, threshold: int = DEFAULT_THRESHOLD) -> Payload:
    """Encode a JSON-compatible ``value`` (dict, list, str, int, bool, None) as a Payload.

    With a ``blobs`` store, an encoding longer than ``threshold`` bytes is written there
    and the payload holds its pointer. Raises :class:`CodecError` naming the offending
    type for anything else; floats are refused too (money is integer minor units;
    durable state must compare exactly).
    """
    return _encode_read(value, blobs=blobs, threshold=threshold)[0]


def _encode_read(value: Any, *, blobs: BlobStore | None = None, threshold: int = DEFAULT_THRESHOLD) -> tuple[Payload, Any]:
    """:func:`encode`, and the value :func:`decode` gives for the payload (a new object,
    shared with nothing: a caller may cache it instead of decoding the payload again).

    The durability check is the read itself: the canonical text is parsed back by a
    parser that refuses floats, NaN and infinities, and the result must equal ``value``
    (a non-str key, a tuple, a set, an object cannot round-trip). Only a value that fails
    is walked again, to name the offending part (:func:`_first_offence`)."""
    data, read = _canonical(value, "payload")
    if blobs is not None and len(data) > threshold:
        return Payload(codec=CODEC, format_version=FORMAT_VERSION, blob=blobs.put(data)), read
    return Payload(codec=CODEC, format_version=FORMAT_VERSION, inline=data), read


def encode_trusted(value: Any) -> Payload:
    """:func:`encode` without the durability check, for a value built only of parts that
    another payload's check (or this build's own constants) already passed: the executor's
    spawned specs, whose tool calls are the model node's output. Never for a value from
    outside the executor (a tool's result, a state field). A value the encoder cannot
    take at all (an object) still raises the :class:`CodecError` naming it; a float
    gets through, for the check of the payload it came from to refuse."""
    try:
        data = _dump_bytes(value)
    except (TypeError, ValueError):
        _canonical(value, "payload")  # raises, naming the offence
        raise
    return Payload(codec=CODEC, format_version=FORMAT_VERSION, inline=data)


encode_read = _encode_read  # a build that changes the wire format wraps the public name (scenarios/upgrades/wire.py)


class _NotDurable(ValueError):
    """Raised by the read-back parser at a float, NaN or infinity."""


def _refuse_number(text: str) -> Any:
    raise _NotDurable(text)


def _refuse_object(value: Any) -> Any:
    raise TypeError(type(value).__name__)


if _c_make_encoder is not None:  # CPython's C encoder, built once (json.dumps builds one a call)
    # markers=None: no cycle bookkeeping; a cyclic value ends in RecursionError
    _c_dump = _c_make_encoder(None, _refuse_object, _json_encoder.encode_basestring_ascii, None, ":", ",",
                              True, False, True)

    def _dump(value: Any) -> str:
        """The canonical text, as ``json.dumps(value, sort_keys=True, separators=(",", ":"))``."""
        return "".join(_c_dump(value, 0))
else:  # pragma: no cover - an interpreter without the C accelerator
    def _dump(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_refuse_object)

try:  # a C encoder a few times faster than the json module's; its text is the same for ASCII
    from orjson import OPT_SORT_KEYS as _ORJSON_SORT, dumps as _orjson_dumps
except ImportError:  # pragma: no cover - without it, the json module's encoder does it all
    _orjson_dumps = None


def _dump_bytes(value: Any) -> bytes:
    """``_dump(value).encode()``, byte for byte. orjson writes the same canonical text as
    ``json.dumps(sort_keys=True, separators=(",", ":"))`` when it is printable ASCII (the
    json module escapes every other character, orjson writes it as UTF-8, and both write
    ``\\n``-style escapes for the control characters but for DEL, which only the json module
    escapes); anything else (non-ASCII text, DEL, a value orjson refuses: an integer
    beyond 64 bits, a non-str key, a lone surrogate, an unknown object) goes through the
    json module's encoder, which raises what it raised before. What orjson accepts that
    the json module would not (a dataclass, a datetime) cannot pass the read-back check
    (:func:`_canonical`: the text read back must equal the value)."""
    if _orjson_dumps is not None:
        try:
            data = _orjson_dumps(value, option=_ORJSON_SORT)
        except TypeError:  # orjson.JSONEncodeError
            pass
        else:
            # find, not ``in``: ``bytes.__contains__`` tries its argument as an int first,
            # building and dropping a TypeError for every bytes argument
            if data.isascii() and data.find(b"\x7f") < 0:
                return data
    return _dump(value).encode()


_STRICT_SCAN = json.JSONDecoder(parse_float=_refuse_number, parse_constant=_refuse_number).scan_once
_SCAN = json.JSONDecoder().scan_once


def _canonical(value: Any, where: str) -> tuple[bytes, Any]:
    """(canonical JSON bytes of ``value``, the value read back from them); raises the
    :class:`CodecError` naming the first offence (:func:`_first_offence`) when ``value``
    is not durable JSON (a cyclic value ends in ``RecursionError``)."""
    try:
        data = _dump_bytes(value)
        read, _ = _STRICT_SCAN(data.decode(), 0)
        if read == value:
            return data, read
    except (TypeError, ValueError):  # an object, a key sort across types, a float read back
        pass
    found = _first_offence(value, where)
    if found is None:
        raise AssertionError(f"the read-back check and _first_offence disagree on {where}")
    raise found


_SCALARS = frozenset({type(None), bool, int, str})


def _check_durable(value: Any, where: str) -> None:
    """Refuse what JSON would change or cannot hold: floats, non-string keys, objects
    (:func:`_canonical`'s read-back check; :func:`_durable` is the same check as a walk,
    kept as the reference the tests compare it with). A cyclic value ends in
    ``RecursionError``."""
    _canonical(value, where)


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


def _parse(data: bytes) -> Any:
    """``json.loads(data)``: the C scanner straight on canonical text (what this codec
    writes: UTF-8, no surrounding whitespace); anything else goes through ``json.loads``,
    which raises its own errors."""
    try:
        text = data.decode()
        value, end = _SCAN(text, 0)
        if end == len(text):
            return value
    except (StopIteration, ValueError):
        pass
    return json.loads(data)


def decode(payload: Payload, *, blobs: BlobStore | None = None) -> Any:
    """Decode a Payload written by this or an older build (applying upgraders).

    Raises :class:`UnreadablePayload` for an unknown codec, a newer format version, a
    version with no upgrader to the next one, or bytes that are not JSON;
    :class:`CodecError` for a blob pointer without a ``blobs`` store;
    :class:`~.blobs.BlobError` when the blob is missing or fails its hash check.
    """
    if payload.codec != CODEC:
        raise UnreadablePayload(f"payload codec={payload.codec!r} is unknown (expected {CODEC!r})")
    version = payload.format_version
    if version > FORMAT_VERSION:
        raise UnreadablePayload(
            f"payload format_version={version} is newer than this build's {FORMAT_VERSION}"
        )
    missing = [v for v in range(version, FORMAT_VERSION) if v not in UPGRADERS] if version != FORMAT_VERSION else None
    if missing:  # refused before anything is read: never half-upgraded
        raise UnreadablePayload(f"payload format_version={version}: this build ({FORMAT_VERSION}) has no upgrader "
                                f"from version {missing[0]} to {missing[0] + 1}")
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
        value = _parse(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnreadablePayload(f"payload is not valid JSON: {exc}") from None
    while version < FORMAT_VERSION:
        value = UPGRADERS[version](value)
        version += 1
    return value
