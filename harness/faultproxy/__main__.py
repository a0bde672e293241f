"""``python -m crashmatrix.harness.faultproxy``: run the embedded fault proxy."""

import sys

from ._server import main

if __name__ == "__main__":
    sys.exit(main())
