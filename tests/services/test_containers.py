"""The container backend (harness/services/containers.py) on a real engine: PostgreSQL
from an image, crashed and restarted by the engine, removed afterwards, whatever happens;
and bad input (no engine, an engine that does not answer, an image that does not exist,
a port the container never opens) as one line, with no container left.

The tests that need an engine run where testcontainers reaches one ($DOCKER_HOST or the
Docker socket) and the image :data:`DEFAULT_PG_IMAGE` is present; elsewhere they skip,
unless ``CRASHMATRIX_REQUIRE_ENGINE=1`` (.ci/containers sets it), which turns the skip into a
failure."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from crashmatrix.harness.errors import InvalidArgument, ServiceError
from crashmatrix.harness.services import containers
from crashmatrix.harness.services.containers import (
    DEFAULT_PG_IMAGE, LABEL, resolve_services, start_container_postgres,
)
from crashmatrix.harness.services.matrixpg import MATRIX_PG_SETTINGS, MatrixPostgres, Workdir
from crashmatrix.harness.services.postgres import DSN_ENV

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]


def _engine_or_skip() -> None:
    try:
        client = containers._engine()
        try:
            client.client.images.get(DEFAULT_PG_IMAGE)
        finally:
            client.client.close()
    except Exception as exc:  # noqa: BLE001 - any reason there is no engine here
        if os.environ.get("CRASHMATRIX_REQUIRE_ENGINE") == "1":
            pytest.fail(f"CRASHMATRIX_REQUIRE_ENGINE=1 but no engine with {DEFAULT_PG_IMAGE}: {exc}")
        pytest.skip(f"no container engine with {DEFAULT_PG_IMAGE}: {exc}")


@pytest.fixture
def engine() -> None:
    _engine_or_skip()


def _ours(pid: int | None = None) -> list[str]:
    """Names of the containers (running or not) labelled with ``pid`` (default: this process)."""
    import docker

    client = docker.from_env()
    try:
        found = client.containers.list(all=True, filters={"label": f"{LABEL}={pid or os.getpid()}"})
        return [c.name for c in found]
    finally:
        client.close()


async def _query(dsn: str, sql: str) -> object:
    """The first value of ``sql``'s last statement (several statements: executed, None)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return await (conn.execute(sql) if ";" in sql else conn.fetchval(sql))
    finally:
        await conn.close()


# -- no engine needed -------------------------------------------------------------------


def test_services_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(containers.SERVICES_ENV, raising=False)
    assert resolve_services(None) == "embedded"
    assert resolve_services("containers") == "containers"
    monkeypatch.setenv(containers.SERVICES_ENV, "containers")
    assert resolve_services(None) == "containers"
    with pytest.raises(InvalidArgument, match=r"--services 'docker': must be one of embedded, containers"):
        resolve_services("docker")
    monkeypatch.setenv(containers.SERVICES_ENV, "k8s")
    with pytest.raises(InvalidArgument, match=r"\$CRASHMATRIX_SERVICES 'k8s'"):
        resolve_services(None)


def test_no_engine_is_one_line_naming_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/absent.sock")
    with pytest.raises(ServiceError) as caught:
        start_container_postgres()
    text = str(caught.value)
    assert "\n" not in text
    assert f"no container engine: $DOCKER_HOST names {tmp_path}/absent.sock" in text
    assert "install Docker" in text and "podman system service" in text


def test_an_engine_socket_that_does_not_answer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening: every connection is refused
        monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
        with pytest.raises(ServiceError, match=r"the container engine at unix://.*dead.sock does not answer "
                                               r"\(connection refused\); install Docker"):
            start_container_postgres()


def test_cli_without_an_engine_exits_2_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/absent.sock", "TMPDIR": str(tmp_path)}
    env.pop(DSN_ENV, None)
    proc = subprocess.run([*CLI, "run", "checkout", "--services", "containers", "--conversation", "conv1",
                           "--kinds", "kill"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crashmatrix: error: no container engine"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


_WITHOUT_THE_EXTRA = textwrap.dedent("""
    import sys

    class Missing:  # as in an environment without crashmatrix[containers]
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("docker", "testcontainers"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Missing())
    from crashmatrix.harness.cli import main

    sys.argv = ["crashmatrix", "run", "checkout", "--services", "containers", "--conversation", "conv1",
                "--kinds", "kill"]
    main()
""")


def test_cli_without_the_containers_extra_says_how_to_get_it(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop(DSN_ENV, None)
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_THE_EXTRA], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "crashmatrix: error: --services containers needs testcontainers: pip install 'crashmatrix[containers]'")
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--services", "docker"], "--services 'docker': must be one of embedded, containers"),
    (["--pg-image", "postgres:17"], "--pg-image needs --services containers"),
    (["--services", "containers", "--dsn", "postgresql://u@127.0.0.1:1/x"], "give it or a DSN"),
])
def test_cli_bad_service_options(tmp_path: Path, args: list[str], message: str) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop(DSN_ENV, None)
    proc = subprocess.run([*CLI, "run", "checkout", "--conversation", "conv1", "--kinds", "kill", *args],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# -- on a real engine -------------------------------------------------------------------


def test_matrix_servers_from_containers_crash_restart_and_leave_nothing(engine: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    home = Workdir("crashmatrix-test-")
    pg = MatrixPostgres(home, services="containers")
    try:
        main = pg.start()
        assert pg.start() is main and pg.restartable and not main.embedded
        assert asyncio.run(_query(main.dsn, "SHOW fsync")) == MATRIX_PG_SETTINGS["fsync"]
        assert asyncio.run(_query(main.dsn, "SHOW server_encoding")) == "UTF8"
        assert asyncio.run(_query(main.dsn, "SELECT current_database()")) == "crashmatrix"
        second = pg.start_restartable()
        try:
            assert second.port != main.port and len(_ours()) == 2
            asyncio.run(_query(second.dsn, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)"))
            port = second.port
            second.stop_immediate()
            assert not second.running
            with pytest.raises((OSError, asyncpg.PostgresError)):
                asyncio.run(_query(second.dsn, "SELECT 1"))
            second.start()  # crash recovery, same port, the committed row kept
            assert second.port == port and second.running
            assert asyncio.run(_query(second.dsn, "SELECT x FROM kept")) == 7
            assert second.timings["stop_immediate"] < 6 and second.timings["restart"] < 30
        finally:
            second.close()
        assert len(_ours()) == 1
    finally:
        pg.close()
        home.close()
    assert _ours() == []


def test_an_image_that_does_not_exist(engine: None) -> None:
    with pytest.raises(ServiceError, match=r"^image localhost/crashmatrix-no-such-image:0 is not present and "
                                           r"cannot be pulled: "):
        start_container_postgres("localhost/crashmatrix-no-such-image:0")
    assert _ours() == []


def test_a_port_the_container_never_opens(engine: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # PostgreSQL told to listen on 5433: the container runs, its port 5432 never opens
    monkeypatch.setenv(containers.TIMEOUT_ENV, "8")
    t0 = time.monotonic()
    with pytest.raises(ServiceError) as caught:
        start_container_postgres(settings={"port": "5433"})
    assert time.monotonic() - t0 < 40
    text = str(caught.value)
    assert f"the PostgreSQL container of {DEFAULT_PG_IMAGE} never opened port 5432" in text
    assert "within 8 s ($CRASHMATRIX_CONTAINER_TIMEOUT)" in text and "\n" not in text
    assert _ours() == []


def test_a_container_that_exits_names_its_log(engine: None) -> None:
    with pytest.raises(ServiceError, match=r"exited \(exit code \d+\) before it accepted a connection; "
                                           r"its log ends: .*no_such_setting"):
        start_container_postgres(settings={"no_such_setting": "1"})
    assert _ours() == []


def test_a_sigkilled_controller_leaves_no_container(engine: None, tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import os, signal, sys
        from crashmatrix.harness.services.matrixpg import MatrixPostgres, Workdir
        home = Workdir("crashmatrix-test-")
        pg = MatrixPostgres(home, services="containers").start()
        print(pg.container_id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop(DSN_ENV, None)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL and out.strip(), out
    deadline = time.monotonic() + 30
    while _ours(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ours(proc.pid) == []


def test_the_fault_proxy_is_toxiproxy_from_its_image(engine: None, tmp_path: Path) -> None:
    import threading

    from crashmatrix.harness.netfaults import FaultProxyService

    try:
        containers._present(containers.DEFAULT_TOXIPROXY_IMAGE)
    except ServiceError as exc:
        if os.environ.get("CRASHMATRIX_REQUIRE_ENGINE") == "1":
            raise
        pytest.skip(str(exc))
    with socket.socket() as upstream:  # an echo server on this machine's loopback
        upstream.bind(("127.0.0.1", 0))
        upstream.listen()

        def echo() -> None:
            conn, _ = upstream.accept()
            with conn:
                conn.sendall(conn.recv(100))

        threading.Thread(target=echo, daemon=True).start()
        service = FaultProxyService(tmp_path, None, seed=5, services="containers")
        try:
            client = asyncio.run(service.client())
            assert client.version() == "2.12.0"  # Shopify's, not the embedded "2.12.0+crashmatrix"
            assert [n for n in _ours() if n.startswith("crashmatrix-toxiproxy-")]
            proxy = client.create(f"127.0.0.1:{upstream.getsockname()[1]}", "cm-test-echo", "127.0.0.1:0")
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as through:
                through.sendall(b"through toxiproxy")
                assert through.recv(100) == b"through toxiproxy"
        finally:
            service.close()
    assert _ours() == []


def _inner_pytest(project: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRASHMATRIX_", "PYTEST_"))}
    env["TMPDIR"] = str(tmp_path)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin",
                           "-q", *args], cwd=project, env=env, capture_output=True, text=True, timeout=600)


def test_the_pytest_plugin_runs_db_restart_cases_on_containers(engine: None, tmp_path: Path) -> None:
    import shutil

    project = tmp_path / "user_project"
    shutil.copytree(Path(__file__).resolve().parents[1] / "plugin" / "user_project", project)
    ran = _inner_pytest(project, tmp_path, "--crashmatrix-services", "containers", "--crashmatrix-kinds", "db-restart",
                        "--crashmatrix-shard", "1/10")
    assert ran.returncode == 0 and " passed" in ran.stdout, ran.stdout[-2000:] + ran.stderr[-2000:]
    # the setting reaches the server: an image that does not exist fails the items, naming it
    bad = _inner_pytest(project, tmp_path, "--crashmatrix-services", "containers", "--crashmatrix-pg-image",
                        "localhost/crashmatrix-no-such-image:0", "--crashmatrix-kinds", "kill",
                        "--crashmatrix-shard", "1/40")
    assert bad.returncode != 0
    assert "image localhost/crashmatrix-no-such-image:0 is not present and cannot be pulled" in bad.stdout + bad.stderr


def test_the_ci_template_uses_options_the_cli_has() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2]
    job = yaml.safe_load((root / "ci" / "containers.yml").read_text())["jobs"]["matrix-on-your-postgres"]
    command = next(step["run"] for step in job["steps"] if "crashmatrix run" in str(step.get("run")))
    assert "--services containers --pg-image" in command
    assert "crashmatrix[containers]" in job["env"]["CRASHMATRIX"]
    help_text = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    assert "--services" in help_text and "--pg-image" in help_text


SLEEPER = "localhost/crashmatrix-test-sleeper:2"
"""An image that runs and never listens: the PostgreSQL image with ``sleep`` as its entrypoint
(the arguments a PostgreSQL container gets, ignored)."""


def _sleeper() -> str:
    import io

    import docker

    client = docker.from_env()
    try:
        try:
            client.images.get(SLEEPER)
        except docker.errors.ImageNotFound:
            containerfile = f'FROM {DEFAULT_PG_IMAGE}\nENTRYPOINT ["sh", "-c", "exec sleep infinity", "sleeper"]\n'.encode()
            client.images.build(fileobj=io.BytesIO(containerfile), tag=SLEEPER, rm=True)
    finally:
        client.close()
    return SLEEPER


@pytest.mark.parametrize(("image", "message"), [
    ("localhost/crashmatrix-no-such-image:0", "image localhost/crashmatrix-no-such-image:0 is not present and cannot "
                                              "be pulled: "),
    (SLEEPER, f"the PostgreSQL container of {SLEEPER} never opened port 5432 (127.0.0.1:"),
])
def test_cli_bad_image_exits_2_with_one_line_and_no_container(engine: None, tmp_path: Path, image: str,
                                                              message: str) -> None:
    if image == SLEEPER:
        _sleeper()
    env = {**os.environ, "TMPDIR": str(tmp_path), containers.TIMEOUT_ENV: "5"}
    env.pop(DSN_ENV, None)
    proc = subprocess.Popen([*CLI, "run", "checkout", "--services", "containers", "--pg-image", image,
                             "--conversation", "conv1", "--kinds", "kill"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"crashmatrix: error: {message}"), err
    assert _ours(proc.pid) == []
