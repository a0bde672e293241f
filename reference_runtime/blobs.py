"""Blob pointers: large payloads live outside the log, the record keeps (uri, size, sha256).

Failures this wall prevents (docs/design.md, "Payloads over a few kilobytes go to a blob store"):

- **Log bloat**: a 200 KB document copied into a log row makes every rehydrate, backup and
  vacuum of ``cm_run_log`` pay for it, and pushes rows out of line (TOAST). Payloads whose
  encoding exceeds a threshold (:data:`DEFAULT_THRESHOLD`, configurable) are written here
  and the record holds a :class:`~.records_pb2.BlobPointer` instead.
- **Torn or partial blobs**: a blob is written to a temporary file in the same directory,
  flushed and fsynced, then renamed into place (atomic on POSIX), and the directory is
  fsynced. A crash leaves either no blob or the whole blob, never a prefix; since the
  blob is written *before* the record that points to it is appended, a record never
  points to a blob that is not durable (a crash in between leaves an orphan blob, which
  is harmless and is what retention can collect).
- **Silent corruption**: every read checks size and sha256 against the pointer and fails
  with :class:`BlobIntegrityError` naming the uri and both digests; a missing blob fails
  with :class:`BlobMissing`. Neither is ever returned as data.
- **Duplicate or conflicting appends**: blobs are content-addressed (the path is the
  digest), so a retried append of the same output produces the same pointer, hence the
  same record bytes, which the log treats as a no-op.

:class:`BlobStore` is the interface (an object store implements ``put``/``get`` the same
way, with a ``s3://bucket/sha256/...`` uri); :class:`LocalBlobStore` is the default.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from .records_pb2 import BlobPointer

DEFAULT_THRESHOLD = 4096
"""Bytes of an encoded payload above which it goes to the blob store (4 KB)."""


class BlobError(RuntimeError):
    """A blob cannot be read back as written."""


class BlobMissing(BlobError):
    """The pointer names a blob that is not in the store."""


class BlobIntegrityError(BlobError):
    """The stored bytes do not match the pointer's size or sha256."""


class BlobStore(Protocol):
    """Where large payloads go. ``put`` must be durable when it returns."""

    def put(self, data: bytes) -> BlobPointer:
        """Store ``data``; return its pointer (uri, size, sha256). Idempotent."""

    def get(self, pointer: BlobPointer) -> bytes:
        """The bytes ``pointer`` names, verified; raises :class:`BlobError`."""


class LocalBlobStore:
    """Content-addressed files under ``root``: ``root/ab/abcdef...`` (sha256 hex)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def path_for(self, digest_hex: str) -> Path:
        return self.root / digest_hex[:2] / digest_hex

    def put(self, data: bytes) -> BlobPointer:
        digest = hashlib.sha256(data).digest()
        path = self.path_for(digest.hex())
        pointer = BlobPointer(uri=path.as_uri(), size=len(data), sha256=digest)
        if path.exists() and path.stat().st_size == len(data):
            return pointer  # content-addressed: same name, same bytes
        # never parents=True: if the directory holding the store was removed (a session's
        # workdir cleaned up while a worker still runs), recreating it would leave a tree
        # behind; failing here is right
        self.root.mkdir(exist_ok=True)
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return pointer

    def get(self, pointer: BlobPointer) -> bytes:
        path = self._resolve(pointer)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"blob {pointer.uri} is missing (expected {pointer.size} bytes, sha256 {pointer.sha256.hex()})") from None
        digest = hashlib.sha256(data).digest()
        if len(data) != pointer.size or digest != pointer.sha256:
            raise BlobIntegrityError(
                f"blob {pointer.uri} is corrupt: expected {pointer.size} bytes with sha256 {pointer.sha256.hex()}, "
                f"found {len(data)} bytes with sha256 {digest.hex()}"
            )
        return data

    def _resolve(self, pointer: BlobPointer) -> Path:
        """The file a pointer names. A ``file://`` uri written under another root (the
        blob directory moved) is looked up by its digest under this store's root."""
        parsed = urlparse(pointer.uri)
        if parsed.scheme != "file":
            raise BlobError(f"blob uri {pointer.uri!r}: scheme {parsed.scheme!r} is not served by a local blob store")
        path = Path(unquote(parsed.path))
        if path.exists():
            return path
        return self.path_for(pointer.sha256.hex())
