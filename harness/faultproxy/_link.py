"""Links (one direction of one connection) and a proxy's toxic collection.

As in Toxiproxy's ``link.go`` and ``toxic_collection.go`` (spec §2.1, §2.3)::

    socket ──read──► [noop] ─► [toxic 1] ─► … ─► [toxic N] ──write──► other socket
                     hidden head     the direction's toxics, insertion order

* Adding a toxic appends a stage to every live link of its direction: the previous last
  stage is interrupted, its output rewired to the new stage, and restarted (so its
  toxicity is re-rolled and its timers restart).
* Updating interrupts that stage on every live link and restarts it with the new values.
* Removing interrupts the stage (a ``Cleanup`` toxic — timeout — then closes the link
  instead), interrupts the stage before it, moves what the removed stage still held
  downstream, rewires, and restarts the previous stage. No byte is dropped or reordered.
* When the chain's output ends, the writer closes the destination socket completely.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._gojson import Float32
from ._stream import READ_SIZE, Channel, Chunk, ToxicStub
from ._toxics import NOOP, Cleanup, Stateful, Toxic, attributes_of

if TYPE_CHECKING:  # pragma: no cover
    from ._proxy import Connection, Proxy

__all__ = ["Direction", "ToxicCollection", "ToxicLink", "ToxicWrapper", "parse_direction"]

log = logging.getLogger("crashmatrix.harness.faultproxy")


class Direction(enum.IntEnum):
    """``upstream`` carries client → server bytes; ``downstream`` server → client."""

    UPSTREAM = 0
    DOWNSTREAM = 1

    def __str__(self) -> str:
        return self.name.lower()


def parse_direction(stream: str) -> Direction | None:
    """Toxiproxy's case-insensitive ``stream`` parsing; None when invalid (also ``""``)."""
    low = stream.lower()
    if low == "upstream":
        return Direction.UPSTREAM
    if low == "downstream":
        return Direction.DOWNSTREAM
    return None


@dataclass(eq=False)
class ToxicWrapper:
    """A toxic as the API knows it: the attribute object plus name, stream, toxicity."""

    toxic: Toxic
    name: str
    type: str
    stream: str
    toxicity: float
    direction: Direction
    hidden: bool = False

    @property
    def buffer_size(self) -> int:
        return self.toxic.buffer_size

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": attributes_of(self.toxic),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": Float32(self.toxicity),
        }


class ToxicLink:
    """One direction of one connection: reader, chain of stages, writer."""

    def __init__(self, collection: "ToxicCollection", conn: "Connection", direction: Direction,
                 source: asyncio.StreamReader, dest: asyncio.StreamWriter) -> None:
        self.collection = collection
        self.conn = conn
        self.direction = direction
        self.source = source
        self.dest = dest
        self.dead = False
        self.received = 0
        self.sent = 0
        rng = collection.rng
        chain = collection.chain[direction]
        self.stubs: list[ToxicStub] = []
        last = Channel(1)
        self.input = last
        for i, wrapper in enumerate(chain):
            nxt = Channel(chain[i + 1].buffer_size) if i + 1 < len(chain) else Channel(1)
            stub = ToxicStub(last, nxt, rng=rng, link=self)
            stub.wrapper = wrapper
            self.stubs.append(stub)
            last = nxt
        self.output = last
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read())
        for stub in self.stubs:
            wrapper = stub.wrapper
            assert wrapper is not None
            if isinstance(wrapper.toxic, Stateful):
                stub.state = wrapper.toxic.new_state()
            stub.run(wrapper)
        self._writer = loop.create_task(self._write())

    def cancel(self) -> None:
        for task in (self._reader, self._writer):
            if task is not None and not task.done() and task is not asyncio.current_task():
                task.cancel()
        for stub in self.stubs:
            if stub.task is not asyncio.current_task():
                stub.cancel()

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.source.read(READ_SIZE)
                if not data:
                    break
                self.received += len(data)
                await self.input.put(Chunk(data, loop.time()))
        except (ConnectionError, OSError):
            pass
        finally:
            self.input.close()

    async def _write(self) -> None:
        dest = self.dest
        ok = True
        try:
            while True:
                chunk = await self.output.get()
                if chunk is None:
                    break
                if not chunk.data:
                    continue
                dest.write(chunk.data)
                await dest.drain()
                self.sent += len(chunk.data)
        except (ConnectionError, OSError):
            ok = False
        finally:
            # Go: dest.Close() — the whole socket, not a half-close.
            try:
                dest.close()
            except Exception:  # pragma: no cover - transport already gone
                pass
            self.dead = True
            self.conn.link_finished(self, ok)

    # -- signals from stages -----------------------------------------------------------

    def reset_peer_firing(self) -> None:
        self.conn.reset_peer_firing()

    # -- chain edits (called with the collection lock held) ------------------------------

    def _index(self, wrapper: ToxicWrapper) -> int:
        for i, stub in enumerate(self.stubs):
            if stub.wrapper is wrapper:
                return i
        return -1

    async def add_toxic(self, wrapper: ToxicWrapper) -> None:
        prev = self.stubs[-1]
        newin = Channel(wrapper.buffer_size)
        stub = ToxicStub(newin, prev.output, rng=self.collection.rng, link=self)
        stub.wrapper = wrapper
        self.stubs.append(stub)
        if await prev.interrupt():
            prev.output = newin
            if isinstance(wrapper.toxic, Stateful):
                stub.state = wrapper.toxic.new_state()
            stub.run(wrapper)
            assert prev.wrapper is not None
            prev.run(prev.wrapper)
        else:
            # The link is already closing: the new stage just forwards the close.
            stub.output = newin
            stub.close()

    async def update_toxic(self, wrapper: ToxicWrapper) -> None:
        i = self._index(wrapper)
        if i < 0:
            return
        stub = self.stubs[i]
        if await stub.interrupt():
            stub.run(wrapper)

    async def remove_toxic(self, wrapper: ToxicWrapper) -> None:
        i = self._index(wrapper)
        if i <= 0:
            return
        stub = self.stubs[i]
        if not await stub.interrupt():
            return
        if isinstance(wrapper.toxic, Cleanup):
            wrapper.toxic.cleanup(stub)
            if stub.closed:
                return
        prev = self.stubs[i - 1]
        await prev.interrupt()
        # Move what the removed stage still held (its input queue) downstream.
        while len(stub.input):
            stub.output.push(stub.input.pop())
        if stub.input.closed:
            # The previous stage has closed: propagate end of stream.
            stub.close()
            return
        prev.output = stub.output
        del self.stubs[i]
        assert prev.wrapper is not None
        prev.run(prev.wrapper)


class ToxicCollection:
    """A proxy's toxics: one chain per direction (hidden noop first) and its live links."""

    def __init__(self, proxy: "Proxy", rng: random.Random) -> None:
        self.proxy = proxy
        self.rng = rng
        self.noop = ToxicWrapper(NOOP, "", "noop", "", 1.0, Direction.UPSTREAM, hidden=True)
        self.chain: list[list[ToxicWrapper]] = [[self.noop], [self.noop]]
        self.links: set[ToxicLink] = set()
        self.lock = asyncio.Lock()

    # -- queries ----------------------------------------------------------------------

    def find(self, name: str) -> ToxicWrapper | None:
        for chain in self.chain:
            for wrapper in chain[1:]:
                if wrapper.name == name:
                    return wrapper
        return None

    def toxics(self) -> list[ToxicWrapper]:
        """Upstream toxics first, then downstream; insertion order within each."""
        return [w for chain in self.chain for w in chain[1:]]

    def has_type(self, type_name: str) -> bool:
        return any(w.type == type_name for w in self.toxics())

    # -- edits (caller holds self.lock) ----------------------------------------------------

    def _links(self, direction: Direction) -> list[ToxicLink]:
        return [link for link in self.links if link.direction == direction and not link.dead]

    async def add(self, wrapper: ToxicWrapper) -> None:
        self.chain[wrapper.direction].append(wrapper)
        links = self._links(wrapper.direction)
        if links:
            await asyncio.gather(*(link.add_toxic(wrapper) for link in links))

    async def update(self, wrapper: ToxicWrapper) -> None:
        links = self._links(wrapper.direction)
        if links:
            await asyncio.gather(*(link.update_toxic(wrapper) for link in links))

    async def remove(self, wrapper: ToxicWrapper) -> None:
        chain = self.chain[wrapper.direction]
        chain.remove(wrapper)
        links = self._links(wrapper.direction)
        if links:
            await asyncio.gather(*(link.remove_toxic(wrapper) for link in links))

    async def reset(self) -> None:
        for direction in Direction:
            while len(self.chain[direction]) > 1:
                await self.remove(self.chain[direction][1])

    # -- links ------------------------------------------------------------------------

    def start_link(self, conn: "Connection", direction: Direction,
                   source: asyncio.StreamReader, dest: asyncio.StreamWriter) -> ToxicLink:
        link = ToxicLink(self, conn, direction, source, dest)
        self.links.add(link)
        link.start()
        return link

    def remove_link(self, link: ToxicLink) -> None:
        self.links.discard(link)
