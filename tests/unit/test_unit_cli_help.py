"""The command line's own text: help that shows what it says, options that exist."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from crashmatrix.harness import cli

runner = CliRunner()


def test_replay_help_shows_the_example_case_id_whole() -> None:
    """Rich markup once ate ``[turn-4.tool-0]`` from the example, and the id shown failed to parse."""
    out = runner.invoke(cli.app, ["replay", "--help"], env={"COLUMNS": "240"}).output
    assert "kill@log.append.before[turn-4.tool-0]#1" in out, out


def test_toxiproxy_server_passes_every_option_and_refuses_unknown_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    import crashmatrix.harness.faultproxy as faultproxy

    monkeypatch.setattr(faultproxy, "main", lambda argv: seen.append(list(argv)) or 0)
    result = runner.invoke(cli.app, ["toxiproxy-server", "--host", "0.0.0.0", "--port", "0", "--allow-non-loopback",
                                     "--proxy-metrics", "--reset-peer-linger", "on-fire"])
    assert result.exit_code == 0, result.output
    assert seen == [["--host", "0.0.0.0", "--port", "0", "--seed", "0", "--reset-peer-linger", "on-fire",
                     "--allow-non-loopback", "--proxy-metrics"]]
    typo = runner.invoke(cli.app, ["toxiproxy-server", "--prot", "1"])
    assert typo.exit_code == 2 and len(seen) == 1
