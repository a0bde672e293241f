"""Two builds in one matrix: a run crashes under build A and resumes under build B.

The deploy between the crash and the resume (docs/design.md, "Sources": seed 000's first
library upgrade, after which every in-flight run died because its checkpoints named a
class by an old module path). A *build* is a subject as one interpreter and path import
it; a session with two runs build A's zygote for the golden runs and every case's first
worker, and build B's zygote (a second one, started from B's interpreter and path) for
every resume (docs/architecture.md, "builds.py").

**Build specs** (``--subject`` and ``--resume-with``)::

    [LABEL=]SUBJECT[@DIR]

``SUBJECT`` is a subject as that build knows it (a registered name or
``module:AdapterClass``); ``DIR`` is a virtual environment (``DIR/bin/python`` runs the
build, with what is installed there: the usual CI shape, "main" checked out and built
beside "this PR") or a source tree (put first on the path of the controller's
interpreter); without it the build is the controller's own environment. ``LABEL`` names
the build in case ids (default: the directory's name, or the subject's). The session's
subject is the pair, ``A_SPEC>>B_SPEC`` (:func:`pair`), so everything keyed by subject
(reports, the plugin's harnesses, the golden cache) keys the pair.

**What runs where.** Workers of build A (the golden runs, each case's first worker) and
of build B (every resume) are forked from their build's zygote; a job names its build
(``Job.build``). The controller never imports a build: the adapter's controller-side
calls go to a short worker of the right build (:data:`SERVICE_ROLES`: ``observe``,
``prepare``, ``between``, ``describe``, ``cancel_run``, ``resume_cancelled``), so each
build reads what it can read: the golden run and a crash state left by A are observed
by A, the state after B's resume by B (:class:`BuildAdapter`). ``prepare`` runs A's,
then B's (B's migrations find A's schema, as a deploy does).

**Case ids** carry both labels, ``WORKLOAD/CONV/PLAN/upgrade:A>B``
(:class:`.plan.Case`), and replay with ``--subject A_SPEC --resume-with B_SPEC``.

**The check** ``upgrade.migrated`` (:func:`check_migrated`): every run crashed under A
finishes under B with the golden run's status, or B parks it in a status the subject
declares for "cannot migrate" (``Adapter.cannot_migrate_statuses``) with its reason
(``Observation.detail``). A run B leaves stranded (``running``, ``interrupted``), fails,
or whose resume worker crashed is a failure of the pair. The usual checks judge the rest
against A's golden run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .adapter import Adapter, EffectEntry, Environment, InvocationEntry, LogEntry, Observation, RunContext
from .checks import Check
from .errors import HarnessError, InvalidArgument

if TYPE_CHECKING:
    from .case import CaseResult
    from .oracle import Evidence, Verdict
    from .plan import Case
    from .pool import WorkerExit
    from .worker import Job

PAIR = ">>"
"""Joins the two builds' specs into the session's subject: ``A_SPEC>>B_SPEC``."""
UPGRADE_PREFIX = "upgrade:"
"""How a case id's build component starts: ``.../upgrade:A>B``."""
SERVICE_ROLES = ("observe", "prepare", "between", "describe", "cancel_run", "resume_cancelled")
"""Job roles that call the adapter's controller-side methods in a worker of a build."""
DECLARATIONS = ("expects_redelivery", "crash_loop_status", "lease_seconds", "takes_over_live_owner",
                "long_lived_workers", "answers_operator", "subject_packages", "recovery_branches", "cancel_is_final",
                "recovery_point", "recovers_other_executor")
"""The adapter's declarations a ``describe`` service job reports besides its name,
capabilities, ``cannot_migrate_statuses`` and ``identifier_fields`` (what the controller reads of an
adapter it does not import: :class:`EnvAdapter`)."""
SERVICE_TIMEOUT = 60.0
"""Seconds a service worker may take (an observe, a prepare)."""
_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_VENV_NAMES = (".venv", "venv", "env", ".env")


@dataclass(frozen=True)
class Build:
    """One build: its ``label`` (in case ids), the ``subject`` its interpreter imports,
    the interpreter (``python``; None: the controller's) and the directories put first
    on its path (``path``), and the ``spec`` it was given as."""

    label: str
    subject: str
    python: str | None = None
    path: tuple[str, ...] = ()
    spec: str = ""

    @property
    def where(self) -> str:
        """Where the build comes from, in words."""
        if self.python:
            return f"the interpreter {self.python}"
        if self.path:
            return f"the source tree {self.path[0]}"
        return "the controller's environment"


@dataclass(frozen=True)
class Upgrade:
    """A build pair: runs crash under ``crash`` (A) and resume under ``resume`` (B)."""

    crash: Build
    resume: Build
    #: what each build declares (:meth:`BuildAdapter.describe`), by label
    declared: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        """``A>B``: the case-id component's labels."""
        return f"{self.crash.label}>{self.resume.label}"

    @property
    def subject(self) -> str:
        return pair(self.crash.spec, self.resume.spec)

    def build(self, label: str) -> Build:
        return self.crash if label == self.crash.label else self.resume

    def for_role(self, role: str) -> Build:
        """A worker's build: ``start`` (the golden runs, a case's first worker) is A's,
        ``resume`` B's."""
        return self.crash if role == "start" else self.resume


def pair(subject: str, resume_with: str) -> str:
    """The session subject of a build pair (module docstring)."""
    return f"{subject}{PAIR}{resume_with}"


def split(subject: str) -> tuple[str, str] | None:
    """``(A_SPEC, B_SPEC)`` of a pair subject, None for a single subject."""
    if PAIR not in subject:
        return None
    a, _, b = subject.partition(PAIR)
    return a, b


def parse_build(text: str, *, where: str = "build") -> Build:
    """A build spec (module docstring) as a :class:`Build`. Raises
    :class:`InvalidArgument` naming what is wrong (an empty subject, a directory that
    does not exist or is neither a virtual environment nor a source tree, a bad
    label)."""
    spec = text.strip()
    label = ""
    head, eq, rest = spec.partition("=")
    if eq and _LABEL_RE.fullmatch(head) and ":" not in head:
        label, body = head, rest
    else:
        body = spec
    subject, at, location = body.partition("@")
    subject = subject.strip()
    if not subject:
        raise InvalidArgument(f"{where}={text!r}: no subject (expected [LABEL=]SUBJECT[@DIR])")
    if any(c.isspace() for c in subject):
        raise InvalidArgument(f"{where}={text!r}: {subject!r} is not a subject name (expected [LABEL=]SUBJECT[@DIR], "
                              f"LABEL of letters, digits, '_', '.' and '-')")
    python, path = None, ()
    if at:
        loc = Path(location).expanduser()
        if not loc.exists():
            raise InvalidArgument(f"{where}={text!r}: {location!r} does not exist (a virtual environment, an "
                                  f"interpreter or a source tree)")
        if loc.is_file() and os.access(loc, os.X_OK):  # a venv's python is a symlink: kept, not resolved
            loc = Path(os.path.abspath(loc))
            python = str(loc)
            default = loc.parent.parent.name if loc.parent.name == "bin" else loc.name
        elif ((loc := loc.resolve()) / "bin" / "python").exists():
            python = str(loc / "bin" / "python")
            default = loc.parent.name if loc.name in _VENV_NAMES else loc.name
        elif loc.is_dir():
            path = (str(loc),)
            default = loc.name
        else:
            raise InvalidArgument(f"{where}={text!r}: {location!r} is neither a virtual environment, an interpreter "
                                  f"nor a source tree")
    else:
        default = subject.rsplit(":", 1)[-1]
    label = label or re.sub(r"[^A-Za-z0-9_.-]+", "-", default).strip("-.") or "build"
    if not _LABEL_RE.fullmatch(label):
        raise InvalidArgument(f"{where}={text!r}: label {label!r} must be letters, digits, '_', '.' and '-'")
    return Build(label, subject, python, path, spec)


def parse_subject(subject: str) -> Upgrade | None:
    """The build pair of a pair subject (:func:`pair`), None for a single subject.
    Raises :class:`InvalidArgument` for a bad spec or two builds with one label."""
    parts = split(subject)
    if parts is None:
        return None
    a = parse_build(parts[0], where="--subject")
    b = parse_build(parts[1], where="--resume-with")
    if a.label == b.label:
        if a.python == b.python and a.path == b.path:
            a, b = dataclasses.replace(a, label=f"{a.label}-a"), dataclasses.replace(b, label=f"{b.label}-b")
        else:
            raise InvalidArgument(f"the two builds are both labelled {a.label!r}: name them, LABEL=SUBJECT@DIR")
    return Upgrade(a, b)


def check_subject(subject: str, workload: str | None = None) -> None:
    """Validate a subject before anything starts: a single one is imported (the
    registry's errors); one in its own environment (``SUBJECT@DIR``, :func:`own_build`)
    is probed there (:func:`check_environment`, with ``workload``); of a pair, the builds
    of the controller's own environment are imported and the others' directories checked
    (their zygote imports them). Raises :class:`~.errors.RegistryError` or
    :class:`InvalidArgument`."""
    from . import registry

    own = own_build(subject)
    if own is not None:
        check_environment(own, workload)
        return
    upgrade = parse_subject(subject)
    if upgrade is None:
        registry.subject(subject)
        return
    for build in (upgrade.crash, upgrade.resume):
        if build.python is None and not build.path:
            registry.subject(build.subject)


def label_cases(cases: list[Case], upgrade: Upgrade | None) -> list[Case]:
    """``cases`` with the pair's label (their ids name both builds); unchanged for a
    single build."""
    if upgrade is None:
        return cases
    return [dataclasses.replace(c, upgrade=upgrade.label) for c in cases]


def check_case_label(case: Case, upgrade: Upgrade | None) -> None:
    """Raise :class:`~.errors.PlanError` when a case id's builds are not the session's
    (a replay needs the same ``--subject`` and ``--resume-with``)."""
    from .errors import PlanError

    want = upgrade.label if upgrade is not None else None
    if case.upgrade != want:
        if want is None:
            raise PlanError(f"case id {case.id!r} names the builds {case.upgrade}: give --subject A_SPEC and "
                            f"--resume-with B_SPEC for them")
        raise PlanError(f"case id {case.id!r} names {'the builds ' + case.upgrade if case.upgrade else 'no builds'}, "
                        f"but this session crashes under {upgrade.crash.label} and resumes under "
                        f"{upgrade.resume.label}")


def replay_options(subject: str) -> list[str]:
    """The ``--subject`` (and ``--resume-with``) arguments that replay on ``subject``."""
    parts = split(subject)
    if parts is None:
        return [] if subject == "reference" else ["--subject", subject]
    return ["--subject", parts[0], "--resume-with", parts[1]]


# -- controller side: pools and the adapter proxy --------------------------------------------


class BuildPools:
    """The session's worker pools, one zygote per build, behind the one ``run`` the
    explorer calls: a job goes to its build's zygote (``Job.build``). Remembers, per
    run, the build whose worker started last (whose code wrote last: it observes)."""

    def __init__(self, upgrade: Upgrade, pools: dict[str, Any]) -> None:
        self.upgrade = upgrade
        self.pools = pools
        self.last: dict[str, str] = {}

    async def run(self, job: Job, log_path: str, **kwargs: Any) -> WorkerExit:
        pool = self.pools.get(job.build)
        if pool is None:
            raise HarnessError(f"job {job.worker_id} names build {job.build!r}; this session has "
                               f"{', '.join(self.pools)}")
        if job.role not in SERVICE_ROLES:
            self.last[job.run_id] = job.build
        return await pool.run(job, log_path, **kwargs)

    def writer(self, run_id: str) -> Build:
        """The build whose worker ran ``run_id`` last (A before any worker ran)."""
        return self.upgrade.build(self.last.get(run_id, self.upgrade.crash.label))


class BuildAdapter(Adapter):
    """The adapter the controller holds in a two-build session: every call goes to a
    service worker of the build it belongs to (module docstring). ``workload``: the
    session's workload name; ``directory``: where service workers' files go."""

    name = "upgrade"

    def __init__(self, pools: BuildPools, workload: str, directory: Path) -> None:
        self.pools = pools
        self.workload = workload
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._n = 0

    @property
    def upgrade(self) -> Upgrade:
        return self.pools.upgrade

    @property
    def cannot_migrate_statuses(self) -> tuple[str, ...]:  # type: ignore[override]
        """What either build declares (B's parks a run A wrote; A's one B wrote, on a
        rollback pair)."""
        out: list[str] = []
        for build in (self.upgrade.resume, self.upgrade.crash):
            out += [s for s in self.upgrade.declared.get(build.label, {}).get("cannot_migrate_statuses", ())
                    if s not in out]
        return tuple(out)

    @property
    def identifier_fields(self) -> tuple[str, ...]:
        out: list[str] = []
        for build in (self.upgrade.crash, self.upgrade.resume):
            out += [f for f in self.upgrade.declared.get(build.label, {}).get("identifier_fields", ()) if f not in out]
        return tuple(out)

    @property
    def recovery_point(self) -> tuple[str, str] | None:  # type: ignore[override]
        """The resuming build's (B's) ``recovery_point``: its workers run the recovery."""
        said = self.upgrade.declared.get(self.upgrade.resume.label, {}).get("recovery_point")
        return (str(said[0]), str(said[1])) if said else None

    @property
    def recovers_other_executor(self) -> bool:  # type: ignore[override]
        """The resuming build's (B's) declaration: its workers run the recovery."""
        return bool(self.upgrade.declared.get(self.upgrade.resume.label, {}).get("recovers_other_executor"))

    async def call(self, build: Build, role: str, env: Environment, run_id: str = "-") -> Any:
        """Run adapter method ``role`` (:data:`SERVICE_ROLES`) in a worker of ``build``;
        its result as JSON data. Raises :class:`HarnessError` with the worker's error."""
        from .plan import FaultPlan
        from .worker import Job

        self._n += 1
        worker_id = f"cmb-{build.label}-{self._n}-{uuid.uuid4().hex[:6]}"
        base = self.directory / worker_id
        job = Job(role, build.subject, self.workload, "-", run_id, worker_id, env, FaultPlan(), f"{base}.json",
                  build=build.label)
        exit_ = await self.pools.run(job, f"{base}.log", timeout=SERVICE_TIMEOUT)
        try:
            text = Path(job.result_path).read_text()
        except FileNotFoundError:
            text = ""
        finally:
            for suffix in (".json", ".log"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{base}{suffix}")
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        done = next((e for e in lines if e.get("event") == "service"), None)
        if done is None:
            error = next((e for e in lines if e.get("event") == "service-error"), None)
            why = error["error"] if error else exit_.describe()
            raise HarnessError(f"build {build.label} ({build.where}): {role} failed: {why}")
        return done.get("result")

    async def describe(self) -> None:
        """Ask each build what its adapter declares (``cannot_migrate_statuses``,
        ``identifier_fields``, its capabilities), kept on the pair."""
        for build in (self.upgrade.crash, self.upgrade.resume):
            self.upgrade.declared[build.label] = await self.call(build, "describe", _NO_ENV)

    async def prepare(self, env: Environment) -> None:
        for build in (self.upgrade.crash, self.upgrade.resume):  # A's schema first, as before a deploy
            await self.call(build, "prepare", env)

    async def start(self, ctx: RunContext) -> str:  # pragma: no cover - workers import the build itself
        raise HarnessError("a build pair runs in its builds' workers, never in the controller")

    async def resume(self, ctx: RunContext) -> str:  # pragma: no cover
        raise HarnessError("a build pair runs in its builds' workers, never in the controller")

    async def observe(self, env: Environment, run_id: str) -> Observation:
        return observation_from_dict(await self.call(self.pools.writer(run_id), "observe", env, run_id))

    async def between_crash_and_resume(self, env: Environment, run_id: str) -> None:
        await self.call(self.upgrade.resume, "between", env, run_id)  # B's background jobs, after the deploy

    async def cancel_run(self, env: Environment, run_id: str) -> None:
        await self.call(self.pools.writer(run_id), "cancel_run", env, run_id)

    async def resume_cancelled(self, env: Environment, run_id: str) -> None:
        await self.call(self.upgrade.resume, "resume_cancelled", env, run_id)

    @property
    def cancel_is_final(self) -> bool:  # type: ignore[override]
        """What the resume build declares: it is the build a cancelled run would be
        resumed by."""
        return bool(self.upgrade.declared.get(self.upgrade.resume.label, {}).get("cancel_is_final"))

    def capabilities(self) -> frozenset[str]:  # type: ignore[override]
        """The pair's capabilities: the resuming build's (B's), except that a cancel API
        needs the crashing build's (A's) too, and restore, which is not routed to builds."""
        api = {"cancel-api", "cancel-final"}
        crash, resume = (self.build_capabilities(b) for b in (self.upgrade.crash, self.upgrade.resume))
        return frozenset((resume - api - {"restore"}) | (resume & api if crash & api else set()))

    def build_capabilities(self, build: Build) -> frozenset[str]:
        """What ``build``'s ``describe`` said it can be tested for. A build whose
        crashmatrix answered only whether it had a cancel API (``cancel_api``, before
        capabilities were reported) counts as the default adapter with that API."""
        said = self.upgrade.declared.get(build.label, {})
        if "capabilities" in said:
            return frozenset(said["capabilities"])
        api = ({"cancel-final" if said.get("cancel_is_final") else "cancel-api"} if said.get("cancel_api") else set())
        return frozenset({"cancel"} | api)


_NO_ENV = Environment("", {}, "")


# -- one subject in an environment of its own ---------------------------------------------

WORKER_NEEDS = {"anyio": "anyio>=4.4,<5"}
"""What crashmatrix's worker side (the zygote, :mod:`.worker`, :mod:`.resident`, the fault
kinds' ``act``) imports beyond the standard library, module -> requirement: all a
subject's environment needs of crashmatrix's (its workload's own imports aside: the
checkout workload's tools use aiohttp)."""
PYTHON_MIN = (3, 11)
WORKER_PACKAGES = ("harness", "reference_runtime", "scenarios")
"""crashmatrix's packages put on a subject interpreter's path (:func:`worker_path`): the
harness's worker side, the workloads (scenarios) and what their tools import."""
_PROBE = r"""
import json, sys
out = {"python": list(sys.version_info[:3])}
if sys.version_info >= tuple(json.loads(sys.argv[4])):
    import importlib.util
    out["missing"] = [m for m in sys.argv[1].split(",") if importlib.util.find_spec(m) is None]
    if not out["missing"]:
        from crashmatrix.harness import registry
        from crashmatrix.harness.errors import CrashmatrixError
        try:
            if sys.argv[3]:
                registry.workload(sys.argv[3])
            registry.subject(sys.argv[2])
        except CrashmatrixError as exc:
            out["error"] = str(exc)
print(json.dumps(out))
"""
_CHECKED: dict[tuple[Any, ...], None] = {}


def own_build(subject: str) -> Build | None:
    """The build of a single subject given with its environment, ``[LABEL=]SUBJECT@DIR``
    (``DIR`` a virtual environment or an interpreter, or a source tree: module
    docstring), None for a subject of the controller's environment or a pair. Raises
    :class:`InvalidArgument` for a bad spec (:func:`parse_build`)."""
    if PAIR in subject or "@" not in subject:
        return None
    return parse_build(subject, where="--subject")


def worker_path(dest: Path) -> str:
    """Make ``dest`` a directory that puts the controller's crashmatrix on another
    interpreter's path (``PYTHONPATH``): ``dest/crashmatrix/NAME``, a symbolic link to
    each of :data:`WORKER_PACKAGES` as the controller imports them (an installed or an
    editable crashmatrix alike), so the subject's environment needs none of
    crashmatrix's dependencies installed. Returns ``str(dest)``."""
    import importlib

    root = Path(dest) / "crashmatrix"
    root.mkdir(parents=True, exist_ok=True)
    for name in WORKER_PACKAGES:
        package = importlib.import_module(f"crashmatrix.{name}")
        link = root / name
        if not link.exists():
            link.symlink_to(Path(list(package.__path__)[0]), target_is_directory=True)
    return str(dest)


_HAS_CRASHMATRIX: dict[str, bool] = {}


def zygote_path(build: Build, workdir: Path) -> tuple[str, ...]:
    """The directories first on the ``PYTHONPATH`` of ``build``'s zygote: its source tree
    (``build.path``); for an interpreter that cannot import crashmatrix itself (one
    probe per interpreter and controller), the controller's packages before it
    (:func:`worker_path` in ``workdir/subject-path``), so a build's environment needs
    none of crashmatrix's dependencies. A build whose environment has crashmatrix
    installed runs that one (its reference runtime may be what the pair compares)."""
    if build.python is None:
        return build.path
    if build.python not in _HAS_CRASHMATRIX:
        import subprocess

        from .pool import zygote_env

        probe = "import importlib.util as u; print(u.find_spec('crashmatrix.harness.zygote') is not None)"
        try:
            out = subprocess.run([build.python, "-P", "-c", probe], stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, env=zygote_env(build.python), timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        _HAS_CRASHMATRIX[build.python] = out == "True"
    if _HAS_CRASHMATRIX[build.python]:
        return build.path
    return (worker_path(Path(workdir) / "subject-path"), *build.path)


def check_environment(build: Build, workload: str | None = None) -> None:
    """Probe ``build``'s interpreter once (a throwaway process, crashmatrix's packages on
    its path: :func:`worker_path` in a temporary directory, removed after): it is Python
    :data:`PYTHON_MIN` or later, it has what the worker side needs
    (:data:`WORKER_NEEDS`), and it imports ``workload`` and the subject. Raises
    :class:`InvalidArgument` (or :class:`~.errors.RegistryError` for a name it cannot
    import), one line naming what is wrong; the same build passes at once the next time."""
    import subprocess  # the controller's: a worker imports this module, never these
    import tempfile

    from .errors import RegistryError
    from .pool import zygote_env

    python = build.python or sys.executable
    key = (python, build.path, build.subject, workload)
    if key in _CHECKED:
        return
    where = f"--subject {build.spec!r}"
    with tempfile.TemporaryDirectory(prefix="crashmatrix-probe-") as tmp:
        env = zygote_env(python, (worker_path(Path(tmp)), *build.path))
        try:
            proc = subprocess.run(
                [python, "-P", "-c", _PROBE, ",".join(WORKER_NEEDS), build.subject, workload or "",
                 json.dumps(PYTHON_MIN)], stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                timeout=300)
        except OSError as exc:
            raise InvalidArgument(f"{where}: cannot run {python}: {exc.strerror}") from None
        except subprocess.TimeoutExpired:
            raise InvalidArgument(f"{where}: {python} did not answer a probe within 300 s") from None
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        version = tuple(out["python"])
    except (ValueError, IndexError, KeyError, TypeError):
        said = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        raise InvalidArgument(f"{where}: {python} is not a Python interpreter crashmatrix can run (exit "
                              f"{proc.returncode}{': ' + said if said else ''})") from None
    if version < PYTHON_MIN:
        raise InvalidArgument(f"{where}: {python} is Python {'.'.join(map(str, version))}; crashmatrix's workers "
                              f"need {'.'.join(map(str, PYTHON_MIN))} or later")
    missing = out.get("missing") or []
    if missing:
        raise InvalidArgument(f"{where}: the environment of {python} lacks {missing[0]}, which crashmatrix's "
                              f"workers import: pip install '{WORKER_NEEDS[missing[0]]}' there")
    if out.get("error"):
        raise RegistryError(f"{where}, in {python}: {out['error']}")
    _CHECKED[key] = None


def _declared(key: str) -> Any:
    """A property of :class:`EnvAdapter`: the subject's declaration ``key`` as its
    ``describe`` reported it (the :class:`Adapter` default before)."""
    default = getattr(Adapter, key, None)

    def get(self: EnvAdapter) -> Any:
        return self.upgrade.declared.get(self.own_build.label, {}).get(key, default)

    return property(get)


class EnvAdapter(BuildAdapter):
    """The adapter the controller holds for a subject in its own environment (``--subject
    SUBJECT@VENV``, ``--python``): one build, whose zygote runs under the subject's
    interpreter; every controller-side call goes to a service worker of it, and its
    declarations are what its ``describe`` reported (:data:`DECLARATIONS`). ``pool``: that
    build's :class:`.pool.WorkerPool`."""

    def __init__(self, pool: Any, build: Build, workload: str, directory: Path) -> None:
        super().__init__(BuildPools(Upgrade(build, build), {build.label: pool}), workload, directory)
        self.own_build = build
        self.pool = pool

    @property  # type: ignore[override]
    def name(self) -> str:
        return str(self.upgrade.declared.get(self.own_build.label, {}).get("name") or self.own_build.subject)

    expects_redelivery = _declared("expects_redelivery")
    crash_loop_status = _declared("crash_loop_status")
    lease_seconds = _declared("lease_seconds")
    takes_over_live_owner = _declared("takes_over_live_owner")
    long_lived_workers = _declared("long_lived_workers")
    answers_operator = _declared("answers_operator")
    subject_packages = _declared("subject_packages")
    recovery_branches = _declared("recovery_branches")
    recovery_point = _declared("recovery_point")
    recovers_other_executor = _declared("recovers_other_executor")

    async def describe(self) -> None:
        self.upgrade.declared[self.own_build.label] = await self.call(self.own_build, "describe", _NO_ENV)
        self.pool.declared_long_lived = bool(self.long_lived_workers)

    async def prepare(self, env: Environment) -> None:
        await self.call(self.own_build, "prepare", env)


# -- worker side: the service roles -----------------------------------------------------------


def run_service_job(job: Job) -> int:
    """In a forked worker of a build: call the adapter method ``job.role`` and write
    ``{"event": "service", "result": ...}`` (or ``service-error``) to the job's result
    file. Returns the exit code (0, or 1 when the method raised)."""
    import anyio

    from . import registry
    from .adapter import capabilities_of
    from .sources import runtime_releases

    adapter = registry.subject(job.subject)

    async def main() -> Any:
        try:
            if job.role == "observe":
                return observation_to_dict(await adapter.observe(job.env, job.run_id))
            if job.role == "prepare":
                await adapter.prepare(job.env)
            elif job.role == "between":
                await adapter.between_crash_and_resume(job.env, job.run_id)
            elif job.role == "cancel_run":
                await adapter.cancel_run(job.env, job.run_id)
            elif job.role == "resume_cancelled":
                await adapter.resume_cancelled(job.env, job.run_id)
            elif job.role == "describe":
                said = {key: getattr(adapter, key, None) for key in DECLARATIONS}
                return {**json.loads(json.dumps(said, default=list)), "name": adapter.name,
                        "releases": runtime_releases(adapter),
                        "capabilities": sorted(capabilities_of(adapter)),
                        "cannot_migrate_statuses": list(getattr(adapter, "cannot_migrate_statuses", ()) or ()),
                        "identifier_fields": list(getattr(adapter, "identifier_fields", ()) or ())}
            return None
        finally:
            with anyio.CancelScope(shield=True):
                await adapter.aclose()

    fd = os.open(job.result_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        try:
            result = anyio.run(main)
        except BaseException as exc:
            os.write(fd, (json.dumps({"event": "service-error", "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc(limit=12)}) + "\n").encode())
            return 1
        os.write(fd, (json.dumps({"event": "service", "result": result}) + "\n").encode())
        return 0
    finally:
        os.close(fd)


def observation_to_dict(obs: Observation) -> dict[str, Any]:
    """An :class:`Observation` as JSON data (:func:`observation_from_dict` reads it)."""
    return dataclasses.asdict(obs)


def observation_from_dict(data: dict[str, Any]) -> Observation:
    """The :class:`Observation` of :func:`observation_to_dict`'s data."""
    d = dict(data)

    def rows(key: str, make: Any) -> Any:
        items = d.get(key)
        return None if items is None else [make(item) for item in items]

    d["log"] = rows("log", lambda e: LogEntry(e["seq"], e["node_id"], tuple(e["parents"]), e["kind"],
                                              e["lease_epoch"], e.get("error")))
    d["effects"] = rows("effects", lambda e: EffectEntry(**e))
    d["invocations"] = rows("invocations", lambda e: InvocationEntry(**e))
    known = {f.name for f in dataclasses.fields(Observation)}
    return Observation(**{k: v for k, v in d.items() if k in known})


# -- the check --------------------------------------------------------------------------------


MIGRATED = Check("upgrade.migrated", "migration", "run stranded by a deploy", "end",
                 "a run crashed under build A ends under B as the golden run did, or B parks it with a reason")


def check_migrated(golden: Evidence, final: Evidence, result: CaseResult, upgrade: Upgrade,
                   declared: tuple[str, ...]) -> Verdict:
    """``upgrade.migrated``: a run that crashed under build A (``upgrade.crash``) and
    was resumed under B ends as the golden run did, or B parks it in a status it
    declares for a run it cannot migrate (``declared``), with the reason
    (``Observation.detail``). Not applicable when no worker of B ran (the run ended in
    A's worker). Source: seed 000's first upgrade (every in-flight run died: a
    checkpoint named a class by a moved module path); DBOS workflows left ``PENDING``
    under an older application version; LangGraph issues 6970 and 7066 (a moved class
    loads as a dict)."""
    from .oracle import Verdict

    name = MIGRATED.name
    a, b = upgrade.crash.label, upgrade.resume.label
    if not any(w.get("role") == "resume" for w in result.workers):
        return Verdict(name, "end", True, f"not applicable: the run ended under {a} (no worker of {b} ran)")
    obs, want = final.observation, golden.observation.status
    if obs.status == want:
        return Verdict(name, "end", True, f"crashed under {a}, finished under {b}: {obs.status}")
    if obs.status in declared:
        if obs.detail:
            return Verdict(name, "end", True, f"{b} parks the run it cannot migrate ({obs.status}): {obs.detail}")
        return Verdict(name, "end", False, f"{b} parks the run in {obs.status!r} but says no reason")
    failures = [v.details for v in result.verdicts if v.check == "resume.runs" and v.valid is False]
    text = (f"the run crashed under {a} ended {obs.status!r} under {b} (golden: {want!r}), and {obs.status!r} is "
            f"not a status {b} declares for a run it cannot migrate ({', '.join(declared) or 'it declares none'})")
    if failures:
        text += f"; {failures[-1]}"
    elif obs.detail:
        text += f"; the subject says: {obs.detail}"
    return Verdict(name, "end", False, text)
