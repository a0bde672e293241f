"""The CI templates' install step, run for real (marked ``install``).

``ci/github-actions.yml`` and ``ci/gitlab-ci.yml`` install crashmatrix, which no package
index serves yet, from its repository by a pinned git URL in ``$CRASHMATRIX``
(docs/plugin.md, "In other teams' CI"). For each template this test takes the install
step's shell line as written, points ``$CRASHMATRIX`` at this repository's own commit
(``crashmatrix @ git+file://localhost/REPO@COMMIT``: the template's pip syntax with
a local URL; a host is given because pip 23's URL check refuses an empty one), and runs it with bash in a fresh virtual
environment from a stand-in team project (the ``.`` the line also installs). pip
clones the repository, checks the commit out, builds the wheel and installs both
projects. ``PIP_NO_DEPS=1`` keeps it to seconds: the point is the install line, not
the dependency tree (the build requirements still come from the index).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = "crashmatrix @ git+https://github.com/YOUR-ORG/crashmatrix@COMMIT"


def _github() -> tuple[str, str]:
    job = yaml.safe_load((ROOT / "ci" / "github-actions.yml").read_text())["jobs"]["kill-matrix"]
    step = next(s for s in job["steps"] if s.get("name") == "Install")
    return step["run"], job["env"]["CRASHMATRIX"]


def _gitlab() -> tuple[str, str]:
    job = yaml.safe_load((ROOT / "ci" / "gitlab-ci.yml").read_text())["crashmatrix"]
    return job["script"][0], job["variables"]["CRASHMATRIX"]


@pytest.fixture(scope="module")
def pip_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip's cache for this module's installs: the first builds crashmatrix's wheel from
    the commit, the second reuses it (pip caches wheels of a pinned VCS commit); not
    the user's cache, so the first install really builds."""
    return tmp_path_factory.mktemp("pip-cache")


def _commit() -> str:
    if shutil.which("git") is None:
        pytest.fail("git is needed to install crashmatrix from its repository (apt-get install git)")
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert proc.returncode == 0, f"{ROOT} is not a git checkout: {proc.stderr.strip()}"
    return proc.stdout.strip()


@pytest.mark.install
@pytest.mark.parametrize("template", [_github, _gitlab], ids=["github-actions", "gitlab-ci"])
def test_template_install_step_installs_crashmatrix_from_the_repository(tmp_path: Path, pip_cache: Path,
                                                                        template) -> None:
    line, spec = template()
    assert spec == PLACEHOLDER  # what the team fills in: its URL and commit
    assert '"$CRASHMATRIX"' in line and line.split()[:4] == ["python", "-m", "pip", "install"], line
    commit = _commit()
    team = tmp_path / "team"
    (team / "teamagent").mkdir(parents=True)
    (team / "teamagent" / "__init__.py").write_text("")
    (team / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=68"]\n'
                                         'build-backend = "setuptools.build_meta"\n\n'
                                         '[project]\nname = "teamagent"\nversion = "0.0.1"\n')
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), PIP_NO_DEPS="1",
               CRASHMATRIX=f"crashmatrix @ git+file://localhost{ROOT}@{commit}", TMPDIR=str(tmp_path),
               PIP_CACHE_DIR=str(pip_cache))
    proc = subprocess.run(["bash", "-e", "-c", line], cwd=team, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"

    probe = ("import importlib.metadata as m, json\n"
             "d = m.distribution('crashmatrix')\n"
             "print(json.dumps({'version': d.version, 'direct_url': json.loads(d.read_text('direct_url.json')),\n"
             "    'team': m.version('teamagent'), 'entry_points': sorted(f'{e.group}:{e.name}' for e in d.entry_points),\n"
             "    'files': [str(f) for f in d.files if str(f).endswith('harness/plugin.py')]}))\n")
    # from the team's directory: run from this checkout, metadata would find its egg-info
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=team, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert got["version"] == version and got["team"] == "0.0.1"
    assert got["direct_url"]["url"] == f"file://localhost{ROOT}" and got["direct_url"]["vcs_info"]["commit_id"] == commit
    assert {"console_scripts:crashmatrix", "pytest11:crashmatrix"} <= set(got["entry_points"])
    assert got["files"] == ["crashmatrix/harness/plugin.py"]
    assert (venv / "bin" / "crashmatrix").is_file()
