"""The toxic types, and the registry that maps a type name to its class.

A toxic is one small interface, as in Toxiproxy (``toxics/toxic.go``): an object whose
public dataclass fields are its JSON ``attributes``, with one coroutine
``pipe(stub)`` that moves chunks from ``stub`` input to output until end of stream
(then ``stub.close()``) or until interrupted. Optional abilities are separate:

* ``buffer_size`` (class attribute): capacity of the stage's input channel (latency: 1024);
* :class:`Stateful`: ``new_state()`` gives per-connection state kept across restarts;
* :class:`Cleanup`: ``cleanup(stub)`` runs when the toxic is removed from a live link;
* ``validate()``: refuse attribute values that crash Toxiproxy (our divergence: 400).

Units are Toxiproxy's: milliseconds, except ``slicer.delay`` (microseconds);
``bandwidth.rate`` is KB/s with KB = 1000 bytes. Semantics follow spec §2.2.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypeVar

from ._gojson import StructField
from ._stream import Chunk, Interrupted, ToxicStub

__all__ = [
    "Cleanup",
    "InvalidAttributes",
    "NOOP",
    "Stateful",
    "TOXIC_TYPES",
    "Toxic",
    "attributes_of",
    "new_toxic",
    "register",
]

_INT64_MAX = 2**63 - 1


class InvalidAttributes(ValueError):
    """Attribute values the embedded server refuses (Toxiproxy would crash on them)."""


class Toxic:
    """Base of every toxic type. Subclasses are dataclasses; fields are attributes."""

    #: Registered type name (``latency``).
    type_name: ClassVar[str] = ""
    #: Go struct name, used in decode error messages (``LatencyToxic``).
    go_name: ClassVar[str] = ""
    #: Capacity of this stage's input channel.
    buffer_size: ClassVar[int] = 0

    async def pipe(self, stub: ToxicStub) -> None:  # pragma: no cover - abstract
        """Move chunks from ``stub`` input to output until end of stream (then
        ``stub.close()``) or until :class:`Interrupted` (then return, holding nothing)."""
        raise NotImplementedError

    def validate(self) -> None:
        """Raise :class:`InvalidAttributes` for values the server must refuse."""


class Stateful:
    """Ability: per-connection state that survives interrupts (limit_data)."""

    def new_state(self) -> Any:  # pragma: no cover - abstract
        """Fresh state for one link; stored on the stub as ``stub.state``."""
        raise NotImplementedError


class Cleanup:
    """Ability: run when the toxic is removed from a live link (timeout closes it)."""

    def cleanup(self, stub: ToxicStub) -> None:  # pragma: no cover - abstract
        """Called on the interrupted stage; may ``stub.close()`` instead of relinking."""
        raise NotImplementedError


#: Registered toxic classes by type name.
TOXIC_TYPES: dict[str, type[Toxic]] = {}

_T = TypeVar("_T", bound=type[Toxic])


def register(type_name: str, go_name: str) -> Callable[[_T], _T]:
    """Class decorator: register a toxic dataclass under ``type_name``."""

    def deco(cls: _T) -> _T:
        cls.type_name = type_name
        cls.go_name = go_name
        TOXIC_TYPES[type_name] = cls
        return cls

    return deco


def new_toxic(type_name: str) -> Toxic | None:
    """A fresh toxic of ``type_name`` with every attribute zero, or None if unknown."""
    cls = TOXIC_TYPES.get(type_name)
    return None if cls is None else cls()


def attributes_of(toxic: Toxic) -> dict[str, int]:
    """The toxic's attributes in declaration order (Go emits every field)."""
    return {f.name: getattr(toxic, f.name) for f in dataclasses.fields(toxic)}  # type: ignore[arg-type]


def struct_fields(cls: type[Toxic]) -> tuple[StructField, ...]:
    """Decoder description of ``cls``'s attribute fields."""
    return tuple(StructField(f.name, f.metadata.get("go", "int64"))
                 for f in dataclasses.fields(cls))  # type: ignore[arg-type]


def with_attributes(toxic: Toxic, values: dict[str, Any]) -> Toxic:
    """A copy of ``toxic`` with ``values`` applied (merge semantics)."""
    updated = copy.copy(toxic)
    for k, v in values.items():
        setattr(updated, k, v)
    return updated


def _int64(go: str = "int64") -> Any:
    return field(default=0, metadata={"go": go})


def _ms(value: int) -> float:
    return value / 1000.0


@register("noop", "NoopToxic")
@dataclass
class NoopToxic(Toxic):
    """Pass-through. Also the hidden head stage of every chain."""

    async def pipe(self, stub: ToxicStub) -> None:
        while True:
            c = await stub.recv()
            if c is None:
                stub.close()
                return
            await stub.send(c)


NOOP = NoopToxic()


@register("latency", "LatencyToxic")
@dataclass
class LatencyToxic(Toxic):
    """Delay each chunk to read time + latency ± jitter (ms); pipelined, stacks."""

    latency: int = _int64()
    jitter: int = _int64()
    buffer_size: ClassVar[int] = 1024

    def validate(self) -> None:
        # Go computes rand.Int63n(jitter*2): above this the product overflows and panics.
        if self.jitter > _INT64_MAX // 2:
            raise InvalidAttributes(
                f"jitter={self.jitter!r} must be <= {_INT64_MAX // 2} (Toxiproxy overflows and crashes)")

    def _delay(self, stub: ToxicStub) -> float:
        delay = self.latency
        if self.jitter > 0:
            delay += stub.rng.randrange(self.jitter * 2) - self.jitter
        return _ms(delay)

    async def pipe(self, stub: ToxicStub) -> None:
        while True:
            c = await stub.recv()
            if c is None:
                stub.close()
                return
            sleep = self._delay(stub) - (stub.now() - c.ts)
            try:
                await stub.sleep(sleep)
            except Interrupted:
                await stub.send(c)  # released at once, never dropped
                raise
            c.ts += sleep
            await stub.send(c)


@register("bandwidth", "BandwidthToxic")
@dataclass
class BandwidthToxic(Toxic):
    """Pace the direction to ``rate`` KB/s (KB = 1000 bytes); 0 stalls it."""

    rate: int = _int64()

    def validate(self) -> None:
        if self.rate < 0:
            raise InvalidAttributes(
                f"rate={self.rate!r} must be >= 0 (Toxiproxy panics on a negative rate)")

    async def pipe(self, stub: ToxicStub) -> None:
        sleep_ns = 0
        while True:
            p = await stub.recv()
            if p is None:
                stub.close()
                return
            rate = self.rate
            if rate <= 0:
                sleep_ns = 0
                if p.data:
                    # Go loops forever emitting empty slices every 100 ms: a stall.
                    try:
                        await stub.wait_interrupt()
                    except Interrupted:
                        await stub.send(p)
                        raise
                continue
            sleep_ns += len(p.data) * 1_000_000 // rate
            step = rate * 100
            while len(p.data) > step:
                try:
                    await stub.sleep(0.1)
                except Interrupted:
                    await stub.send(p)
                    raise
                await stub.send(Chunk(p.data[:step], p.ts))
                p.data = p.data[step:]
                sleep_ns -= 100_000_000
            start = stub.now()
            try:
                await stub.sleep(sleep_ns / 1e9)
            except Interrupted:
                await stub.send(p)
                raise
            # Timers are imprecise: carry the error into the next chunk's sleep.
            sleep_ns -= int((stub.now() - start) * 1e9)
            await stub.send(p)


@register("slow_close", "SlowCloseToxic")
@dataclass
class SlowCloseToxic(Toxic):
    """Pass data untouched; hold the close back ``delay`` ms after end of stream."""

    delay: int = _int64()

    async def pipe(self, stub: ToxicStub) -> None:
        while True:
            c = await stub.recv()
            if c is None:
                await stub.sleep(_ms(self.delay))
                stub.close()
                return
            await stub.send(c)


@register("timeout", "TimeoutToxic")
@dataclass
class TimeoutToxic(Toxic, Cleanup):
    """Drop all data; close after ``timeout`` ms with no chunk (0: never). Removal closes.

    Every arriving chunk restarts the idle timer, as does a restart of the stage. End
    of stream is dropped like data (Toxiproxy spins on the closed channel, so its timer
    never fires afterwards): the stage then only waits to be removed or updated.
    """

    timeout: int = _int64()

    async def pipe(self, stub: ToxicStub) -> None:
        timeout = _ms(self.timeout)
        while True:
            c = await stub.recv(timeout) if timeout > 0 else await stub.recv()
            if c is ToxicStub.TIMEOUT:
                stub.close()
                return
            if c is None:
                await stub.wait_interrupt()
            # else: the chunk is dropped on the ground

    def cleanup(self, stub: ToxicStub) -> None:
        # The stream lost bytes: close it rather than resume (PR #168).
        stub.close()


@register("reset_peer", "ResetToxic")
@dataclass
class ResetPeerToxic(Toxic):
    """On the first chunk (or EOF) in its direction, wait ``timeout`` ms, then close.

    The close is an RST when SO_LINGER=0 was set on the connection (see
    ``FaultProxyServer(reset_peer_linger=...)``); the triggering chunk and all later
    ones are dropped. The wait cannot be interrupted.
    """

    timeout: int = _int64()

    async def pipe(self, stub: ToxicStub) -> None:
        await stub.recv()
        stub.committed = True
        if stub.link is not None:
            stub.link.reset_peer_firing()
        delay = _ms(self.timeout)
        if delay > 0:
            await asyncio.sleep(delay)
        stub.close()


@register("slicer", "SlicerToxic")
@dataclass
class SlicerToxic(Toxic):
    """Split chunks into pieces of about ``average_size`` ± ``size_variation`` bytes,
    ``delay`` microseconds apart."""

    average_size: int = _int64("int")
    size_variation: int = _int64("int")
    delay: int = _int64("int")

    def validate(self) -> None:
        avg, var = self.average_size, self.size_variation
        if var < 0:
            raise InvalidAttributes(f"size_variation={var!r} must be >= 0")
        if avg <= 0:
            raise InvalidAttributes(
                f"average_size={avg!r} must be >= 1 (Toxiproxy recurses forever and crashes)")
        if var > avg:
            raise InvalidAttributes(
                f"size_variation={var!r} must be <= average_size={avg!r} "
                "(Toxiproxy slices out of range and crashes)")

    def _bounds(self, stub: ToxicStub, size: int) -> list[tuple[int, int]]:
        avg, var = self.average_size, self.size_variation
        out: list[tuple[int, int]] = []
        stack = [(0, size)]
        while stack:  # depth-first, left before right: the recursion's order
            start, end = stack.pop()
            if (end - start) - avg <= var:
                out.append((start, end))
                continue
            mid = start + (end - start) // 2
            if var > 0:
                mid += stub.rng.randrange(var * 2) - var
            stack.append((mid, end))
            stack.append((start, mid))
        return out

    async def pipe(self, stub: ToxicStub) -> None:
        delay = self.delay / 1e6
        while True:
            c = await stub.recv()
            if c is None:
                stub.close()
                return
            for a, b in self._bounds(stub, len(c.data)):
                if b > a:
                    await stub.send(Chunk(c.data[a:b], c.ts))
                try:
                    await stub.sleep(delay)
                except Interrupted:
                    if b < len(c.data):
                        await stub.send(Chunk(c.data[b:], c.ts))
                    raise


class _LimitState:
    __slots__ = ("transmitted",)

    def __init__(self) -> None:
        self.transmitted = 0


@register("limit_data", "LimitDataToxic")
@dataclass
class LimitDataToxic(Toxic, Stateful):
    """Forward at most ``bytes`` bytes per connection in this direction, then close."""

    bytes: int = _int64()

    def new_state(self) -> _LimitState:
        return _LimitState()

    async def pipe(self, stub: ToxicStub) -> None:
        state = stub.state
        if not isinstance(state, _LimitState):
            state = stub.state = _LimitState()
        remaining = self.bytes - state.transmitted
        while True:
            c = await stub.recv()
            if c is None:
                stub.close()
                return
            if remaining < 0:
                remaining = 0
            if remaining < len(c.data):
                c = Chunk(c.data[:remaining], c.ts)
            if c.data:
                await stub.send(c)
                state.transmitted += len(c.data)
            remaining = self.bytes - state.transmitted
            if remaining <= 0:
                stub.close()
                return
