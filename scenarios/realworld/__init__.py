"""Checkout workloads for runtimes this project did not write: LangGraph and DBOS.

The same purchase agent as :mod:`crashmatrix.scenarios.checkout` (same scripted model,
same conversations, same payment, mail and model providers in their own processes), told
the way each runtime wants it:

- :mod:`.langgraph_checkout`: a ``StateGraph`` (``agent`` -> ``tools`` -> ``agent`` ...)
  and a functional-API ``entrypoint`` with ``task``\\ s; needs ``crashmatrix[langgraph]``.
- :mod:`.dbos_checkout`: a DBOS workflow whose model turns and tool calls are steps;
  needs ``crashmatrix[dbos]``.

Each comes in two *tool flavours* (:mod:`.common`): ``naive`` sends every effect with a
fresh idempotency key per attempt (as a tool that does not think about retries does),
``keyed`` derives the key from the runtime's stable ids (thread or workflow id plus step),
so a repeated step repeats the same key and the provider applies it once.

This package imports neither LangGraph nor DBOS; its submodules do.
"""

from __future__ import annotations

from .common import FLAVOURS, effect_key

__all__ = ["FLAVOURS", "effect_key"]
