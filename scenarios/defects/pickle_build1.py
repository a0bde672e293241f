"""Where build 1 of the pickle-codec mutant keeps its message class (see
:mod:`.pickle_codec`). Build 2 moved the class to :mod:`.pickle_build2`."""

from __future__ import annotations

from typing import Any


class Message:
    """A transcript message as an object (role, content, tool call fields)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
