"""The reference runtime with one misbehaviour each that the harness must judge as the
subject's failure or as "not applicable", never as a non-event or a harness error:
a cancel API that acknowledges and ignores, a worker that hangs after SIGTERM, an
adapter without the runtime's own recovery. Reached by importable name with
``tests/subjects`` on ``PYTHONPATH`` (``misbehaving.adapter:IgnoresCancel``)."""
