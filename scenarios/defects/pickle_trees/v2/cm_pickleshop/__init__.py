"""Build 2 of the pickling app (build B of the ``pickle-moved-class`` mutant): a refactor
moved the message class to :mod:`.model`, and ``cm_pickleshop.messages`` is gone, as in a
real deploy. A pickle written by build 1 names ``cm_pickleshop.messages.Message``."""

from .model import Message

MESSAGE = Message
"""The class this build pickles messages as."""
