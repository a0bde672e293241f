"""The source files of a subject and a workload: their hash, and where crash points are.

Two things need the code a matrix runs rather than its names:

- the golden-trace cache (:mod:`.goldencache`) is keyed by a **code hash**, so an edit
  to the runtime, the adapter or the workload (new labels, a new step) makes collection
  run the golden runs again instead of producing stale test ids;
- a failing case's message names the **source location** of its crash point.

Which files: start from the modules that define the adapter class and its bases and the
module the workload is registered from; add every package those modules import at top
level (their globals' ``__module__``). Each is taken as a whole package (a top-level
package, or for the ``crashmatrix`` namespace one of ``crashmatrix.harness``,
``crashmatrix.reference_runtime``, ``crashmatrix.scenarios``). Packages that live under
the standard library or ``site-packages`` and are not one of the starting packages'
own distribution contribute their name and installed version instead of their files
(their code does not name our crash points, and hashing all of asyncpg on every
collection would cost more than it tells). Files hashed: ``*.py`` and ``*.sql``, by
path relative to their package and content.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.metadata
import inspect
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from . import registry

_SUFFIXES = (".py", ".sql")


def _root_name(module_name: str) -> str:
    """The package a module is taken with: its top-level package, or the first two
    levels under a namespace package (``crashmatrix.harness``)."""
    parts = module_name.split(".")
    top = sys.modules.get(parts[0])
    if top is not None and getattr(top, "__file__", None) is None and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _installed_dirs() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    return tuple(Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)


def _files_of(module: ModuleType) -> list[Path]:
    roots = [Path(p) for p in getattr(module, "__path__", [])] or (
        [Path(module.__file__)] if getattr(module, "__file__", None) else [])
    out: list[Path] = []
    for root in roots:
        if root.is_file():
            out.append(root)
        elif root.is_dir():
            out += [p for p in root.rglob("*") if p.suffix in _SUFFIXES and "__pycache__" not in p.parts]
    return sorted(out)


@dataclass
class SourceSet:
    """The packages behind a subject and a workload (module docstring).

    ``files``: package name -> its source files; ``versions``: package name -> installed
    version, for the packages counted by version instead of files."""

    files: dict[str, list[Path]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    #: the source files of the subject's own modules (its adapter's classes, the workload)
    seed_files: frozenset[Path] = frozenset()
    _labels: dict[str, list[str]] | None = field(default=None, init=False, repr=False, compare=False)

    def code_hash(self) -> str:
        """sha256 (hex) over every file's package, relative path and bytes, and every
        version-counted package's name and version, in sorted order."""
        h = hashlib.sha256()
        for pkg in sorted(self.files):
            base = self.files[pkg][0].parent if self.files[pkg] else Path(".")
            for path in self.files[pkg]:
                try:
                    rel = path.relative_to(base)
                except ValueError:
                    rel = Path(path.name)
                h.update(f"{pkg}:{rel.as_posix()}\0".encode())
                h.update(path.read_bytes())
                h.update(b"\0")
        for pkg in sorted(self.versions):
            h.update(f"{pkg}=={self.versions[pkg]}\0".encode())
        return h.hexdigest()

    def label_locations(self) -> dict[str, list[str]]:
        """Label name -> ``path:line`` of every ``crashpoint("label")`` call with a
        literal name, or one of :mod:`.crashpoint`'s label constants, in these files (paths relative to the current directory when
        below it). Built on the first call (parsing every file: ~13 ms for the reference
        runtime's 106) and kept: reports look a location up per case."""
        if self._labels is None:
            out: dict[str, list[str]] = {}
            adapters_dir = Path(__file__).resolve().parent / "adapters"
            for paths in self.files.values():
                for path in paths:
                    if path.suffix != ".py":
                        continue
                    # the other runtimes' adapters shipped in the harness are not this subject's
                    if adapters_dir in path.resolve().parents and path.resolve() not in self.seed_files:
                        continue
                    for name, line in _crashpoint_calls(path):
                        out.setdefault(name, []).append(f"{_shown(path)}:{line}")
            self._labels = out
        return self._labels


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


@cache
def _crashpoint_calls_cached(path: str, mtime_ns: int) -> tuple[tuple[str, int], ...]:
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ()
    from . import crashpoint as labels

    # a label named by one of crashpoint's constants (``crashpoint(LOG_APPEND_BEFORE)``,
    # ``crashpoint(crashpoint_module.LOG_APPEND_BEFORE)``) counts as its literal name
    constants = {n: getattr(labels, n) for n in labels.__all__ if n.isupper() and isinstance(getattr(labels, n), str)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            label = arg.value
        elif isinstance(arg, ast.Name | ast.Attribute):
            label = constants.get(arg.id if isinstance(arg, ast.Name) else arg.attr)
            if label is None:
                continue
        else:
            continue
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        if name == "crashpoint":
            found.append((label, node.lineno))
    return tuple(sorted(found, key=lambda x: x[1]))


def _crashpoint_calls(path: Path) -> tuple[tuple[str, int], ...]:
    return _crashpoint_calls_cached(str(path), path.stat().st_mtime_ns)


def _workload_module(workload: str) -> str:
    target = registry.WORKLOADS.get(workload, workload)
    return target.partition(":")[0]


def subject_sources(subject: str, workload: str) -> SourceSet:
    """The :class:`SourceSet` of ``subject`` and ``workload`` (registered names or
    ``package.module:Attr``; a build pair's, :func:`build_pair_sources`). Raises
    :class:`~.errors.RegistryError` for unknown names."""
    from .builds import Upgrade, own_build, parse_subject

    upgrade = parse_subject(subject)
    own = own_build(subject) if upgrade is None else None
    if own is not None:  # a subject in its own environment: its build's files, as a pair's
        upgrade = Upgrade(own, own)
    if upgrade is not None:
        return build_pair_sources(upgrade, workload)
    adapter = registry.subject(subject)
    registry.workload(workload)
    seeds = [c.__module__ for c in type(adapter).__mro__ if c.__module__ not in ("builtins", "abc")]
    seeds.append(_workload_module(workload))
    seed_roots = {_root_name(m) for m in seeds}
    seed_tops = {r.split(".")[0] for r in seed_roots}
    roots = set(seed_roots)
    for name in seeds:
        mod = sys.modules.get(name) or importlib.import_module(name)
        for value in vars(mod).values():
            owner = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
            if isinstance(owner, str) and owner and owner.split(".")[0] not in sys.stdlib_module_names:
                roots.add(_root_name(owner))
    installed = _installed_dirs()
    out = SourceSet()
    seed_files = set()
    for name in seeds:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            seed_files.add(Path(path).resolve())
    out.seed_files = frozenset(seed_files)
    for root in sorted(roots):
        if root.split(".")[0] in ("builtins", "__main__"):
            continue
        try:
            mod = importlib.import_module(root)
        except ImportError:
            continue
        files = _files_of(mod)
        own = root.split(".")[0] in seed_tops
        if not own and files and any(installed_dir in files[0].resolve().parents for installed_dir in installed):
            found = distribution_of(root)
            out.versions[root] = found[1] if found is not None else str(getattr(mod, "__version__", "?"))
            continue
        out.files[root] = files
    return out


@cache
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _holds(dist: importlib.metadata.Distribution, module_name: str) -> bool | None:
    """Whether ``dist``'s file list holds ``module_name`` (a package's directory or a
    module's file); None when it lists no file of the module's top-level package (an
    editable install lists its path hook, not the modules)."""
    rel = module_name.replace(".", "/")
    top = module_name.split(".")[0]
    names = [f.as_posix() for f in dist.files or ()]
    if not any(n.startswith(top + "/") or n == top + ".py" for n in names):
        return None
    return any(n.startswith(rel + "/") or n == rel + ".py" for n in names)


@cache
def distribution_of(module_name: str) -> tuple[str, str] | None:
    """The installed distribution that provides ``module_name``, and its version, from
    the installed metadata alone (nothing is imported): ``("llama-index-workflows",
    "2.12.2")`` for ``workflows``, ``("dbos", "2.23.0")`` for ``dbos``. The distribution
    named as the module's top-level package when its files hold the module (or it lists
    none of them: an editable install); else the one among those that ship the
    top-level package (``importlib.metadata.packages_distributions``; several share a
    namespace package such as ``llama_index`` or ``langgraph``) whose files hold it.
    None when no installed distribution provides it (a source tree on the path)."""
    top = module_name.split(".")[0]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(top)
        if _holds(dist, module_name) is not False:
            return dist.metadata["Name"] or top, dist.version
    candidates = list(dict.fromkeys(_packages_distributions().get(top, ())))
    for name in candidates:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            dist = importlib.metadata.distribution(name)
            if len(candidates) == 1 or _holds(dist, module_name):
                return dist.metadata["Name"] or name, dist.version
    return None


def releases(modules: Iterable[str]) -> dict[str, str]:
    """Distribution -> version of the installed distributions providing ``modules``
    (:func:`distribution_of`); a module no distribution provides is left out."""
    out: dict[str, str] = {}
    for module in modules:
        found = distribution_of(module)
        if found is not None:
            out[found[0]] = found[1]
    return out


def runtime_releases(adapter: Any) -> dict[str, str]:
    """The release of the runtime an adapter drives, as this interpreter has it
    installed: the distributions of its ``subject_packages`` and ``requires``
    (``{"llama-index-workflows": "2.12.2"}``). Empty for a runtime run from a source
    tree."""
    return releases((*tuple(getattr(adapter, "subject_packages", ()) or ()),
                     *tuple(getattr(adapter, "requires", ()) or ())))


def subject_releases(adapter: Any, subject: str) -> dict[str, dict[str, str]]:
    """:func:`runtime_releases` of a session's subject, keyed by who ran it: ``subject``
    for an adapter of this interpreter; each build's label for a subject in its own
    environment or a build pair (:class:`.builds.BuildAdapter`: what each build's
    ``describe`` found in its own interpreter)."""
    from .builds import BuildAdapter

    if isinstance(adapter, BuildAdapter):
        return {label: dict(said.get("releases") or {}) for label, said in adapter.upgrade.declared.items()}
    return {subject: runtime_releases(adapter)}


def releases_line(found: dict[str, dict[str, str]]) -> str | None:
    """The summary's line for :func:`runtime_releases` of each build (``{subject or
    build label: {distribution: version}}``): ``runtime under test: dbos 2.23.0``, the
    builds named when there are two; None when no build's runtime is installed."""
    shown = {who: ", ".join(f"{d} {v}" for d, v in sorted(r.items())) for who, r in found.items() if r}
    if not shown:
        return None
    if len(found) == 1:
        return f"runtime under test: {next(iter(shown.values()))}"
    return "runtime under test: " + "; ".join(f"{who}: {text}" for who, text in shown.items())


def point_location(name: str, source: str, sources: SourceSet | None) -> str | None:
    """Where a crash point is in the source, or None when not known:

    - a label: every ``crashpoint("name")`` call site (``path:line``, joined with
      ``", "``), from :meth:`SourceSet.label_locations`;
    - an await point ``module:Qualname@N``: the function's file and first line;
    - a step: the node boundary the adapter reports (no single source line).
    """
    if source == "label" and sources is not None:
        sites = sources.label_locations().get(name)
        return ", ".join(sites) if sites else None
    if source == "await":
        module_name, _, rest = name.partition(":")
        qualname, _, ordinal = rest.rpartition("@")
        try:
            obj: object = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            code = inspect.unwrap(obj)  # type: ignore[arg-type]
            path = inspect.getsourcefile(code)  # type: ignore[arg-type]
            line = inspect.getsourcelines(code)[1]  # type: ignore[arg-type]
        except (ImportError, AttributeError, TypeError, OSError):
            return None
        return f"{_shown(Path(path))}:{line} ({qualname}, suspension #{ordinal})" if path else None
    if source == "step":
        return "a node boundary reported by the adapter (on_step)"
    return None


def build_pair_sources(upgrade: Any, workload: str) -> SourceSet:
    """The sources of a build pair (:class:`.builds.Upgrade`): a build of the
    controller's environment counts as a subject does; one from a source tree by its
    files (``build:LABEL``), one from a virtual environment by the ``RECORD`` files of
    what is installed there (each installed file's hash: the code exactly, read cheaply)."""
    out = SourceSet()
    for build in (upgrade.crash, upgrade.resume):
        if build.python is None and not build.path:
            own = subject_sources(build.subject, workload)
            out.files.update(own.files)
            out.versions.update(own.versions)
        elif build.path:
            out.files[f"build:{build.label}"] = sorted(p for p in Path(build.path[0]).rglob("*")
                                                     if p.suffix in _SUFFIXES and "__pycache__" not in p.parts)
        else:
            env = Path(build.python).parent.parent
            out.files[f"build:{build.label}"] = sorted(env.glob("lib/python*/site-packages/*.dist-info/RECORD"))
    return out


