"""Re-export of :mod:`crashmatrix.harness.services.providers.ledger` (its old place)."""

from crashmatrix.harness.services.providers.ledger import *  # noqa: F403
from crashmatrix.harness.services.providers.ledger import __all__  # noqa: F401
