"""The ambiguous windows of one call, and the probe's own properties (docs/probes.md).

Each window drives the certified call through its own proxy on the fault proxy (real
sockets, seeded toxics), settles the ledger, then asks the probe and the ground truth
and compares (:meth:`Window.judge`: agrees, stable, read_only; then the same-key retry,
deduplicated, and agrees.after_retry). ``bounded`` is checked over every answer.
Each window first checks it was *reached*: the caller ended as the window needs and the
ledger shows the effect applied or not as the window needs; a window whose fault did
not land is an error, never a pass.

| window | fault | caller sees | ledger |
| --- | --- | --- | --- |
| never_used | none: a key never sent | - | not applied |
| cancel.before_send | caller cancelled before its first suspension | cancelled | not applied |
| cancel.after_send | response held (timeout toxic), caller cancelled once the provider applied | cancelled | applied |
| reset.upstream | reset_peer on the request: RST on its first byte | ambiguous | not applied |
| reset.downstream | reset_peer on the response: RST on its first byte | ambiguous | applied |
| truncated.request | limit_data: the request one byte short | ambiguous | not applied |
| truncated.response | limit_data: the response one byte short | ambiguous | applied |
| deadline.response | latency on the response beyond the caller's deadline | deadline | applied |
| provider.slow | the provider delays applying beyond the deadline; probe while it works | deadline | applied later |
| late.arrival | latency on the request beyond the deadline; probe, same-key retry, then it lands | deadline | applied once |
| provider.restart.before_apply | SIGKILL while the provider works on the request; restart | ambiguous | not applied |
| provider.restart.after_apply | response held; SIGKILL after the provider applied; restart | ambiguous | applied |
| neighbour.after | ours applied (response reset), then another key's call lands | ambiguous | applied |
| neighbour.same_args | ours lost (request reset), another key's call with our arguments lands | ambiguous | not applied |
| probe.flaky_link | six asks, each on a new connection; every other one has its response reset | ambiguous | applied |
| probe.blackhole | the probe's requests vanish (timeout toxic): must answer within the bound | ambiguous | applied |
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from ._bench import Window, compare

__all__ = ["WINDOWS", "WindowSpec", "window_names"]

AMBIGUOUS = ("ambiguous",)
FLAKY_ASKS = 6


@dataclass(frozen=True)
class WindowSpec:
    """A window: ``name`` (stable; used in certificates and ``--window``), ``what`` (one
    line) and ``run`` (drives the window on an opened :class:`Window`)."""

    name: str
    what: str
    run: Callable[[Window], Awaitable[None]]


async def never_used(w: Window) -> None:
    w.reached(await w.bench.truth(w.key), applied=False, what="a key never sent")
    await w.judge()


async def cancel_before_send(w: Window) -> None:
    w.result.caller = await w.call(cancel_first=True)
    await w.cut()
    w.reached(await w.bench.truth(w.key), applied=False, caller=("cancelled",))
    await w.judge()


async def cancel_after_send(w: Window) -> None:
    await w.toxic("tool", "timeout", "downstream", timeout=0)
    w.result.caller = await w.call(during=w.wait_applied, cancel_after_during=True)
    await w.cut()
    w.reached(await w.bench.truth(w.key), applied=True, caller=("cancelled",))
    await w.judge()


def _reset_or_cut(stream: str, applied: bool, toxic: str) -> Callable[[Window], Awaitable[None]]:
    async def run(w: Window) -> None:
        if toxic == "reset_peer":
            await w.toxic("tool", "reset_peer", stream, timeout=0)
        else:  # one byte short of the clean call's size (calibration)
            size = w.bench.request_bytes if stream == "upstream" else w.bench.response_bytes
            await w.toxic("tool", "limit_data", stream, bytes=max(1, (size or 33) - 1))
        w.result.caller = await w.call()
        await w.cut()
        w.reached(await w.bench.truth(w.key), applied=applied, caller=AMBIGUOUS)
        await w.judge()

    return run


async def deadline_response(w: Window) -> None:
    await w.toxic("tool", "latency", "downstream", latency=w.bench.deadline_ms + 2000)
    w.result.caller = await w.call(deadline=True)
    await w.cut()
    w.reached(await w.bench.truth(w.key), applied=True, caller=("deadline",))
    await w.judge()


async def _in_flight_ask(w: Window) -> None:
    """Ask while the request may still land: the truth is read before and after; if it
    did not change, the probe must tell it (not applied, at that moment)."""
    before = await w.bench.truth(w.key)
    answer = await w.ask("in_flight")
    after = await w.bench.truth(w.key)
    w.reached(before, applied=False, what="the request had not landed when the probe was asked")
    if before == after:
        w.agrees("agrees.in_flight", answer, before)
    else:
        w.check("agrees.in_flight", True, "the request landed while the probe was asked: either answer holds")


async def provider_slow(w: Window) -> None:
    await w.bench.sandbox.set_delay(w.bench.deadline_ms + 400)
    try:
        w.result.caller = await w.call(deadline=True)
        await _in_flight_ask(w)
    finally:
        await w.bench.sandbox.set_delay(0)
    await w.cut()  # waits until the provider has applied the late request
    w.reached(await w.bench.truth(w.key), applied=True, caller=("deadline",), what="the effect landed after the deadline")
    await w.judge()


async def late_arrival(w: Window) -> None:
    latency = w.bench.deadline_ms + 700
    await w.toxic("tool", "latency", "upstream", latency=latency)
    w.result.caller = await w.call(deadline=True)
    await _in_flight_ask(w)
    # The runtime's move after "not applied": the same key again, at once (docs/probes.md).
    w.result.retry = await w.call(link="direct", worker=".retry")
    landed = await w.wait_applied(attempts=2, timeout_s=latency / 1000 + 3)
    await w.cut()
    final = await w.bench.truth(w.key)
    if final.attempts is None:
        w.check("reached", final.applied, "the ledger does not count attempts: the late landing is not observable")
    else:
        w.check("reached", landed, f"the delayed request landed after the retry (attempts={final.attempts})"
                if landed else f"the delayed request never landed (attempts={final.attempts})")
    w.deduplicated(final, final)
    await w.judge(retry=False)


async def restart_before_apply(w: Window) -> None:
    await w.bench.sandbox.set_delay(30_000)

    async def kill_while_working() -> None:
        with anyio.move_on_after(5):
            while await w.bench.sandbox.inflight(w.worker_id) < 1:
                await anyio.sleep(0.005)
        await w.bench.sandbox.restart()  # the new process starts with no delay

    w.result.caller = await w.call(during=kill_while_working)
    await w.cut()
    w.reached(await w.bench.truth(w.key), applied=False, caller=AMBIGUOUS)
    await w.judge()


async def restart_after_apply(w: Window) -> None:
    await w.toxic("tool", "timeout", "downstream", timeout=0)

    async def kill_after_apply() -> None:
        await w.wait_applied()
        await w.bench.sandbox.restart()
        await w.cut()  # the proxy would close the held connection had the toxic not kept it

    w.result.caller = await w.call(during=kill_after_apply)
    w.reached(await w.bench.truth(w.key), applied=True, caller=AMBIGUOUS)
    await w.judge()


def _neighbour(stream: str, applied: bool) -> Callable[[Window], Awaitable[None]]:
    async def run(w: Window) -> None:
        await w.toxic("tool", "reset_peer", stream, timeout=0)
        w.result.caller = await w.call()
        neighbour = await w.call(link="direct", key=w.bench.key(w.name + ".neighbour"), worker=".neighbour")
        await w.cut()
        w.reached(await w.bench.truth(w.key), applied=applied, caller=AMBIGUOUS)
        w.check("reached", neighbour.kind in ("ok", "failed"),
                f"the neighbour's call (same arguments, another key) ended {neighbour.kind}")
        await w.judge()

    return run


async def _applied_then(w: Window) -> None:
    await w.toxic("tool", "reset_peer", "downstream", timeout=0)
    w.result.caller = await w.call()
    await w.cut()
    w.reached(await w.bench.truth(w.key), applied=True, caller=AMBIGUOUS)


async def probe_flaky_link(w: Window) -> None:
    await _applied_then(w)
    truth = await w.bench.truth(w.key)
    before = w.bench.sandbox.snapshot()
    answers = []
    for i in range(FLAKY_ASKS):  # every other connection of the probe is reset
        if i % 2 == 0:
            name = await w.toxic("probe", "reset_peer", "downstream", timeout=0)
        answers.append(await w.ask(f"flaky#{i + 1}", fresh_session=True))
        if i % 2 == 0:
            await w.untoxic("probe", name)
    after = w.bench.sandbox.snapshot()
    verdicts = [compare(a, truth, allow_cannot_tell=True) for a in answers]
    decided = sum(a.answer in ("applied", "not_applied") for a in answers)
    bad = [f"#{i + 1}: {d}" for i, (ok, d) in enumerate(verdicts) if not ok]
    w.check("agrees.flaky_link", not bad, "; ".join(bad) or
            f"{decided} of {FLAKY_ASKS} asks decided correctly, the rest said cannot_tell")
    w.check("read_only", before == after, "the ledger is unchanged by probing" if before == after
            else "probing over the flaky link changed the ledger")
    await w.judge()


async def probe_blackhole(w: Window) -> None:
    await _applied_then(w)
    truth = await w.bench.truth(w.key)
    name = await w.toxic("probe", "timeout", "upstream", timeout=0)
    answer = await w.ask("blackhole", fresh_session=True)
    await w.untoxic("probe", name)
    w.agrees("agrees.blackhole", answer, truth, allow_cannot_tell=True)
    await w.judge()


WINDOWS: tuple[WindowSpec, ...] = (
    WindowSpec("never_used", "a key never used: the probe must say not_applied", never_used),
    WindowSpec("cancel.before_send", "the caller is cancelled before the request is sent", cancel_before_send),
    WindowSpec("cancel.after_send", "the caller is cancelled after the provider applied, before the response",
               cancel_after_send),
    WindowSpec("reset.upstream", "the connection is reset while the request is in flight",
               _reset_or_cut("upstream", False, "reset_peer")),
    WindowSpec("reset.downstream", "the connection is reset while the response is in flight",
               _reset_or_cut("downstream", True, "reset_peer")),
    WindowSpec("truncated.request", "the request reaches the provider one byte short",
               _reset_or_cut("upstream", False, "limit_data")),
    WindowSpec("truncated.response", "the response reaches the caller one byte short",
               _reset_or_cut("downstream", True, "limit_data")),
    WindowSpec("deadline.response", "the response is delayed beyond the caller's deadline", deadline_response),
    WindowSpec("provider.slow", "the provider applies after the caller's deadline; probed while it works",
               provider_slow),
    WindowSpec("late.arrival", "the request is delayed on its way past the deadline, the probe says not applied, "
               "the same key is retried, then the first request lands", late_arrival),
    WindowSpec("provider.restart.before_apply", "the provider is killed while working on the request, then restarted",
               restart_before_apply),
    WindowSpec("provider.restart.after_apply", "the provider is killed after applying, before answering, then restarted",
               restart_after_apply),
    WindowSpec("neighbour.after", "ours applied ambiguously, then another caller's call lands",
               _neighbour("downstream", True)),
    WindowSpec("neighbour.same_args", "ours was lost on the way; another caller's call with the same arguments lands",
               _neighbour("upstream", False)),
    WindowSpec("probe.flaky_link", "the probe's own link resets every other connection", probe_flaky_link),
    WindowSpec("probe.blackhole", "the probe's own requests vanish: it must say cannot_tell within the bound",
               probe_blackhole),
)


def window_names() -> list[str]:
    """Every window's name, in the order the certifier runs them."""
    return [w.name for w in WINDOWS]
