"""plausible: five defects a runtime author could plausibly write, each a small variant of
the reference runtime, kept with the tests and out of the mutant catalogue (they
measure whether the default workloads can show such defects at all, so nothing in
``harness/`` or ``scenarios/defects`` may be tuned to them). Put ``tests/subjects`` on
``PYTHONPATH`` and name one as a subject::

    PYTHONPATH=tests/subjects crashmatrix run support_desk --subject plausible.defects:TurnKeyedAdapter

See :mod:`plausible.defects` for each defect, and docs/runtime.md ("support_desk") for
what each workload's default matrix caught.
"""
