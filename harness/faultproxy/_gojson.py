"""Go ``encoding/json`` behaviour, as far as Toxiproxy's HTTP API exposes it.

Toxiproxy decodes request bodies with ``json.NewDecoder(body).Decode(&v)`` and encodes
replies with ``json.Marshal``. Clients see the consequences, so the embedded server
reproduces them (spec §1.1, §1.2):

* only the first JSON value is read; trailing garbage is ignored; an empty body is ``EOF``;
* object keys match struct fields exactly, else case-insensitively; unknown keys are
  ignored; a repeated key is applied again (the last one wins, nested objects merge);
* ``null`` leaves a field unchanged;
* a type mismatch does not stop decoding: the *first* mismatch is reported, worded as Go
  words it (``json: cannot unmarshal string into Go struct field
  LatencyToxic.attributes.latency of type int64``); integer fields reject fractions and
  out-of-range numbers (``number 100.5``);
* syntax errors are reported with Go's wording (``invalid character 'x' looking for
  beginning of value``, ``unexpected EOF``).

Encoding follows ``json.Marshal``: compact, ``<``, ``>`` and ``&`` escaped, float32 values
in their shortest form (``1``, ``0.5``). Objects are plain ``dict`` in key order.

Divergence (documented in docs/faultproxy.md): a body with a type mismatch is rejected
whole; Go may already have stored the well-typed fields of an updated toxic.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Mapping, Sequence

__all__ = [
    "Float32",
    "GoJSONError",
    "JObject",
    "Num",
    "StructField",
    "decode",
    "decode_struct",
    "dumps",
    "float32",
    "format_float32",
]


class GoJSONError(Exception):
    """A body Go's decoder would refuse; ``str(err)`` is Go's ``err.Error()``."""


class Num(str):
    """A JSON number kept as its literal text (Go converts it per target type)."""


class JObject(list):
    """A JSON object as its ``(key, value)`` pairs in document order, repeats kept."""


class Float32(float):
    """A float encoded the way Go encodes a ``float32`` (shortest round-trip form)."""


# --------------------------------------------------------------------------- decoding

_WS = " \t\n\r"
_SURROGATE = re.compile("[\ud800-\udfff]")


class _BadConstant(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _reject_constant(name: str) -> Any:
    raise _BadConstant(name)


def _pairs(pairs: list[tuple[str, Any]]) -> JObject:
    return JObject((_clean(k), v) for k, v in pairs)


def _clean(s: str) -> str:
    # Go replaces invalid UTF-16 surrogate escapes with U+FFFD; Python keeps them.
    return _SURROGATE.sub("\ufffd", s) if _SURROGATE.search(s) else s


def _parse_string_values(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, Num):
        return _clean(value)
    if isinstance(value, JObject):
        return JObject((k, _parse_string_values(v)) for k, v in value)
    if isinstance(value, list):
        return [_parse_string_values(v) for v in value]
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs,
    parse_int=Num,
    parse_float=Num,
    parse_constant=_reject_constant,
    strict=True,
)


def decode(body: bytes | str) -> Any:
    """Decode the first JSON value of ``body`` as Go's streaming decoder does.

    Objects come back as :class:`JObject`, numbers as :class:`Num`. Raises
    :class:`GoJSONError` with Go's message (``EOF`` for an empty body).
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    i = 0
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    if i == n:
        raise GoJSONError("EOF")
    try:
        value, _end = _DECODER.raw_decode(text, i)
    except json.JSONDecodeError as exc:
        raise GoJSONError(_syntax_message(exc, text)) from None
    except _BadConstant as exc:
        if exc.name.startswith("-"):
            raise GoJSONError("invalid character 'I' in numeric literal") from None
        raise GoJSONError(
            f"invalid character {_quote_char(exc.name[0])} looking for beginning of value"
        ) from None
    except RecursionError:
        raise GoJSONError("exceeded max depth") from None
    return _parse_string_values(value)


def _quote_char(c: str) -> str:
    """Go's ``quoteChar``: quote the first *byte* of ``c``."""
    b = c.encode("utf-8", errors="replace")[0]
    if b == 0x27:
        return "'\\''"
    if b == 0x22:
        return "'\"'"
    ch = chr(b)
    specials = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                "\t": "\\t", "\v": "\\v", "\\": "\\\\"}
    if ch in specials:
        return f"'{specials[ch]}'"
    if b < 0x20 or b == 0x7F:
        return f"'\\x{b:02x}'"
    if 0x80 <= b < 0xA0 or b == 0xAD:
        return f"'\\u{b:04x}'"
    return f"'{ch}'"


def _container_at(text: str, pos: int) -> str:
    stack: list[str] = []
    in_str = esc = False
    for ch in text[:pos]:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _syntax_message(exc: json.JSONDecodeError, text: str) -> str:
    msg, pos = exc.msg, exc.pos
    if msg.startswith("Unterminated string") or pos >= len(text):
        return "unexpected EOF"
    c = text[pos]
    if msg.startswith("Invalid control character"):
        return f"invalid character {_quote_char(c)} in string literal"
    if msg.startswith("Invalid \\uXXXX escape"):
        for k in range(pos + 1, pos + 5):
            if k >= len(text):
                return "unexpected EOF"
            if text[k] not in "0123456789abcdefABCDEF":
                return f"invalid character {_quote_char(text[k])} in \\u hexadecimal character escape"
        return f"invalid character {_quote_char(c)} in string escape code"
    if msg.startswith("Invalid \\escape"):
        if pos + 1 >= len(text):
            return "unexpected EOF"
        return f"invalid character {_quote_char(text[pos + 1])} in string escape code"
    if msg.startswith("Expecting value"):
        if c == "-":
            if pos + 1 >= len(text):
                return "unexpected EOF"
            return f"invalid character {_quote_char(text[pos + 1])} in numeric literal"
        for lit in ("true", "false", "null"):
            if c == lit[0]:
                for k in range(1, len(lit)):
                    if pos + k >= len(text):
                        return "unexpected EOF"
                    if text[pos + k] != lit[k]:
                        return (f"invalid character {_quote_char(text[pos + k])} in literal "
                                f"{lit} (expecting {_quote_char(lit[k])})")
        return f"invalid character {_quote_char(c)} looking for beginning of value"
    if msg.startswith("Expecting property name"):
        return f"invalid character {_quote_char(c)} looking for beginning of object key string"
    if msg.startswith("Expecting ':'"):
        return f"invalid character {_quote_char(c)} after object key"
    if msg.startswith("Expecting ','"):
        where = "after object key:value pair" if _container_at(text, pos) == "{" else "after array element"
        return f"invalid character {_quote_char(c)} {where}"
    return f"invalid character {_quote_char(c)} looking for beginning of value"


# ----------------------------------------------------------------- typed struct decode

def kind_of(value: Any) -> str:
    """Go's name for the JSON kind of ``value`` in type errors."""
    if isinstance(value, JObject):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Num):
        return "number"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    return "null"


class _TypeMismatch(Exception):
    def __init__(self, value_desc: str, go_type: str) -> None:
        super().__init__(value_desc)
        self.value_desc = value_desc
        self.go_type = go_type


_INT_LITERAL = re.compile(r"-?[0-9]+\Z")
_INT_RANGES = {"int64": (-(2**63), 2**63 - 1), "int": (-(2**63), 2**63 - 1),
               "int32": (-(2**31), 2**31 - 1)}
_F32_MAX = 3.4028234663852886e38


def float32(x: float) -> float:
    """Round ``x`` to the nearest float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _as_string(value: Any, go_type: str) -> str:
    if isinstance(value, str) and not isinstance(value, Num):
        return value
    raise _TypeMismatch(kind_of(value), go_type)


def _as_bool(value: Any, go_type: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _TypeMismatch(kind_of(value), go_type)


def _as_int(value: Any, go_type: str) -> int:
    if isinstance(value, Num):
        lo, hi = _INT_RANGES.get(go_type, _INT_RANGES["int64"])
        if _INT_LITERAL.match(value):
            n = int(value)
            if lo <= n <= hi:
                return n
        raise _TypeMismatch(f"number {value}", go_type)
    if isinstance(value, bool) or value is None or isinstance(value, (str, list)):
        raise _TypeMismatch(kind_of(value), go_type)
    raise _TypeMismatch(kind_of(value), go_type)


def _as_float32(value: Any, go_type: str) -> float:
    if isinstance(value, Num):
        try:
            x = float(value)
        except ValueError:  # pragma: no cover - the scanner only yields valid literals
            raise _TypeMismatch(f"number {value}", go_type) from None
        if math.isinf(x) or abs(x) > _F32_MAX * (1 + 2**-25):
            raise _TypeMismatch(f"number {value}", go_type)
        try:
            return float32(x)
        except OverflowError:
            raise _TypeMismatch(f"number {value}", go_type) from None
    raise _TypeMismatch(kind_of(value), go_type)


_SCALARS: dict[str, Callable[[Any, str], Any]] = {
    "string": _as_string,
    "bool": _as_bool,
    "*bool": _as_bool,
    "int64": _as_int,
    "int": _as_int,
    "int32": _as_int,
    "float32": _as_float32,
}


@dataclass(frozen=True)
class StructField:
    """One field of a Go struct as the decoder sees it.

    ``go_type`` is a scalar (``string``, ``int64``, ``int``, ``float32``, ``bool``,
    ``*bool``) or a type name for a nested struct described by ``fields``/``struct``.
    A pointer field (``*bool``) is reset by ``null``; other fields ignore ``null``.
    """

    name: str
    go_type: str
    fields: tuple["StructField", ...] | None = None
    struct: str = ""


def _match_field(key: str, fields: Sequence[StructField]) -> StructField | None:
    for f in fields:
        if f.name == key:
            return f
    low = key.lower()
    for f in fields:
        if f.name.lower() == low:
            return f
    return None


def decode_struct(
    value: Any,
    fields: Sequence[StructField],
    *,
    struct_name: str,
    go_type: str,
    into: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], str | None]:
    """Decode ``value`` into a struct described by ``fields``.

    Returns ``(assignments, first_error)``: ``assignments`` maps field names to decoded
    values (nested structs map to nested dicts, merged across repeated keys; a ``null``
    pointer field maps to ``None``), and ``first_error`` is Go's message for the first
    type mismatch, or ``None``. ``into`` seeds the assignments (for merge updates).
    """
    out: dict[str, Any] = {} if into is None else into
    errors: list[str] = []
    if value is None:
        return out, None
    if not isinstance(value, JObject):
        return out, f"json: cannot unmarshal {kind_of(value)} into Go value of type {go_type}"
    _walk(value, fields, struct_name, (), out, errors)
    return out, (errors[0] if errors else None)


def _type_error(value_desc: str, go_type: str, struct_name: str, path: tuple[str, ...]) -> str:
    return (f"json: cannot unmarshal {value_desc} into Go struct field "
            f"{struct_name}.{'.'.join(path)} of type {go_type}")


def _walk(obj: JObject, fields: Sequence[StructField], struct_name: str,
          path: tuple[str, ...], out: dict[str, Any], errors: list[str]) -> None:
    for key, val in obj:
        f = _match_field(key, fields)
        if f is None:
            continue
        fpath = path + (f.name,)
        if val is None:
            if f.go_type.startswith("*"):
                out[f.name] = None
            continue
        if f.fields is not None:
            if not isinstance(val, JObject):
                errors.append(_type_error(kind_of(val), f.go_type, struct_name, fpath))
                continue
            nested = out.get(f.name)
            if not isinstance(nested, dict):
                nested = {}
                out[f.name] = nested
            _walk(val, f.fields, f.struct, fpath, nested, errors)
            continue
        conv = _SCALARS[f.go_type]
        try:
            out[f.name] = conv(val, f.go_type)
        except _TypeMismatch as exc:
            errors.append(_type_error(exc.value_desc, exc.go_type, struct_name, fpath))


# --------------------------------------------------------------------------- encoding

def format_float32(x: float) -> str:
    """Go's ``json.Marshal`` text for a float32 value ``x``."""
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    x = float32(x)
    text = ""
    for p in range(1, 10):
        text = f"{x:.{p - 1}e}"
        if float32(float(text)) == x:
            break
    d = Decimal(text).normalize()
    ax = abs(x)
    if ax < float32(1e-6) or ax >= 1e21:
        sign, digits, exponent = d.as_tuple()
        ds = "".join(map(str, digits))
        exp10 = int(exponent) + len(ds) - 1
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        es = f"{abs(exp10):02d}"
        if exp10 < 0 and es.startswith("0"):
            es = es[1:]
        return ("-" if sign else "") + mant + "e" + ("-" if exp10 < 0 else "+") + es
    return format(d, "f")


_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
            ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def _enc_str(s: str) -> str:
    out = json.dumps(_clean(s), ensure_ascii=False)
    for a, b in _ESCAPES:
        if a in out:
            out = out.replace(a, b)
    return out


def dumps(obj: Any) -> str:
    """Encode ``obj`` like Go's ``json.Marshal`` (dicts keep their key order)."""
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, Float32):
        return format_float32(obj)
    if isinstance(obj, int):
        return str(obj)
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, str):
        return _enc_str(obj)
    if isinstance(obj, Mapping):
        return "{" + ",".join(f"{_enc_str(str(k))}:{dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    raise TypeError(f"cannot encode {type(obj).__name__}")
