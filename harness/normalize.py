"""Id normalisation for comparing a case with its golden run (DESIGN.md, "Determinism").

Ids that legitimately differ between runs (run ids, idempotency keys, the model's
tool-call ids, provider ids derived from keys) are replaced by their order of first
appearance: the first charge id becomes ``ch-1``, the second ``ch-2``. They are never
masked: masking would make a second charge look like the first.

One :class:`Normalizer` serves one run, and values must be fed in a canonical order
(the oracle feeds the transcript first, then ledger rows sorted by node id), so that
the n-th id means the same thing in both runs.
"""

from __future__ import annotations

import re
from typing import Any

# (pattern, label prefix). Longer, more specific patterns first.
ID_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\b[0-9a-f]{64}\b", "key"),
    (r"\bcall_[0-9a-f]{6,}\b", "call"),
    (r"\bch_[0-9a-f]{6,}\b", "ch"),
    (r"\bre_[0-9a-f]{6,}\b", "re"),
    (r"\bmsg_[0-9a-f]{6,}\b", "msg"),
    (r"\bcmpl_[0-9a-f]{6,}\b", "cmpl"),
    (r"\bcm-run-[0-9a-f]{6,}\b", "run"),
)
_RE = re.compile("|".join(f"(?P<g{i}>{p})" for i, (p, _) in enumerate(ID_PATTERNS)))


class Normalizer:
    """Replaces run-specific ids in nested JSON values by ``prefix-N``."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}
        self.counts: dict[str, int] = {}

    def copy(self) -> Normalizer:
        """A normaliser that knows every id seen so far; ids it meets later do not
        change this one's numbering (one per provider ledger: an extra row in one
        ledger must not shift the labels of another)."""
        other = Normalizer()
        other.seen = dict(self.seen)
        other.counts = dict(self.counts)
        return other

    def _label(self, match: re.Match[str]) -> str:
        text = match.group(0)
        if text not in self.seen:
            prefix = ID_PATTERNS[int(match.lastgroup[1:])][1]  # type: ignore[index]
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            self.seen[text] = f"{prefix}-{self.counts[prefix]}"
        return self.seen[text]

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return _RE.sub(self._label, value)
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {self(k) if isinstance(k, str) else k: self(v) for k, v in value.items()}
        return value
