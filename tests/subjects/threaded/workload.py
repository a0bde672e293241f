"""The checkout workload, behind a module whose import starts a named thread (a workload
module that imports a runtime with an event bus: CrewAI's)."""

from __future__ import annotations

import threading
import time

from crashmatrix.scenarios.checkout import WORKLOAD  # noqa: F401 (the workload itself)

THREAD_NAME = "threaded-workload-poller"
threading.Thread(target=lambda: time.sleep(3600), name=THREAD_NAME, daemon=True).start()
