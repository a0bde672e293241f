"""Build 2 of the pickle-codec mutant: the message class of :mod:`.pickle_build1`, moved
by a refactor (and made a dataclass on the way). See :mod:`.pickle_codec`. The class is
the one of the app tree ``pickle_trees/v2`` (the real two-build form:
:mod:`.upgrade_defects`)."""

from __future__ import annotations

from .pickle_trees.v2.cm_pickleshop.model import Message

__all__ = ["Message"]
