"""crashmatrix.harness.crashpoint: the hook, logical tasks and their inheritance."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
from collections.abc import Iterator

import pytest

from crashmatrix.harness import crashpoint as cp


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    cp.disarm()
    yield
    cp.disarm()


def test_disarmed_is_a_noop() -> None:
    assert cp._hook is None
    assert cp.crashpoint("effect.started") is None
    assert cp.logical_task() == "run"


def test_armed_hook_receives_name_and_logical_task() -> None:
    seen: list[tuple[str, str]] = []
    cp.arm(lambda name, task: seen.append((name, task)))
    cp.crashpoint("a")
    token = cp.set_logical_task("turn-3.tool-1")
    try:
        cp.crashpoint("b")
    finally:
        cp.reset_logical_task(token)
    cp.crashpoint("c")
    assert seen == [("a", "run"), ("b", "turn-3.tool-1"), ("c", "run")]


def test_crashpoint_for_names_the_task_inside_the_hook_and_leaves_the_context_as_it_was() -> None:
    """The hook sees the given task both as its argument and as the context's logical task
    (a hook that raises leaves the context restored too); disarmed, nothing is touched."""
    cp.crashpoint_for("turn-2", "node.launch")  # disarmed: a no-op
    seen: list[tuple[str, str, str]] = []

    def hook(name: str, task: str) -> None:
        seen.append((name, task, cp.logical_task()))
        if name == "boom":
            raise RuntimeError("hook raised")

    cp.arm(hook)
    cp.crashpoint_for("turn-2", "node.launch")
    with pytest.raises(RuntimeError):
        cp.crashpoint_for("turn-3", "boom")
    cp.crashpoint("after")
    assert seen == [("node.launch", "turn-2", "turn-2"), ("boom", "turn-3", "turn-3"), ("after", "run", "run")]


def test_disarm_stops_calls_and_rearm_replaces() -> None:
    first: list[str] = []
    second: list[str] = []
    cp.arm(lambda n, t: first.append(n))
    cp.crashpoint("x")
    cp.arm(lambda n, t: second.append(n))
    cp.crashpoint("y")
    cp.disarm()
    cp.crashpoint("z")
    assert first == ["x"] and second == ["y"]


def test_hook_exception_propagates_to_the_subject() -> None:
    class Fire(Exception):
        pass

    def hook(name: str, task: str) -> None:
        raise Fire(name)

    cp.arm(hook)
    with pytest.raises(Fire, match="log.append.before"):
        cp.crashpoint("log.append.before")


def test_nested_set_and_reset() -> None:
    t1 = cp.set_logical_task("turn-1")
    t2 = cp.set_logical_task("turn-1.tool-0")
    assert cp.logical_task() == "turn-1.tool-0"
    cp.reset_logical_task(t2)
    assert cp.logical_task() == "turn-1"
    cp.reset_logical_task(t1)
    assert cp.logical_task() == "run"


def test_logical_task_inherits_into_child_tasks_and_does_not_leak_back() -> None:
    seen: list[tuple[str, str]] = []
    cp.arm(lambda name, task: seen.append((name, task)))

    async def grandchild() -> None:
        await asyncio.sleep(0)
        cp.crashpoint("grandchild")

    async def child(node: str | None) -> None:
        if node is not None:
            cp.set_logical_task(node)  # never reset: the task's context copy dies with it
        await asyncio.sleep(0)
        cp.crashpoint("child")
        await asyncio.create_task(grandchild())

    async def main() -> None:
        token = cp.set_logical_task("turn-2")
        try:
            await asyncio.gather(child(None), asyncio.create_task(child("turn-2.tool-0")))
            cp.crashpoint("parent.after")
        finally:
            cp.reset_logical_task(token)
        cp.crashpoint("parent.reset")

    asyncio.run(main())
    assert sorted(seen) == sorted([
        ("child", "turn-2"),
        ("grandchild", "turn-2"),
        ("child", "turn-2.tool-0"),
        ("grandchild", "turn-2.tool-0"),
        ("parent.after", "turn-2"),
        ("parent.reset", "run"),
    ])
    assert seen[-2:] == [("parent.after", "turn-2"), ("parent.reset", "run")]
    assert cp.logical_task() == "run"


def test_logical_task_in_copied_context() -> None:
    token = cp.set_logical_task("turn-5")
    try:
        ctx = contextvars.copy_context()
    finally:
        cp.reset_logical_task(token)
    assert ctx.run(cp.logical_task) == "turn-5"
    assert cp.logical_task() == "run"


def test_module_imports_nothing_heavy() -> None:
    """Subjects import crashpoint; it must not drag in the harness's dependencies."""
    code = (
        "import sys; import crashmatrix.harness.crashpoint as c; c.crashpoint('x');"
        "heavy = [m for m in ('asyncpg', 'aiohttp', 'typer', 'rich', 'anyio', 'google.protobuf',"
        " 'crashmatrix.harness.plan', 'crashmatrix.harness.oracle') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == ""


def test_the_labels_the_oracle_reads_are_constants_with_the_documented_names() -> None:
    """docs/adapters.md's table ("Names the oracle reads") and the module's constants
    name the same labels, each exported."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "adapters.md").read_text(encoding="utf-8")
    table = text.split("Names the oracle reads", 1)[1].split("\n\n", 2)[1]
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", table, re.M))
    constants = {getattr(cp, n): n for n in cp.__all__ if n.isupper()}
    assert len(documented) >= 5 and documented <= set(constants), documented - set(constants)
    # a constant is named after its label, so code that reads a label says which one
    assert all(value.upper().replace(".", "_") == name for value, name in constants.items()), constants
