"""The certificate: what each window showed, as JSON and as a readable rich summary.

Verdicts, per check, window and certificate (three-valued, as the oracle's):

- a check is ``ok`` or not, with a one-line ``detail``;
- a window is ``pass`` (every check ok), ``fail`` (a check of the probe failed: it
  lied, was undecided where the provider could answer, changed the ledger, answered
  late, raised, or the same-key retry was not deduplicated) or ``error`` (the window
  was not reached -- the fault did not land where its name says -- or the harness
  failed; never a pass);
- the certificate is ``certified`` (every window passed), ``refused`` (some window
  failed) or ``error`` (none failed, some errored). Exit codes: 0, 1, 3.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Answer", "CallResult", "Certificate", "Check", "WindowResult", "print_certificate"]

SCHEMA = "crashmatrix.probe-certificate/1"


@dataclass(frozen=True)
class Check:
    """One check of a window: ``name`` (``agrees``, ``stable``, ``read_only``,
    ``bounded``, ``retry.deduplicated``, ``agrees.after_retry``, ``reached``, ...),
    ``ok``, and a one-line ``detail``."""

    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class CallResult:
    """How the certified call ended, as the caller saw it.

    ``kind``: ``ok`` (a succeeded ToolOutcome), ``failed`` (a definite failed
    ToolOutcome), ``ambiguous`` (the tool raised OutcomeUnknown), ``cancelled`` (the
    certifier cancelled the caller), ``deadline`` (the caller's deadline passed),
    ``raised`` (any other exception). ``outcome``: ``{"status", "result"}`` for ok and
    failed; ``error``: the exception text; ``ms``: wall milliseconds."""

    kind: Literal["ok", "failed", "ambiguous", "cancelled", "deadline", "raised"]
    outcome: dict[str, Any] | None = None
    error: str | None = None
    ms: float = 0.0


@dataclass(frozen=True)
class Answer:
    """One answer of the probe: ``answer`` is ``applied``, ``not_applied``,
    ``cannot_tell``, ``raised`` (the probe raised: ``error``), ``late`` (no answer
    within the bound) or ``invalid`` (not a ProbeOutcome, or applied without a result);
    ``outcome``: the ToolOutcome it returned as ``{"status", "result"}``; ``ms``: wall
    milliseconds; ``when``: which ask this was (``first``, ``second``, ``in_flight``,
    ``after_retry``, ``flaky#3`` ...)."""

    answer: str
    outcome: dict[str, Any] | None = None
    ms: float = 0.0
    error: str | None = None
    when: str = ""


@dataclass
class WindowResult:
    """One window: ``name``, ``what`` it does, ``caller`` (the call's end),
    ``expected`` (the ledger's truth when the probe was asked, ``Truth.to_json``),
    ``observed`` (every answer), ``retry`` (the same-key retry's end), ``checks``,
    ``verdict`` and ``ms``."""

    name: str
    what: str
    caller: CallResult | None = None
    expected: dict[str, Any] | None = None
    observed: list[Answer] = field(default_factory=list)
    retry: CallResult | None = None
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    ms: float = 0.0

    @property
    def verdict(self) -> Literal["pass", "fail", "error"]:
        if self.error is not None or any(not c.ok for c in self.checks if c.name == "reached"):
            return "error"
        return "fail" if any(not c.ok for c in self.checks) else "pass"

    def failures(self) -> list[Check]:
        """The checks that did not hold."""
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["verdict"] = self.verdict
        return body


@dataclass
class Certificate:
    """The certifier's finding for one probe.

    ``tool``, ``probe``, ``truth``: the parts' names (``MODULE:NAME``); ``sandbox`` and
    ``provider_version``: which provider instance answered; ``settings``: seed, the
    caller's deadline and the probe's bound in ms, the fault proxy's version;
    ``windows``: every :class:`WindowResult`, in the order run; ``ms``: the whole
    certification, wall milliseconds (services included)."""

    tool: str
    probe: str
    truth: str
    sandbox: str
    provider_version: str | None
    settings: dict[str, Any]
    windows: list[WindowResult] = field(default_factory=list)
    ms: float = 0.0

    @property
    def verdict(self) -> Literal["certified", "refused", "error"]:
        verdicts = {w.verdict for w in self.windows}
        if "fail" in verdicts:
            return "refused"
        if "error" in verdicts or not self.windows:
            return "error"
        return "certified"

    @property
    def exit_code(self) -> int:
        """0 certified, 1 refused, 3 error."""
        return {"certified": 0, "refused": 1, "error": 3}[self.verdict]

    def failing(self) -> list[str]:
        """Names of the windows whose verdict is ``fail``."""
        return [w.name for w in self.windows if w.verdict == "fail"]

    def window(self, name: str) -> WindowResult:
        """The window called ``name``; KeyError if it was not run."""
        for w in self.windows:
            if w.name == name:
                return w
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (schema ``crashmatrix.probe-certificate/1``)."""
        return {
            "schema": SCHEMA,
            "tool": self.tool,
            "probe": self.probe,
            "truth": self.truth,
            "sandbox": self.sandbox,
            "provider_version": self.provider_version,
            "settings": self.settings,
            "verdict": self.verdict,
            "failing_windows": self.failing(),
            "windows": [w.to_json() for w in self.windows],
            "ms": round(self.ms, 1),
        }

    def write(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path`` (UTF-8, indented)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _said(w: WindowResult, when: str) -> str:
    answers = [a.answer for a in w.observed if a.when == when]
    return answers[0] if answers else "-"


def print_certificate(console: Any, cert: Certificate, *, max_details: int = 30) -> None:
    """Print the summary table (one row per window: how the caller's call ended, what
    the ledger held once settled, what the probe said then, while the request was
    still in flight, and after the same-key retry) and, under it, every failed check
    with its detail. ``console``: a :class:`rich.console.Console`."""
    from rich.markup import escape
    from rich.table import Table

    colors = {"pass": "green", "fail": "red", "error": "yellow"}
    table = Table(title=f"probe certificate: {escape(cert.probe)}", title_justify="left")
    table.add_column("window", no_wrap=True)
    table.add_column("caller saw")
    table.add_column("ledger")
    table.add_column("probe said")
    table.add_column("in flight")
    table.add_column("after retry")
    table.add_column("verdict")
    for w in cert.windows:
        expected = (w.expected or {}).get("answer", "-")
        color = colors[w.verdict]
        table.add_row(escape(w.name), w.caller.kind if w.caller else "-", expected, _said(w, "first"),
                      _said(w, "in_flight"), _said(w, "after_retry"), f"[{color}]{w.verdict}[/{color}]")
    # A pipe or a file gets 80 columns by default: too narrow for the table's names.
    console.print(table, width=None if console.is_terminal else max(console.width, 116))
    shown = 0
    for w in cert.windows:
        lines = ([f"error: {w.error}"] if w.error else []) + [f"{c.name}: {c.detail}" for c in w.failures()]
        for line in lines:
            if shown >= max_details:
                break
            console.print(f"  {w.name}: {line}", markup=False, highlight=False, soft_wrap=True)
            shown += 1
    color = {"certified": "green", "refused": "red", "error": "yellow"}[cert.verdict]
    failing = cert.failing()
    tail = f"; lies or fails in: {', '.join(failing)}" if failing else ""
    console.print(
        f"[{color}]{cert.verdict.upper()}[/{color}] {escape(cert.probe)} for {escape(cert.tool)}: "
        f"{sum(w.verdict == 'pass' for w in cert.windows)}/{len(cert.windows)} windows passed "
        f"in {cert.ms / 1000:.1f} s (provider {escape(str(cert.provider_version))}){escape(tail)}",
        soft_wrap=True)
