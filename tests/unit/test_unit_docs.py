"""Documentation hygiene, in the style of Hypothesis's own check: every public name of
the user-facing modules carries a docstring."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

# -- documentation (in the style of Hypothesis's own "every public name documented") ---

DOCUMENTED_HARNESS_MODULES = ("plan", "oracle", "adapter", "explorer", "matrix", "errors", "crashpoint", "selftest",
                              "plugin", "fuzz", "html_report", "goldencache", "sources", "live", "report", "sharedpg")


def _undocumented(obj: object) -> bool:
    doc = obj.__doc__
    if not doc or not doc.strip():
        return True
    # a dataclass without a docstring gets ``Name(field: type, ...)`` generated for it
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        try:
            generated = obj.__name__ + str(inspect.signature(obj)).replace(" -> None", "")
        except (TypeError, ValueError):
            return False
        return doc == generated
    return False


def test_public_names_have_docstrings() -> None:
    missing = []
    import crashmatrix.reference_runtime as rr

    for name in rr.__all__:
        obj = getattr(rr, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and _undocumented(obj):
            missing.append(f"crashmatrix.reference_runtime.{name}")
    for short in DOCUMENTED_HARNESS_MODULES:
        mod = importlib.import_module(f"crashmatrix.harness.{short}")
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) != mod.__name__:
                continue  # imported, documented (or not) where it is defined
            if _undocumented(obj):
                missing.append(f"{mod.__name__}.{name}")
    assert not missing, f"{len(missing)} public name(s) without a docstring: {', '.join(missing)}"
