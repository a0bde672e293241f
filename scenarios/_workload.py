"""What the workloads beyond checkout share: a conversation check and the run input.

A workload here is a class with ``name``, ``conversations`` (what a matrix runs by
default), ``providers`` and ``build_agent(conversation, resources)``; subclassing
:class:`ScriptedWorkload` gives it :meth:`~ScriptedWorkload.run_input` from ``request``
(the user's message) and ``all_conversations`` (every conversation it accepts; by default
``conversations``).
"""

from __future__ import annotations

from typing import Any

from crashmatrix.reference_runtime.state_codec import StateSchema


class ScriptedWorkload:
    """Base of a workload whose model is a script in the model provider."""

    name = ""
    conversations: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    request = ""

    @property
    def all_conversations(self) -> tuple[str, ...]:
        return self.conversations

    def check_conversation(self, conversation: str) -> None:
        """Raise KeyError naming ``conversation`` and the known ones if it is not one."""
        if conversation not in self.all_conversations:
            raise KeyError(f"conversation={conversation!r} is not one of {', '.join(self.all_conversations)}")

    def run_input(self, conversation: str) -> dict[str, Any]:
        """``{"conversation": ..., "messages": [the user's request]}``; KeyError for an
        unknown conversation."""
        self.check_conversation(conversation)
        return {"conversation": conversation, "messages": [{"role": "user", "content": self.request}]}


def durable_schema(name: str, *fields: str) -> StateSchema:
    """A version-1 state schema whose ``fields`` are plain durable JSON."""
    schema = StateSchema(name, version=1)
    for field_name in fields:
        schema.field(field_name)
    return schema
