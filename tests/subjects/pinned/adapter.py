"""plainrun's adapter, importing protobuf: the observation's ``state["protobuf"]`` is the
version the worker's environment holds."""

from __future__ import annotations

import google.protobuf
from plainrun.adapter import PlainAdapter

from crashmatrix.harness.adapter import Environment, Observation


class PinnedAdapter(PlainAdapter):
    """plainrun, reporting the protobuf of its environment."""

    name = "pinned"
    #: the runtime this subject is pinned to: its release is reported from the
    #: subject's own environment (``MatrixReport.releases``)
    requires = ("google.protobuf",)

    async def observe(self, env: Environment, run_id: str) -> Observation:
        obs = await super().observe(env, run_id)
        obs.state = {**(obs.state or {}), "protobuf": google.protobuf.__version__}
        return obs
