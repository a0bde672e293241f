"""Correct runtimes that differ from the reference the ways real teams' do:
idempotency keys made once and stored before the send (``uuid4`` strings, uuid hex,
ULIDs, integers from a sequence) and status names of their own; each with a twin that
plants one defect (a fresh key on every attempt). Reached by importable name with this
directory on ``PYTHONPATH`` (``teamruntimes.keys:UuidKeyAdapter``)."""
