"""Embedded fault proxy: an asyncio server that speaks Toxiproxy's HTTP API.

The behaviour matched is Toxiproxy 2.12's, as written down in ``spec/toxiproxy.md``
(status codes, messages, JSON shapes, toxic semantics and units); where Toxiproxy
crashes on an attribute value the server answers 400 instead. ``docs/faultproxy.md``
lists every divergence.

Public surface:

* :func:`serve` — start a :class:`FaultProxyServer` in the running event loop;
* :class:`EmbeddedToxiproxy` — the same on a background thread, for synchronous code;
* :func:`main` — the ``crashmatrix toxiproxy-server`` command line
  (``python -m crashmatrix.harness.faultproxy``);
* :data:`TOXIC_TYPES` / :class:`Toxic` — the toxic registry and the toxic interface;
* :mod:`crashmatrix.harness.faultproxy.client` — a client for any Toxiproxy-compatible
  server (wraps ``toxiproxy-python``; imported separately).
"""

from __future__ import annotations

from ._api import VERSION
from ._server import EmbeddedToxiproxy, FaultProxyServer, main, serve
from ._stream import Chunk, Interrupted, ToxicStub
from ._toxics import TOXIC_TYPES, Cleanup, InvalidAttributes, Stateful, Toxic, register

__all__ = [
    "Chunk",
    "Cleanup",
    "EmbeddedToxiproxy",
    "FaultProxyServer",
    "Interrupted",
    "InvalidAttributes",
    "Stateful",
    "TOXIC_TYPES",
    "Toxic",
    "ToxicStub",
    "VERSION",
    "main",
    "register",
    "serve",
]
