"""``crashmatrix upgrade-check``: the CI gate for a deploy (docs/plugin.md, "Upgrade
check").

Runs the matrix with the base commit crashing and the working tree resuming: every run
the base build leaves behind must be finished by the new build, or parked by it with a
reason (:mod:`.builds`, check ``upgrade.migrated``). The CI shape of airbyte issue 10742
("replay recent histories against the PR's code"), done by crashing instead of by
recorded histories:

1. :func:`base_commit`: the base ref (``main`` by default) as a commit of the repository;
2. :func:`check_out`: its tree into a directory of its own (``git archive``: nothing in
   the repository changes, no worktree is registered);
3. :func:`build_environment`: a virtual environment there, and the install command in it
   (default ``{python} -m pip install {dir}``: the base tree as a package with its
   dependencies; a project that depends on crashmatrix brings it);
4. the matrix, ``--subject base=SUBJECT@DIR/.venv --resume-with head=SUBJECT`` (the head
   is the controller's own environment: the working tree as installed).

A directory whose marker (``.crashmatrix-base``) names the same commit and install
command is reused as it is (a local rerun skips the install). Errors are one line
(:class:`~.errors.InvalidArgument`: a ref that is not a commit, a repository that is not
one; :class:`~.errors.HarnessError`: a failed checkout or install, with the tail of its
output).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import HarnessError, InvalidArgument

DEFAULT_INSTALL = "{python} -m pip install -q {dir}"
"""The install command run in the base's virtual environment; ``{python}`` and ``{dir}``
are its interpreter and the checked-out tree."""
MARKER = ".crashmatrix-base"


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise InvalidArgument(f"git {' '.join(args)} in {repo}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc.stdout.strip()


def base_commit(repo: Path, ref: str) -> str:
    """The full commit id of ``ref`` in ``repo``. Raises :class:`InvalidArgument` when
    ``repo`` is not a git repository or ``ref`` names no commit."""
    if shutil.which("git") is None:
        raise InvalidArgument("upgrade-check needs git on the PATH")
    _git(repo, "rev-parse", "--show-toplevel")
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except InvalidArgument:
        raise InvalidArgument(f"--base={ref!r} is not a commit of {repo} (fetch it first: git fetch origin {ref})") from None


def default_directory(repo: Path, commit: str) -> Path:
    """Where the base is built unless told otherwise: the repository's
    ``.crashmatrix_cache/upgrade/<commit>`` (ignored by git: the cache carries its own
    ``.gitignore``)."""
    cache = Path(repo) / ".crashmatrix_cache"
    cache.mkdir(exist_ok=True)
    ignore = cache / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    return cache / "upgrade" / commit[:12]


def _marker(commit: str, install: str) -> str:
    return json.dumps({"commit": commit, "install": install}, sort_keys=True)


def check_out(repo: Path, commit: str, directory: Path) -> None:
    """Write the tree of ``commit`` into ``directory`` (emptied first). Raises
    :class:`HarnessError` when git cannot."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert archive.stdout is not None
    untar = subprocess.run(["tar", "-x", "-C", str(directory)], stdin=archive.stdout, capture_output=True)
    archive.stdout.close()
    _, err = archive.communicate()
    if archive.returncode != 0 or untar.returncode != 0:
        raise HarnessError(f"cannot check out {commit[:12]} into {directory}: "
                           f"{(err or untar.stderr).decode(errors='replace').strip()[-400:]}")


def build_environment(directory: Path, install: str = DEFAULT_INSTALL, python: str | None = None) -> Path:
    """A virtual environment ``directory/.venv`` with ``install`` run in it (its
    placeholders filled); returns the environment's directory. Raises
    :class:`HarnessError` with the tail of the output when a step fails."""
    venv = directory / ".venv"
    steps = [[python or sys.executable, "-m", "venv", str(venv)]]
    filled = install.format(python=shlex.quote(str(venv / "bin" / "python")), dir=shlex.quote(str(directory)))
    steps.append(["sh", "-c", filled])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for argv in steps:
        proc = subprocess.run(argv, cwd=directory, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise HarnessError(f"building the base environment failed at {shlex.join(argv)!r} "
                               f"(exit {proc.returncode}):\n{tail}")
    return venv


def prepare_base(repo: Path, ref: str, directory: Path | None = None, install: str = DEFAULT_INSTALL,
                 python: str | None = None, log: object = None) -> tuple[str, Path]:
    """Check out ``ref`` of ``repo`` and build its environment (or reuse a directory
    built for the same commit and install command); returns ``(commit, venv)``.
    ``log(line)``: progress lines. Raises as :func:`base_commit`, :func:`check_out` and
    :func:`build_environment` do."""
    say = log if callable(log) else (lambda line: None)
    repo = Path(repo).resolve()
    commit = base_commit(repo, ref)
    directory = Path(directory).resolve() if directory is not None else default_directory(repo, commit)
    marker = directory / MARKER
    venv = directory / ".venv"
    if marker.exists() and marker.read_text() == _marker(commit, install) and (venv / "bin" / "python").exists():
        say(f"base {ref} ({commit[:12]}): reusing {directory}")
        return commit, venv
    say(f"base {ref} ({commit[:12]}): checking out into {directory}")
    check_out(repo, commit, directory)
    say(f"base {ref} ({commit[:12]}): building its environment ({install})")
    build_environment(directory, install, python)
    marker.write_text(_marker(commit, install))
    return commit, venv
