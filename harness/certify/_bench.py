"""The certifier's moving parts: one :class:`Bench` per certification, one :class:`Window`
per ambiguous window.

A window gets its own idempotency key, its own two proxies on the fault proxy (the
tool's link and the probe's link, both dialling the sandbox) and its own aiohttp
sessions, so nothing one window does (a toxic, a pooled connection, a held request)
reaches the next. "Cutting" the tool's link destroys its proxy -- no byte of that call
can reach the provider afterwards -- and then waits until the provider has no request
of the window's worker id in flight: from then on the ledger is settled and the truth
cannot change under the probe.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anyio
import anyio.to_thread

from crashmatrix.reference_runtime.agent import OutcomeUnknown, ProbeOutcome, ToolContext, ToolOutcome
from crashmatrix.reference_runtime.effects import idempotency_key

from .certificate import Answer, CallResult, Check, WindowResult
from .contract import Parts, Sandbox, Truth, outcome_json

__all__ = ["Bench", "Window", "TruthFailed"]

SAFETY_S = 15.0  # a call with no deadline of its own that has not ended by then is a harness error
SETTLE_S = 10.0  # how long cutting a link may wait for the provider to finish the window's requests
LAND_S = 5.0  # how long a window waits for an effect it expects to land


class TruthFailed(Exception):
    """The ground-truth function raised or returned something other than a Truth."""


def _outcome(value: Any) -> dict[str, Any] | None:
    return outcome_json(value) if isinstance(value, ToolOutcome) else None


class Bench:
    """Everything one certification shares: the parts, the running sandbox, the fault
    proxy client, the settings (``deadline_ms``: the caller's deadline; ``bound_ms``:
    the probe's bound) and the calibration figures (request and response bytes of a
    clean call, for the truncation windows)."""

    def __init__(self, parts: Parts, sandbox: Sandbox, proxy: Any, *, seed: int, deadline_ms: int,
                 bound_ms: int, metrics_url: str | None) -> None:
        self.parts = parts
        self.sandbox = sandbox
        self.proxy = proxy  # a crashmatrix.harness.faultproxy.client.ToxiproxyClient
        self.seed = seed
        self.deadline_ms = deadline_ms
        self.bound_ms = bound_ms
        self.metrics_url = metrics_url
        self.run_id = f"certify-{seed}"
        self.request_bytes: int | None = None
        self.response_bytes: int | None = None

    def key(self, name: str) -> str:
        """The idempotency key of call ``name``: ``sha256(run_id:name)``, as the runtime derives it."""
        return idempotency_key(self.run_id, name)

    async def truth(self, key: str) -> Truth:
        """Ask the ground truth about ``key``; raises :class:`TruthFailed`."""
        try:
            value = self.parts.truth(self.sandbox, key)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            raise TruthFailed(f"truth {self.parts.truth_name} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(value, Truth):
            raise TruthFailed(f"truth {self.parts.truth_name} returned {value!r}, not a Truth")
        return value

    async def proxy_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a (blocking, requests-based) fault-proxy client call off the event loop."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def calibrate(self) -> Truth:
        """One clean call through a proxy: the truth must agree with the tool's own
        answer (else nothing could be judged), and the proxy's byte counters give the
        request and response sizes. Raises :class:`ValueError` naming the disagreement."""
        window = Window(self, "calibration", "a clean call")
        await window.open()
        try:
            result = await window.call()
            await window.cut()
            truth = await self.truth(window.key)
        finally:
            await window.close()
        if result.kind not in ("ok", "failed"):
            raise ValueError(f"a clean call of {self.parts.tool_name} did not succeed: {result.kind} ({result.error})")
        if not truth.applied or outcome_json(truth.outcome) != result.outcome or truth.rows != 1:
            raise ValueError(
                f"truth {self.parts.truth_name} disagrees with the tool's own answer on a clean call: "
                f"tool returned {result.outcome!r}, truth says {truth.to_json()!r}")
        await self._read_sizes(window.proxy_names["tool"])
        return truth

    async def _read_sizes(self, proxy_name: str) -> None:
        if self.metrics_url is None:
            return
        pattern = re.compile(
            r'^toxiproxy_proxy_(received|sent)_bytes_total\{direction="(\w+)",.*proxy="' + re.escape(proxy_name) + r'".*\}\s+(\d+)')
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # counters are added when the connection has finished
                async with session.get(self.metrics_url) as resp:
                    text = await resp.text()
                sizes = {}
                for line in text.splitlines():
                    m = pattern.match(line)
                    if m:
                        sizes[(m.group(1), m.group(2))] = int(m.group(3))
                if ("received", "upstream") in sizes and ("sent", "downstream") in sizes:
                    self.request_bytes = sizes[("received", "upstream")]
                    self.response_bytes = sizes[("sent", "downstream")]
                    return
                await anyio.sleep(0.01)


def compare(answer: Answer, truth: Truth, *, allow_cannot_tell: bool = False) -> tuple[bool, str]:
    """Does ``answer`` tell the truth? ``cannot_tell`` passes only where allowed (the
    probe's own link or the provider is impaired); everywhere else it is *undecided*:
    the provider could have answered, and the run would stop for a human."""
    said = answer.answer
    if said in ("raised", "late", "invalid"):
        return False, f"probe {said}: {answer.error}"
    if said in ("cannot_tell", "cannot_tell_yet"):  # _yet: transient, the runtime asks again
        if allow_cannot_tell:
            return True, "cannot tell (allowed: the probe's link or the provider is impaired)"
        return False, "undecided: the probe said cannot_tell although the provider could answer"
    if (said == "applied") != truth.applied:
        if truth.applied:
            return False, (f"lie: the probe says not_applied, the ledger has {truth.rows} row(s) for the key"
                           f" ({_short(outcome_json(truth.outcome))}): the runtime would call again")
        return False, "lie: the probe says applied, the ledger has no row for the key: the effect would be lost"
    if said == "applied" and answer.outcome != outcome_json(truth.outcome):
        return False, (f"lie: the probe's result {_short(answer.outcome)} is not the ledger's "
                       f"{_short(outcome_json(truth.outcome))}")
    return True, said


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Window:
    """One ambiguous window: its key, links, sessions, result and the steps windows use."""

    def __init__(self, bench: Bench, name: str, what: str) -> None:
        self.bench = bench
        self.name = name
        self.result = WindowResult(name, what)
        self.key = bench.key(name)
        self.worker_id = f"certify.{name}"
        self.proxy_names = {link: f"certify-{bench.seed}-{name}-{link}" for link in ("tool", "probe")}
        self._proxies: dict[str, Any] = {}
        self._sessions: list[aiohttp.ClientSession] = []
        self._probe_session: aiohttp.ClientSession | None = None

    # -- links -----------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the tool's and the probe's proxies, both dialling the sandbox."""
        for link, proxy_name in self.proxy_names.items():
            stale = await self.bench.proxy_call(self.bench.proxy.get_proxy, proxy_name)
            if stale is not None:
                await self.bench.proxy_call(stale.destroy)
            self._proxies[link] = await self.bench.proxy_call(
                self.bench.proxy.create, upstream=self.bench.sandbox.upstream, name=proxy_name)
        self._probe_session = await self.session()

    def url(self, link: str) -> str:
        """``http://`` address of ``link``: ``tool``, ``probe`` (proxied) or ``direct``."""
        if link == "direct":
            return self.bench.sandbox.url
        return f"http://{self._proxies[link].listen}"

    async def toxic(self, link: str, type: str, stream: str = "downstream", toxicity: float = 1.0,
                    **attributes: int) -> str:
        """Add a toxic to ``link``; returns its name."""
        name = f"{type}_{stream}"
        await self.bench.proxy_call(self._proxies[link].add_toxic, type=type, stream=stream, name=name,
                                    toxicity=toxicity, attributes=attributes)
        return name

    async def untoxic(self, link: str, name: str) -> None:
        """Remove the toxic ``name`` from ``link``."""
        await self.bench.proxy_call(self._proxies[link].destroy_toxic, name)

    async def cut(self) -> None:
        """Destroy the tool's link (its connections close: nothing more of this call can
        arrive), then wait until the provider has finished the window's requests."""
        proxy = self._proxies.pop("tool", None)
        if proxy is not None:
            await self.bench.proxy_call(proxy.destroy)
        await self.bench.sandbox.quiesce(self.worker_id, SETTLE_S)

    async def session(self) -> aiohttp.ClientSession:
        """A fresh aiohttp session, closed with the window."""
        session = aiohttp.ClientSession()
        self._sessions.append(session)
        return session

    async def close(self) -> None:
        """Close the sessions and destroy the proxies left."""
        for session in self._sessions:
            await session.close()
        for proxy in self._proxies.values():
            try:
                await self.bench.proxy_call(proxy.destroy)
            except Exception:  # the proxy server may be gone already; nothing is left to leak
                pass
        self._proxies.clear()

    # -- the call --------------------------------------------------------------------------

    async def call(self, *, link: str = "tool", key: str | None = None, deadline: bool = False,
                   cancel_first: bool = False, during: Callable[[], Awaitable[Any]] | None = None,
                   cancel_after_during: bool = False, worker: str = "") -> CallResult:
        """Call the tool once with ``key`` (default: the window's) over ``link``.

        ``deadline``: the caller gives up after the bench's ``deadline_ms`` (a cancel
        scope's deadline, as a runtime's tool timeout). ``cancel_first``: the caller is
        cancelled before the tool runs to its first suspension (nothing is sent).
        ``during``: a coroutine run beside the call (a restart, a wait); with
        ``cancel_after_during`` the caller is cancelled when it returns."""
        session = await self.session()
        resources = self.bench.sandbox.resources(session, self.url(link), self.worker_id + worker)
        ctx = ToolContext(self.bench.run_id, f"certify.{self.name}", key or self.key, resources)
        limit = self.bench.deadline_ms / 1000 if deadline else SAFETY_S
        scope = anyio.CancelScope(deadline=anyio.current_time() + limit)
        requested = False
        if cancel_first:
            scope.cancel()
            requested = True
        result: CallResult | None = None
        started = time.monotonic()

        def ms() -> float:
            return round((time.monotonic() - started) * 1000, 1)

        async def side() -> None:
            nonlocal requested
            assert during is not None
            await during()
            if cancel_after_during:
                requested = True
                scope.cancel()

        async with anyio.create_task_group() as tg:
            if during is not None:
                tg.start_soon(side)
            with scope:
                try:
                    out = await self.bench.parts.tool(ctx, dict(self.bench.sandbox.arguments))
                    if isinstance(out, ToolOutcome) and out.status in ("succeeded", "failed"):
                        result = CallResult("ok" if out.status == "succeeded" else "failed", _outcome(out), ms=ms())
                    else:
                        result = CallResult("raised", error=f"the tool returned {_short(out)}, not a ToolOutcome", ms=ms())
                except OutcomeUnknown as exc:
                    result = CallResult("ambiguous", error=str(exc), ms=ms())
                except Exception as exc:
                    result = CallResult("raised", error=f"{type(exc).__name__}: {exc}", ms=ms())
            if result is None:
                if requested:
                    result = CallResult("cancelled", error="cancelled by the certifier", ms=ms())
                else:
                    result = CallResult("deadline", error=f"no answer within {limit * 1000:.0f} ms", ms=ms())
        return result

    async def wait_applied(self, key: str | None = None, *, attempts: int = 1, timeout_s: float = LAND_S) -> bool:
        """Poll the truth until ``key`` is applied (with at least ``attempts`` arrivals
        when the ledger counts them); False after ``timeout_s``."""
        with anyio.move_on_after(timeout_s):
            while True:
                t = await self.bench.truth(key or self.key)
                if t.applied and (t.attempts is None or t.attempts >= attempts):
                    return True
                await anyio.sleep(0.005)
        return False

    # -- the probe -------------------------------------------------------------------------

    async def ask(self, when: str, *, fresh_session: bool = False) -> Answer:
        """Ask the probe about the window's key over the probe's link, within the bound."""
        session = await self.session() if fresh_session else self._probe_session
        resources = self.bench.sandbox.resources(session, self.url("probe"), self.worker_id + ".probe")
        ctx = ToolContext(self.bench.run_id, f"certify.{self.name}", self.key, resources)
        started = time.monotonic()
        out: Any = None
        error: str | None = None
        with anyio.move_on_after(self.bench.bound_ms / 1000) as scope:
            try:
                out = await self.bench.parts.probe(ctx)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        ms = round((time.monotonic() - started) * 1000, 1)
        if scope.cancelled_caught:
            answer = Answer("late", ms=ms, error=f"no answer within {self.bench.bound_ms} ms", when=when)
        elif error is not None:
            answer = Answer("raised", ms=ms, error=error, when=when)
        elif not isinstance(out, ProbeOutcome) or out.outcome not in ("applied", "not_applied", "cannot_tell",
                                                                       "cannot_tell_yet"):
            answer = Answer("invalid", ms=ms, error=f"returned {_short(out)}, not a ProbeOutcome", when=when)
        elif out.outcome == "applied" and not isinstance(out.tool_outcome, ToolOutcome):
            answer = Answer("invalid", ms=ms, error="said applied without the result (tool_outcome)", when=when)
        else:
            answer = Answer(out.outcome, _outcome(out.tool_outcome) if out.outcome == "applied" else None, ms=ms,
                            when=when)
        self.result.observed.append(answer)
        return answer

    # -- checks ----------------------------------------------------------------------------

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a check; returns ``ok``."""
        self.result.checks.append(Check(name, bool(ok), detail))
        return ok

    def reached(self, truth: Truth, *, applied: bool | None, caller: tuple[str, ...] | None = None,
                what: str = "") -> bool:
        """The window's fault landed where its name says: the ledger shows ``applied``
        (when given) and the caller ended as one of ``caller`` (when given). A window
        not reached is an error, never a pass."""
        problems = []
        if applied is not None and truth.applied != applied:
            problems.append(f"the ledger shows {'a row' if truth.applied else 'no row'} for the key, the window "
                            f"needs {'one' if applied else 'none'}")
        got = self.result.caller.kind if self.result.caller else None
        if caller is not None and got not in caller:
            problems.append(f"the caller saw {got} ({self.result.caller.error if self.result.caller else ''}),"
                            f" the window needs {' or '.join(caller)}")
        detail = "; ".join(problems) or (what or "fault landed as named")
        return self.check("reached", not problems, detail)

    def agrees(self, name: str, answer: Answer, truth: Truth, *, allow_cannot_tell: bool = False) -> bool:
        """Check that ``answer`` tells ``truth`` (see :func:`compare`)."""
        ok, detail = compare(answer, truth, allow_cannot_tell=allow_cannot_tell)
        return self.check(name, ok, detail)

    async def judge(self, *, retry: bool = True) -> Truth:
        """The settled tail of every window: read the truth, ask the probe twice, check
        it agrees, is stable and changed nothing; then (``retry``) call again with the
        same key, as the runtime does after ``not_applied``, check that the provider
        deduplicated it, and ask once more. Returns the final truth."""
        truth = await self.bench.truth(self.key)
        self.result.expected = truth.to_json()
        before = self.bench.sandbox.snapshot()
        first = await self.ask("first")
        second = await self.ask("second")
        after = self.bench.sandbox.snapshot()
        self.agrees("agrees", first, truth)
        self.check("stable", (first.answer, first.outcome) == (second.answer, second.outcome),
                   "asked twice, same answer" if (first.answer, first.outcome) == (second.answer, second.outcome)
                   else f"asked twice: {first.answer} then {second.answer}")
        self.check("read_only", before == after,
                   "the ledger is unchanged by probing" if before == after
                   else f"probing changed the ledger: {_ledger_diff(before, after)}")
        if not retry:
            return truth
        self.result.retry = await self.call(link="direct", worker=".retry")
        final = await self.bench.truth(self.key)
        self.deduplicated(truth, final)
        self.agrees("agrees.after_retry", await self.ask("after_retry"), final)
        return final

    def deduplicated(self, before: Truth, final: Truth) -> bool:
        """The same-key retry got a definite answer, exactly one row holds the key, the
        retry's answer is that row's, and an effect already applied was not redone."""
        retry = self.result.retry
        problems = []
        if retry is None or retry.kind not in ("ok", "failed"):
            problems.append(f"the retry ended {retry.kind if retry else 'never'} ({retry.error if retry else ''})")
        if final.rows != 1:
            problems.append(f"the ledger holds {final.rows} rows for the key (deduplication must leave one)")
        elif retry is not None and retry.outcome != outcome_json(final.outcome):
            problems.append(f"the retry answered {_short(retry.outcome)}, the ledger holds {_short(outcome_json(final.outcome))}")
        if before.applied and final.applied and outcome_json(before.outcome) != outcome_json(final.outcome):
            problems.append("the retry changed the applied effect's result")
        return self.check("retry.deduplicated", not problems,
                          "; ".join(problems) or f"one row, attempts={final.attempts}")

    def finish(self) -> None:
        """Add the ``bounded`` check over every answer of the window."""
        if not self.result.observed:
            return
        late = [a for a in self.result.observed if a.answer == "late"]
        slowest = max(a.ms for a in self.result.observed)
        self.check("bounded", not late,
                   f"{len(late)} answer(s) later than {self.bench.bound_ms} ms" if late
                   else f"every answer within {self.bench.bound_ms} ms (slowest {slowest:.0f} ms)")


def _ledger_diff(before: Any, after: Any) -> str:
    if isinstance(before, list) and isinstance(after, list):
        added = [r for r in after if r not in before]
        removed = [r for r in before if r not in after]
        return f"{len(added)} row(s) new or changed, {len(removed)} gone: {_short(added[:2])}"
    return f"{_short(before)} -> {_short(after)}"
