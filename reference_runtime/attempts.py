"""The attempt limit: a run that crashes at the same place in every worker stops itself.

Wall (a crash that recurs at the same point on every attempt; Celery's
``acks_late``: a poison message redelivered forever, 228 charges in 60 s): a resume that
dies at the same point as the attempt before it makes no progress, and a supervisor
that restarts it forever turns one bad input into an unbounded bill. Every attempt
takes the lease with a new epoch (:mod:`.leases`) and every record carries the epoch of
the attempt that appended it, so the attempts since the last progress are

    this attempt's epoch - 1 - (the epoch of the newest record, or 0)

(epochs that appended nothing). When that reaches :data:`MAX_ATTEMPTS_WITHOUT_PROGRESS`,
:meth:`.executor.Runtime.run` does not schedule again: it writes status ``failed`` with
the detail ``crash loop: ...`` (fenced) and returns ``"failed"``, the run's terminal
status for a crash loop (the adapter declares it: ``crash_loop_status``). One attempt
that appends a record resets the count: a long run resumed after many unrelated
crashes is never stopped by it.
"""

from __future__ import annotations

from .leases import Lease

MAX_ATTEMPTS_WITHOUT_PROGRESS = 5
"""Attempts in a row that appended nothing after which the next one gives up. Five
leaves room for unrelated crashes during one slow node (a deploy, an OOM kill, a
double fault) and still stops a poison run after six workers."""


def attempts_without_progress(lease: Lease) -> int:
    """Attempts before ``lease``'s that appended no record since the newest one (the
    newest record's epoch is read with the lease: :attr:`.leases.Lease.progress_epoch`)."""
    return max(0, lease.epoch - 1 - lease.progress_epoch)


def crash_loop_detail(n: int, lease: Lease) -> str:
    """The detail of a run the limit stopped."""
    return f"crash loop: {n} attempt(s) before epoch {lease.epoch} made no progress; not scheduling again"
