"""Build 1 of a tiny app that pickles its transcript messages (the source tree of
build A in the catalogue's ``pickle-moved-class`` mutant): the class lives in
:mod:`.messages`. Put this tree's parent directory on the path to import it as
``cm_pickleshop`` (``--subject 'v1=defect:pickle-moved-class@.../pickle_trees/v1'``)."""

from .messages import Message

MESSAGE = Message
"""The class this build pickles messages as."""
