"""Subjects that leave something of a run in their worker process (for the long-lived
worker's tests: ``tests/integration/test_resident.py``)."""
