"""Golden traces on disk, so collecting a matrix test does not run the workload.

The pytest plugin expands a test into one item per case at collection time, and the
cases come from the golden runs' crash-point traces. Running the golden runs costs a
service start and a run per conversation (seconds); every pytest-xdist worker collects
on its own and must collect identical ids. So the traces are cached in a directory:

- one JSON file per workload, subject and code hash (:mod:`.sources`):
  ``goldens/<workload>--<subject>--<hash16>.json``, schema version 2::

      {"version": 2, "workload": str, "subject": str, "code_hash": str,
       "conversations": {conv: {"trace": [[source, name, task, occurrence], ...],
                                "seconds": float, "net_cases": [case id, ...],
                                "states": [int, ...]}}}

  (``net_cases``: the network section of that conversation,
  :func:`.netfaults.net_cases`, which needs the golden run's evidence, not only its
  trace; ``states``: the crash state of each trace entry, :func:`.defaults.crash_states`,
  which needs the golden run's I/O marks: the default matrix's resume-policy sample
  draws one case per state); a file of another version is not read;

- computed once, under a file lock (``filelock``) next to the file: the first process
  that needs a missing conversation runs it while the others wait on the lock and then
  read what it wrote (written to a temporary name and renamed, so a reader never sees
  half a file);
- a file whose code hash is stale is never read (the key changes), and is removed the
  next time a file for the same workload and subject is written.

The cache only decides what is collected: each session still runs its own golden runs
before its first case (the oracle compares with them), and the plugin fails a case whose
session's golden trace differs from the cached one (:func:`trace_mismatch`).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from filelock import FileLock

from .errors import InvalidArgument
from .golden import trace_divergence
from .history import Trace, as_trace

CACHE_VERSION = 2
LOCK_TIMEOUT_S = 900.0


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def cache_path(cache_dir: Path, workload: str, subject: str, code_hash: str) -> Path:
    """The cache file of ``workload`` on ``subject`` at ``code_hash``."""
    return Path(cache_dir) / "goldens" / f"{_safe(workload)}--{_safe(subject)}--{code_hash[:16]}.json"


def _read(path: Path, code_hash: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or data.get("code_hash") != code_hash:
        return {}
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    gitignore = path.parent.parent / ".gitignore"
    if not gitignore.exists():
        gitignore.write_text("# created by crashmatrix: golden-trace cache\n*\n")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)
    prefix = path.name.rsplit("--", 1)[0] + "--"
    for old in path.parent.glob(prefix + "*.json"):
        if old != path:
            old.unlink(missing_ok=True)


def load_traces(
    cache_dir: Path, workload: str, subject: str, code_hash: str, conversations: Iterable[str],
    compute: Callable[[list[str]], dict[str, dict[str, Any]]],
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The cached golden entries of ``conversations``, from the cache or computed.

    ``compute(missing)`` runs the golden runs of the missing conversations and returns
    conversation -> ``{"trace": [...], "seconds": float, "net_cases": [...], "states": [...]}``; it is
    called at most once, under the file lock, and only for conversations the file does
    not hold. Returns conversation -> entry (``trace`` as :class:`~.history.TraceEntry`
    entries) and the list
    of conversations that were computed (empty on a warm cache). Raises what
    ``compute`` raises (nothing is written then), and :class:`InvalidArgument` when the
    lock cannot be taken within 15 minutes (another process hung while computing).
    """
    wanted = list(dict.fromkeys(conversations))
    path = cache_path(cache_dir, workload, subject, code_hash)
    data = _read(path, code_hash)
    have = data.get("conversations", {})
    if all(c in have for c in wanted):  # warm: no lock needed (files are replaced atomically)
        return {c: _entry(have[c]) for c in wanted}, []
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S)
    try:
        with lock:
            data = _read(path, code_hash) or {"version": CACHE_VERSION, "workload": workload, "subject": subject,
                                              "code_hash": code_hash, "conversations": {}}
            missing = [c for c in wanted if c not in data["conversations"]]
            if missing:
                for conv, entry in compute(missing).items():
                    data["conversations"][conv] = {
                        "trace": [list(e) for e in entry["trace"]], "seconds": round(entry.get("seconds", 0.0), 4),
                        "net_cases": list(entry.get("net_cases", [])), "states": list(entry.get("states", [])),
                        "computed_at": round(time.time(), 3)}
                _write(path, data)
    except TimeoutError:
        raise InvalidArgument(f"golden cache lock {path}.lock not acquired in {LOCK_TIMEOUT_S:.0f} s "
                              f"(another process computing golden runs hung?)") from None
    have = data["conversations"]
    return {c: _entry(have[c]) for c in wanted}, missing


def _entry(stored: dict[str, Any]) -> dict[str, Any]:
    return {**stored, "trace": as_trace(stored["trace"]), "net_cases": list(stored.get("net_cases", [])),
            "states": list(stored.get("states", []))}


def trace_mismatch(cached: Trace, live: Trace) -> str | None:
    """Why a session's golden trace ``live`` does not match the ``cached`` one the test
    ids were collected from (compared per logical task, as interleaving between tasks
    may differ), or None when they match."""
    where = trace_divergence(live, cached) or trace_divergence(cached, live)
    if where is None and len(cached) != len(live):
        where = f"{len(cached)} points cached, {len(live)} in this run"
    return where
