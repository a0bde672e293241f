"""The ``report`` workload: a turn that produces a file of a few hundred KB.

Flow: ``outline`` (read-only) lists the sections; ``render_report`` (read-only) writes
a ~:data:`REPORT_BYTES`-byte Markdown file: the node's output carries it (over the blob
threshold, so the log record holds a blob pointer, :mod:`crashmatrix.reference_runtime.blobs`)
and the tool also keeps it on the run's state (field ``report``, encoded by the state
codec, also a blob); ``publish_report`` (a mail effect) mails the desk the digest of the
file *as read back from the state*, so a resume that lost or mangled the state blob
would mail another digest, and the mail provider's ledger would show it; the last turn
answers with the file's size and digest.

Run it: ``crashmatrix run report``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import anyio

from crashmatrix.reference_runtime.agent import Agent, Tool, ToolContext, ToolOutcome

from ._workload import ScriptedWorkload, durable_schema
from .checkout import ScriptedModel
from .checkout.script import _call, _tool_results
from .checkout.tools import probe_mail, send_receipt

REPORT_BYTES = 300_000
DESK = "reports@example.test"
SECTIONS = ("Summary", "Method", "Findings", "Costs", "Risks", "Appendix")
SCRIPT = "crashmatrix.scenarios.report:respond"


def render(title: str, sections: list[str]) -> str:
    """The report: deterministic Markdown of exactly :data:`REPORT_BYTES` bytes (ASCII)."""
    body = [f"# {title}\n"]
    per = REPORT_BYTES // len(sections)
    for i, name in enumerate(sections, start=1):
        line = f"{i}.{name}: measured throughput, latency and cost of the docking stations under load.\n"
        body.append((f"\n## {name}\n" + line * (per // len(line) + 1))[:per])
    text = "".join(body)
    return (text + "." * REPORT_BYTES)[:REPORT_BYTES]


async def outline(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    return ToolOutcome("succeeded", {"title": f"Report: {args['topic']}", "sections": list(SECTIONS)})


async def render_report(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    await anyio.lowlevel.checkpoint()
    text = render(args["title"], list(args["sections"]))
    ctx.state["report"] = {"name": "report.md", "text": text}
    return ToolOutcome("succeeded", {"file": "report.md", "bytes": len(text),
                                     "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text})


async def publish_report(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    """Mail the digest of the report on the state (not of the arguments)."""
    report = ctx.state["report"]
    text = report["text"]
    mail = {"to": args["to"], "subject": f"{report['name']} is ready",
            "body": f"{report['name']}: {len(text)} bytes, sha256 prefix {hashlib.sha256(text.encode()).hexdigest()[:32]}"}
    return await send_receipt(ctx, mail)


def respond(conversation: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The report writer (runs in the model provider)."""
    outlines = _tool_results(messages, "outline")
    if not outlines:
        return {"content": "Outlining the report.", "tool_calls": [_call("outline", topic="USB-C docks")]}
    files = _tool_results(messages, "render_report")
    if not files:
        plan = outlines[0]["content"]
        return {"content": "Writing the report.", "tool_calls": [_call("render_report", title=plan["title"], sections=plan["sections"])]}
    if not _tool_results(messages, "publish_report"):
        return {"content": "Publishing it.", "tool_calls": [_call("publish_report", to=DESK)]}
    done = files[0]["content"]
    return {"content": f"Published {done['file']}: {done['bytes']} bytes, sha256 {done['sha256'][:16]}.", "tool_calls": []}


class ReportWorkload(ScriptedWorkload):
    """See the module docstring. Providers: mail (the publication), model."""

    name = "report"
    conversations = ("publish",)
    providers = ("mail", "model")
    request = "Write and publish the dock report."

    def build_agent(self, conversation: str, resources: Any) -> Agent:
        return Agent(self.name, ScriptedModel(resources, SCRIPT), {
            "outline": Tool("outline", outline),
            "render_report": Tool("render_report", render_report),
            "publish_report": Tool("publish_report", publish_report, effect=True, probe=probe_mail),
        }, resources=resources, state_schema=durable_schema("report", "report"))


WORKLOAD = ReportWorkload()
