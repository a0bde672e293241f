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


@pytest.mark.parametrize("columns", ["80", "240"])
def test_help_shows_bracketed_examples_whole_at_any_width(columns: str) -> None:
    """An 80-column terminal gets click's plain help (rich's boxes would cut option
    names), which prints a rich escape as it is: the example id must not carry one."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": columns}
    for command, shown in ((["replay", "--help"], "log.append.before[turn-4.tool-0]#1"),
                           (["run", "--help"], "[LABEL=]SUBJECT[@DIR]")):
        out = subprocess.run([sys.executable, "-c", "from crashmatrix.harness.cli import main; main()", *command],
                             env=env, capture_output=True, text=True, timeout=120).stdout
        assert shown in out and "\\[" not in out, out


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


@pytest.mark.parametrize("command", ["run", "replay", "selftest", "conformance", "init"])
def test_help_into_a_pipe_shows_every_option_name_whole(command: str) -> None:
    """``crashmatrix run --help | cat`` (no terminal, $COLUMNS 80): the help is laid out
    wider than a terminal would be, so no option name is cut (``--max-failures-sho…``)."""
    import os
    import subprocess
    import sys

    import typer.main

    env = {k: v for k, v in os.environ.items() if k != "TERMINAL_WIDTH"}
    env["COLUMNS"] = "80"
    out = subprocess.run([sys.executable, "-m", "crashmatrix.harness.cli", command, "--help"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    click_command = typer.main.get_command(cli.app).commands[command]  # type: ignore[attr-defined]
    names = [o for p in click_command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
    assert names
    missing = [n for n in names if n not in out.replace("…", " ").split()
               and not any(n in token.split(",") or n in token.split("/") for token in out.split())]
    assert not missing, missing
    assert "…" not in out


def test_list_names_one_registry_a_line_and_refuses_an_unknown_list() -> None:
    """``crashmatrix list kinds`` prints the fault kinds one a line in listing order (what
    README's usage line points at instead of listing them); an unknown list is exit 2."""
    from crashmatrix.harness import faults, plan

    kinds = runner.invoke(cli.app, ["list", "kinds"])
    assert kinds.exit_code == 0 and kinds.output.split() == list(faults.names()), kinds.output
    policies = runner.invoke(cli.app, ["list", "policies"])
    assert policies.output.split() == list(plan.RESUME_POLICIES), policies.output
    every = runner.invoke(cli.app, ["list"])
    assert every.exit_code == 0 and [line.split(":")[0] for line in every.output.splitlines()] == list(cli.LISTS)
    wrong = runner.invoke(cli.app, ["list", "kind"])
    assert wrong.exit_code == 2 and "unknown list 'kind'" in wrong.output, wrong.output


def test_a_run_of_several_workloads_ends_with_one_line_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """``crashmatrix run`` without a workload runs two matrices, each with its own
    summary; the last line gives both verdicts and the exit code, the worst first."""
    from crashmatrix.harness import matrix
    from crashmatrix.harness.case import CaseResult
    from crashmatrix.harness.plan import Case

    outcomes = {"checkout": ["pass", "pass"], "support_desk": ["pass", "fail", "flaky"]}

    async def fake_run(settings, *, on_start=None, on_result=None, on_report=None):  # the services are not the point
        names = settings.names
        report = matrix.MatrixReport(names.workload, names.subject, names.kinds, names.sources, {})
        conv = "conv1" if names.workload == "checkout" else "exchange"
        report.results = [CaseResult(Case.parse(f"{names.workload}/{conv}/kill@step.after[turn-{i}]#1"), names.subject, o)
                          for i, o in enumerate(outcomes[names.workload], 1)]
        return report

    monkeypatch.setattr(matrix, "run", fake_run)
    result = runner.invoke(cli.app, ["run", "--kinds", "kill"], env={"COLUMNS": "240"})
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1, result.output
    assert last == ("crashmatrix: checkout passed (2 cases, 2 passed); "
                    "support_desk FAILED (3 cases, 1 passed, 1 failed, 1 flaky): exit 1"), last
