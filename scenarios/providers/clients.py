"""Re-export of :mod:`crashmatrix.harness.services.providers.clients` (its old place)."""

from crashmatrix.harness.services.providers.clients import *  # noqa: F403
from crashmatrix.harness.services.providers.clients import __all__  # noqa: F401
