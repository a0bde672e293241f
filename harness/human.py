"""A person in the loop, scripted: the operator of a workload that interrupts, and the
checks of what the run did with the answers (docs/adapters.md, "A person in
the loop").

A workload may script its operator (``workload.operator_script``, an
:class:`OperatorScript`): for each interrupt, by the node that raises it and its
ordinal (the first, second... interrupt that node raises in one execution, the order in
which the runtime matches answers to interrupts), the answer, and how long the person
takes on the simulated clock (``takes_s``). The adapter answers each interrupt its
runtime reports through the runtime's own protocol (LangGraph: ``Command(resume=...)``;
:mod:`.adapters.langgraph`) and labels the operator's turn so the matrix crosses crash
points with the waits: ``human.wait`` (the run waits, durably, for the person),
``human.answer.before`` and ``human.answer.after`` (the answer handed to the runtime),
in the logical task ``human-<node>-<ordinal>``.

What the person answers is :meth:`OperatorScript.delivered`: the scripted value, and
for a dict value also ``answered_at``, the simulated time of the answer (the frozen
clock, :func:`.determinism.clock`, advanced by every answer's ``takes_s`` in script
order), so an interrupt answered with another's value shows even when the values look
alike. The workload records what each interrupt returned (:func:`record`): a dict
``{"interrupt": "NODE#ORDINAL", "answer": ...}`` in its durable transcript (a message of
its own, or a tool result's content).

The checks (end, and on the golden run: they need no golden run to hold):

- ``interrupt.answers``: every answer consumed once, by the right interrupt: each
  interrupt's record holds the answer scripted for that interrupt (LangGraph issue 8837:
  after a crash between two interrupts, ``invoke(None)`` answers the second with the
  first's value), no interrupt recorded twice, none the golden run answered missing;
- ``interrupt.siblings_kept``: tool calls that completed beside an interrupting one are
  not run again: in the golden run each provider request is sent once, and in a case
  at most once more per fault of the plan (a call in flight at a fault may be sent
  again) (LangGraph PR 3126 / issue 6626: a ``ToolNode`` that gets the whole message
  re-runs every tool call of it after one interrupts). Requests are told apart by their
  body within one run, never matched across runs (their bodies carry identifiers).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .checks import Check, compose
from .oracle import Evidence, Verdict

ANSWERS = Check("interrupt.answers", "human answers", "answer given to the wrong interrupt", "end",
                "each interrupt answered once, with the answer given for it")
SIBLINGS_KEPT = Check("interrupt.siblings_kept", "human answers", "completed call run again", "end",
                      "no provider request sent again beyond what the faults explain")

INTERRUPT_KEY, ANSWER_KEY = "interrupt", "answer"
WAIT, ANSWER_BEFORE, ANSWER_AFTER = "human.wait", "human.answer.before", "human.answer.after"
"""The crash-point labels of the operator's turn (module docstring)."""


@dataclass(frozen=True)
class Answer:
    """The scripted answer to the ``ordinal``-th interrupt (1-based) of ``node``, given
    after ``takes_s`` simulated seconds."""

    node: str
    ordinal: int
    value: Any
    takes_s: int = 0

    @property
    def label(self) -> str:
        """``NODE#ORDINAL``, as records and messages name the interrupt."""
        return f"{self.node}#{self.ordinal}"

    @property
    def task(self) -> str:
        """The logical task of the operator's turn for this interrupt."""
        return f"human-{self.node}-{self.ordinal}"


@dataclass(frozen=True)
class OperatorScript:
    """A workload's scripted operator: its answers, in the order a golden run needs
    them. Raises ``ValueError`` for two answers to one interrupt."""

    answers: tuple[Answer, ...]

    def __post_init__(self) -> None:
        labels = [a.label for a in self.answers]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"the operator script answers {', '.join(twice)} more than once")

    def find(self, node: str, ordinal: int) -> Answer | None:
        """The answer to ``node``'s ``ordinal``-th interrupt, or None (the person has no
        answer for it: the run stays waiting)."""
        return next((a for a in self.answers if a.node == node and a.ordinal == ordinal), None)

    def answered_at(self, answer: Answer) -> str:
        """When the person answers, on the simulated clock (ISO 8601, UTC)."""
        from datetime import datetime, timezone

        from .determinism import clock

        elapsed = 0
        for a in self.answers:
            elapsed += a.takes_s
            if a == answer:
                break
        return datetime.fromtimestamp(clock(elapsed), timezone.utc).isoformat()

    def delivered(self, answer: Answer) -> Any:
        """What the runtime is handed for ``answer`` (module docstring)."""
        if isinstance(answer.value, dict):
            return {**answer.value, "answered_at": self.answered_at(answer)}
        return answer.value


def record(node: str, ordinal: int, answer: Any) -> dict[str, Any]:
    """What a workload keeps of the value ``node``'s ``ordinal``-th interrupt returned."""
    return {INTERRUPT_KEY: f"{node}#{ordinal}", ANSWER_KEY: answer}


def _records(value: Any) -> Iterator[dict[str, Any]]:
    """Every :func:`record` inside a transcript (messages, tool results, JSON strings)."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = json.loads(value)
        except ValueError:
            return
    if isinstance(value, dict):
        if INTERRUPT_KEY in value and ANSWER_KEY in value and isinstance(value[INTERRUPT_KEY], str):
            yield value
        for item in value.values():
            yield from _records(item)
    elif isinstance(value, list):
        for item in value:
            yield from _records(item)


def check_answers(script: OperatorScript, case: Evidence, golden: Evidence | None) -> Verdict:
    """``interrupt.answers`` (module docstring); ``golden`` None: on the golden run itself."""
    name = "interrupt.answers"
    transcript = (case.observation.state or {}).get("transcript") or []
    found = list(_records(transcript))
    problems = []
    by_value = {json.dumps(script.delivered(a), sort_keys=True, default=str): a.label for a in script.answers}
    for rec in found:
        node, _, ordinal = rec[INTERRUPT_KEY].rpartition("#")
        want = script.find(node, int(ordinal)) if ordinal.isdigit() else None
        if want is None:
            problems.append(f"{rec[INTERRUPT_KEY]} got an answer the operator never scripted")
            continue
        if rec[ANSWER_KEY] != script.delivered(want):
            other = by_value.get(json.dumps(rec[ANSWER_KEY], sort_keys=True, default=str))
            problems.append(f"{want.label} was answered with "
                            + (f"the answer scripted for {other}" if other else f"{rec[ANSWER_KEY]!r}"))
    counts = Counter(r[INTERRUPT_KEY] for r in found)
    problems += [f"{label} consumed {n} times" for label, n in sorted(counts.items()) if n > 1]
    if golden is not None:
        expected = Counter(r[INTERRUPT_KEY] for r in _records((golden.observation.state or {}).get("transcript") or []))
        problems += [f"{label} answered in the golden run, never here" for label in sorted(expected) if label not in counts]
    if problems:
        return Verdict(name, "end", False, "; ".join(problems))
    return Verdict(name, "end", True, f"{len(found)} interrupt(s), each answered once with its own answer")


def _sent(ev: Evidence) -> Counter[tuple[str, str]]:
    """Requests per (provider kind, op + request body): the ledger's ``attempts`` summed
    over rows with that request (a re-sent request is another row, naive keys, or more
    attempts on one row, stable keys)."""
    out: Counter[tuple[str, str]] = Counter()
    for kind, rows in ev.ledgers.items():
        for row in rows:
            what = json.dumps({"op": row.get("op"), "request": row.get("request")}, sort_keys=True, default=str)
            out[(kind, what)] += int(row.get("attempts") or 1)
    return out


def check_siblings(case: Evidence, faults: int) -> Verdict:
    """``interrupt.siblings_kept`` (module docstring); ``faults``: the faults of the
    case's plan (0 for the golden run: every request once)."""
    name = "interrupt.siblings_kept"
    sent = _sent(case)
    over = []
    for (kind, what), n in sorted(sent.items()):
        limit = 1 + faults
        if n > limit:
            op = json.loads(what)
            over.append(f"{kind} {op['op']} {json.dumps(op['request'], sort_keys=True)[:80]} sent {n} times "
                        f"(at most {limit})")
    if over:
        return Verdict(name, "end", False, "request(s) sent again with no fault to explain it (a call that "
                                           "completed beside an interrupting one ran again?): " + "; ".join(over[:4]))
    return Verdict(name, "end", True, f"{sum(sent.values())} request(s), none sent again beyond the faults'")


def end_checks(script: OperatorScript, case: Evidence, golden: Evidence | None, faults: int) -> list[Verdict]:
    """The checks of a workload with an operator script (module docstring), each run
    with :func:`.checks.compose`."""
    return compose([(ANSWERS, lambda: check_answers(script, case, golden)),
                    (SIBLINGS_KEPT, lambda: check_siblings(case, faults))])
