"""The probe certifier: drive a side-effecting call through every ambiguous window and
check the tool's probe against the provider's own ledger (docs/probes.md).

Python API::

    from crashmatrix.harness.certify import certify_probe_sync
    cert = certify_probe_sync("crashmatrix.scenarios.checkout.tools:charge",
                              "crashmatrix.scenarios.checkout.tools:probe_charge",
                              "crashmatrix.scenarios.probes_examples:charge_truth")
    cert.verdict        # "certified" | "refused" | "error"
    cert.failing()      # names of the windows where the probe lied or failed
    cert.write("certificate.json")

Command line: ``crashmatrix certify-probe MODULE:TOOL --probe MODULE:PROBE --truth
MODULE:FN``. In a test: :func:`assert_probe_certified`.
"""

from __future__ import annotations

from typing import Any

from .certificate import Answer, CallResult, Certificate, Check, WindowResult, print_certificate
from .certifier import DEFAULT_BOUND_MS, DEFAULT_DEADLINE_MS, certify_probe, certify_probe_sync
from .contract import CertifyError, CertifyHarnessError, Parts, Sandbox, Truth, ground_truth, load_parts
from .sandbox import ProviderSandbox
from .windows import WINDOWS, WindowSpec, window_names

__all__ = [
    "Answer",
    "CallResult",
    "Certificate",
    "CertifyError",
    "CertifyHarnessError",
    "Check",
    "DEFAULT_BOUND_MS",
    "DEFAULT_DEADLINE_MS",
    "Parts",
    "ProviderSandbox",
    "Sandbox",
    "Truth",
    "WINDOWS",
    "WindowResult",
    "WindowSpec",
    "assert_probe_certified",
    "certify_probe",
    "certify_probe_sync",
    "ground_truth",
    "load_parts",
    "print_certificate",
    "summary_text",
    "window_names",
]


def summary_text(cert: Certificate, width: int = 120) -> str:
    """The rich summary of ``cert`` as plain text (what the CLI prints)."""
    import io

    from rich.console import Console

    out = io.StringIO()
    print_certificate(Console(file=out, width=width, color_system=None), cert)
    return out.getvalue()


def assert_probe_certified(tool: Any, probe: Any = None, truth: Any = None, **options: Any) -> Certificate:
    """pytest helper: certify (``options`` as :func:`certify_probe`) and return the
    certificate; raise :class:`AssertionError` with the summary (every failed check,
    per window) unless it is ``certified``. Synchronous: call it from a plain test."""
    cert = certify_probe_sync(tool, probe, truth, **options)
    if cert.verdict != "certified":
        raise AssertionError(f"probe not certified ({cert.verdict}):\n{summary_text(cert)}")
    return cert
