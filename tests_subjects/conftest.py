"""Tests of subjects whose extras stay out of the ``test`` extra (too heavy for the main
CI job's install budget: docs/findings.md, "Install cost"). The default suite
(``testpaths = ["tests"]``) does not collect this folder; ``.ci/subjects-heavy`` runs it
in a venv of its own with those extras.

The case runner and fixtures are the adapter tests' own (``tests/adapters/conftest.py``),
loaded by path so both suites share one copy.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "crashmatrix_tests_adapter_cases"
_spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).parents[1] / "tests" / "adapters" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_cases = importlib.util.module_from_spec(_spec)
sys.modules[_NAME] = _cases  # dataclasses look their module up there
_spec.loader.exec_module(_cases)

matrix_cases = _cases.matrix_cases
module_cases = _cases.module_cases
imports_start_nothing = _cases.imports_start_nothing
