"""Re-export of :mod:`crashmatrix.harness.services.providers.server` (its old place)."""

from crashmatrix.harness.services.providers.server import *  # noqa: F403
from crashmatrix.harness.services.providers.server import __all__  # noqa: F401

if __name__ == "__main__":
    import sys

    from crashmatrix.harness.services.providers.server import main

    sys.exit(main())
