"""Re-export of :mod:`crashmatrix.harness.services.providers.launcher` (its old place)."""

from crashmatrix.harness.services.providers.launcher import *  # noqa: F403
from crashmatrix.harness.services.providers.launcher import __all__  # noqa: F401
