"""Later builds of the reference runtime, as adapters for build pairs
(``crashmatrix run checkout --subject reference --resume-with reference-next``).

A build's differences are installed into its own worker processes
(:meth:`LaterBuildAdapter.install_build`, from ``start``, ``resume``, ``observe`` and
``prepare``): in a two-build session every call of a build runs in a worker forked from
that build's zygote (:mod:`crashmatrix.harness.builds`), so the two never share a
process. Run alone (one build), the controller's ``observe`` installs it there too.
"""

from __future__ import annotations

from crashmatrix.harness.adapter import Environment, Observation, RunContext
from crashmatrix.harness.adapters.reference import ReferenceAdapter

from . import wire


class LaterBuildAdapter(ReferenceAdapter):
    """The reference adapter of a later build: :meth:`install_build` before each call
    of its own. Subclasses set ``wire_version`` and ``upgraders`` (:mod:`.wire`)."""

    wire_version = 1
    upgraders: dict[int, wire.Upgrader] = {}

    def install_build(self) -> None:
        if self.wire_version > 1:
            wire.install(self.wire_version, dict(self.upgraders))

    async def prepare(self, env: Environment) -> None:
        self.install_build()
        await super().prepare(env)

    async def start(self, ctx: RunContext) -> str:
        self.install_build()
        return await super().start(ctx)

    async def resume(self, ctx: RunContext) -> str:
        self.install_build()
        return await super().resume(ctx)

    async def observe(self, env: Environment, run_id: str) -> Observation:
        self.install_build()
        return await super().observe(env, run_id)


class NextBuildAdapter(LaterBuildAdapter):
    """The reference runtime's next build: payload format 2 (a tool call's arguments as
    a JSON string) with the upgrader from format 1, so it reads what the current build
    wrote (docs/runtime.md, "Codec versions"); the current build refuses format 2
    (``cannot_migrate``: a rollback pair, ``--subject reference-next --resume-with
    reference``)."""

    name = "reference-next"
    wire_version = 2
    upgraders = {1: wire.UPGRADE_1_TO_2}
