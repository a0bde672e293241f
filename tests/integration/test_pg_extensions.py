"""A subject whose schema needs an extension: uuid-ossp (provided as SQL over built-ins)
prepares and runs on the embedded PostgreSQL; one the server lacks is one line at
``prepare`` naming it and ``--dsn``, exit 2, nothing left behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from test_cli import _leftovers

CLI = [sys.executable, "-m", "crashmatrix.harness.cli"]

SUBJECT = textwrap.dedent('''
    import asyncpg
    from crashmatrix.harness.adapters.reference import ReferenceAdapter


    class _Needs(ReferenceAdapter):
        extension = ""

        async def prepare(self, env):
            conn = await asyncpg.connect(env.dsn)
            try:
                await conn.execute(f'CREATE EXTENSION IF NOT EXISTS "{self.extension}"')
                assert (await conn.fetchval("SELECT uuid_generate_v4()")).version == 4
            finally:
                await conn.close()
            await super().prepare(env)


    class UuidOssp(_Needs):
        extension = "uuid-ossp"


    class Postgis(_Needs):
        extension = "postgis"
''')


def test_a_schema_extension_prepares_or_is_named_in_one_line(cli_env, test_tag, tmp_path) -> None:
    (tmp_path / "needsext.py").write_text(SUBJECT)
    cli_env["PYTHONPATH"] = str(tmp_path)
    ok = subprocess.run([*CLI, "run", "checkout", "--subject", "needsext:UuidOssp", "--conversation", "conv1",
                         "--kinds", "kill", "--sources", "step", "--replay-failures", "0"],
                        env=cli_env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout[-1500:] + ok.stderr[-1500:]
    bad = subprocess.run([*CLI, "run", "checkout", "--subject", "needsext:Postgis", "--conversation", "conv1"],
                         env=cli_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 2, bad.stdout[-1500:] + bad.stderr[-1500:]
    lines = [line for line in bad.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and 'no extension "postgis"' in lines[0] and "--dsn" in lines[0], bad.stderr
    assert _leftovers(test_tag, tmp_path) == ([], [])
