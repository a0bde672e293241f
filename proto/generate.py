"""Regenerate the Python modules for the .proto sources in this folder.

    python proto/generate.py          # rewrite the generated modules
    python proto/generate.py --check  # exit 1 if any generated module is stale

Needs ``grpcio-tools`` (the ``test`` extra pins the exact version, so the generated
code, and hence the protobuf runtime it requires, is chosen on purpose). Each source
keeps its path (``crashmatrix/records.proto``) in protobuf's descriptor pool, so it
cannot collide with a user's own ``records.proto``; the output is moved into the
package that uses it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# proto source (relative to proto/) -> generated module (relative to the repository)
TARGETS = {
    "crashmatrix/records.proto": "reference_runtime/records_pb2.py",
}


def generate() -> dict[str, str]:
    """Return {target path: generated source text} without touching the tree."""
    from grpc_tools import protoc

    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for source, target in TARGETS.items():
            rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"--python_out={tmp}", source])
            if rc != 0:
                raise SystemExit(f"protoc failed on {source} (exit {rc})")
            out[target] = (Path(tmp) / source.replace(".proto", "_pb2.py")).read_text()
    return out


def main(argv: list[str]) -> int:
    generated = generate()
    stale = [t for t, text in generated.items() if not (ROOT / t).exists() or (ROOT / t).read_text() != text]
    if "--check" in argv:
        for t in stale:
            print(f"stale generated module: {t} (run: python proto/generate.py)")
        return 1 if stale else 0
    for t, text in generated.items():
        (ROOT / t).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
