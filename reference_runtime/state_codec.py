"""State codec: the schema of what a run checkpoints besides its transcript.

Tools may keep values on the run's state (``ToolContext.state``): a cart, a cursor, a
client. What a node set is written with its log record (``NodeRecord.state``) and
folded back, in ``seq`` order, on rehydrate. This module decides what may be written.

Failures it prevents (docs/design.md, "State codec"; seed 000, wall 1):

- **A live object on the state** (an HTTP client, a logger, a tokenizer, a DB session)
  either crashes the checkpoint far from the code that put it there or, worse, gets
  pickled and "restored" as a dead socket. Here every field is in one of two sets: a
  *registered* field has an encoder and a decoder to durable JSON; a *transient* field
  is never written and is rebuilt on load by its registered factory. A field in neither
  set fails **at write time** with :class:`UnknownStateField` naming the field and its
  type, in the node that set it.
- **A build that cannot read its predecessor's checkpoints**: every encoded state
  carries the schema's name and format version; ``upgraders[n]`` turns a version-``n``
  document into version ``n + 1`` on read, so a run written by an older build resumes on
  a newer one; a document newer than the build, or for another schema, is refused with
  a clear error instead of being misread.
- **Pickle**: nothing here (or anywhere in the runtime) pickles; encoders produce
  canonical JSON through :mod:`.codec` (floats and objects refused), and a test scans the
  runtime's sources for pickle use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import codec
from .blobs import DEFAULT_THRESHOLD, BlobStore
from .records_pb2 import Payload


class StateCodecError(codec.CodecError):
    """A state document cannot be encoded or decoded; the message names the field."""


class UnknownStateField(StateCodecError):
    """A node set a state field that is neither registered nor declared transient."""


class UnreadableState(StateCodecError, codec.UnreadablePayload):
    """A state document this build cannot read (another schema, a newer version, no
    upgrader, a field it does not register): a payload it cannot migrate."""


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class FieldCodec:
    """How one field becomes durable JSON (``encode``) and back (``decode``)."""

    encode: Callable[[Any], Any] = _same
    decode: Callable[[Any], Any] = _same


JSON_FIELD = FieldCodec()
"""A field whose value already is durable JSON (dict, list, str, int, bool, None)."""

Factory = Callable[[Any], Any]
"""Builds a transient field's value from the workload's resources (``Agent.resources``)."""


class StateSchema:
    """The registry of one agent's state: field codecs, transient factories, upgraders.

    >>> schema = StateSchema("shop", version=1)
    >>> schema.field("cart")
    >>> schema.transient("inventory", lambda resources: InventoryClient(resources))
    """

    def __init__(self, name: str, version: int = 1) -> None:
        if version < 1:
            raise ValueError(f"schema {name!r}: version must be >= 1, got {version}")
        self.name = name
        self.version = version
        self.fields: dict[str, FieldCodec] = {}
        self.factories: dict[str, Factory] = {}
        self.upgraders: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}

    # -- declaration ---------------------------------------------------------------------

    def field(self, name: str, field_codec: FieldCodec = JSON_FIELD) -> None:
        """Register a durable field."""
        if name in self.factories:
            raise ValueError(f"schema {self.name!r}: field {name!r} is already declared transient")
        self.fields[name] = field_codec

    def transient(self, name: str, factory: Factory) -> None:
        """Declare a field that is never written and is rebuilt by ``factory(resources)``."""
        if name in self.fields:
            raise ValueError(f"schema {self.name!r}: field {name!r} is already registered as durable")
        self.factories[name] = factory

    def upgrader(self, from_version: int) -> Callable[[Callable[[dict[str, Any]], dict[str, Any]]], Callable[[dict[str, Any]], dict[str, Any]]]:
        """Decorator: register the function turning a ``from_version`` document's fields
        into ``from_version + 1``'s."""

        def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
            self.upgraders[from_version] = fn
            return fn

        return register

    # -- write ---------------------------------------------------------------------------

    def encode(self, updates: Mapping[str, Any], *, blobs: BlobStore | None = None,
               threshold: int = DEFAULT_THRESHOLD) -> Payload | None:
        """Encode the fields a node set; ``None`` when only transient fields (or none)
        were set. Raises :class:`UnknownStateField` for an undeclared field and
        :class:`StateCodecError` when an encoder returns something not durable."""
        out: dict[str, Any] = {}
        for name in sorted(updates):
            value = updates[name]
            if name in self.factories:
                continue
            field_codec = self.fields.get(name)
            if field_codec is None:
                raise UnknownStateField(
                    f"state field {name!r} (a {type(value).__module__}.{type(value).__qualname__}) is neither "
                    f"registered nor declared transient in state schema {self.name!r}; register it with a codec "
                    f"(schema.field) or declare it transient with a factory (schema.transient)"
                )
            out[name] = field_codec.encode(value)
        if not out:
            return None
        try:  # one durability check for the document (the codec's read-back)...
            return codec.encode({"schema": self.name, "version": self.version, "fields": out}, blobs=blobs,
                                threshold=threshold)
        except codec.CodecError:
            for name, encoded in out.items():  # ...and only when it refuses, one per field, to name it
                try:
                    codec._check_durable(encoded, f"state field {name!r}")
                except codec.CodecError as exc:
                    raise StateCodecError(str(exc)) from None
            raise

    # -- read ----------------------------------------------------------------------------

    def decode(self, payload: Payload, *, blobs: BlobStore | None = None) -> dict[str, Any]:
        """The durable fields in ``payload`` (upgraded to this schema's version, decoded)."""
        doc = codec.decode(payload, blobs=blobs)
        if not isinstance(doc, dict) or doc.get("schema") != self.name:
            got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise UnreadableState(f"state document belongs to schema {got!r}, not {self.name!r}")
        version = doc.get("version")
        if not isinstance(version, int) or version < 1:
            raise UnreadableState(f"state document of schema {self.name!r} has no valid version ({version!r})")
        if version > self.version:
            raise UnreadableState(
                f"state document of schema {self.name!r} has version {version}, newer than this build's {self.version}"
            )
        fields: dict[str, Any] = doc.get("fields", {})
        while version < self.version:
            upgrade = self.upgraders.get(version)
            if upgrade is None:
                raise UnreadableState(f"schema {self.name!r}: no upgrader from version {version} to {version + 1}")
            fields = upgrade(dict(fields))
            version += 1
        out: dict[str, Any] = {}
        for name, value in fields.items():
            field_codec = self.fields.get(name)
            if field_codec is None:
                raise UnreadableState(
                    f"state document of schema {self.name!r} v{self.version} holds field {name!r}, which this build "
                    f"does not register (add an upgrader that renames or drops it)"
                )
            out[name] = field_codec.decode(value)
        return out

    def rebuild(self, resources: Any) -> dict[str, Any]:
        """Fresh values of every transient field (called on every load)."""
        return {name: factory(resources) for name, factory in self.factories.items()}


def fold(schema: StateSchema | None, payloads: Iterable[Payload], *, blobs: BlobStore | None = None) -> dict[str, Any]:
    """The durable state after applying each node's updates in ``seq`` order."""
    state: dict[str, Any] = {}
    for payload in payloads:
        if schema is None:
            raise UnreadableState("the log holds state updates but the agent declares no state schema")
        state.update(schema.decode(payload, blobs=blobs))
    return state


class TrackedState(dict[str, Any]):
    """The state a tool sees: a dict that remembers which fields were set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.changed: set[str] = set()

    def __setitem__(self, key: str, value: Any) -> None:
        self.changed.add(key)
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def updates(self) -> dict[str, Any]:
        return {k: self[k] for k in sorted(self.changed) if k in self}
