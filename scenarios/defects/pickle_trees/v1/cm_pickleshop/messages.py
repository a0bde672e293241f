"""Build 1's message class (build 2 moved it to ``cm_pickleshop.model``)."""

from __future__ import annotations

from typing import Any


class Message:
    """A transcript message as an object (role, content, tool call fields)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
