"""``file://`` object store for single-machine runs and tests.

Objects are written to a temporary sibling and renamed into place, so a
reader sees either the whole object or none of it, as with S3.

Conditional writes (for leases) hold on one machine only (processes and
threads sharing a local file system; not NFS or other network file systems):

* ``put_if_absent`` writes a complete temporary file and hard-links it to
  the key: ``link(2)`` fails with EEXIST when the key exists, atomically, like
  ``open(O_CREAT | O_EXCL)`` but never exposing a half-written file.
* ``put_if_version`` / ``delete_if_version`` read, compare and then replace
  (``rename(2)``) or unlink while holding an exclusive ``flock`` on a sidecar
  ``<key>.cas-lock`` file, so two of them on one key never interleave; the
  kernel drops the lock when its holder dies. The object never disappears
  during a replace, so a concurrent ``put_if_absent`` cannot slip in.
* A version is the MD5 of the content (as the ETag of a plain S3 PUT).

Unconditional ``put`` / ``delete_prefix`` on the same key bypass all this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from iceberg_cdc.errors import ObjectNotFoundError, ShortObjectError, StorageError
from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter

_TMP_MARK = ".tmp-"
_LOCK_SUFFIX = ".cas-lock"  # sidecar lock of the conditional operations; never listed
_COPY_CHUNK = 1 << 20  # bytes per read when a range is copied to a caller's sink


def _content_version(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class _FileWriter(ObjectWriter):
    def __init__(self, path: Path) -> None:
        self._final = path
        self._tmp = path.with_name(f"{path.name}{_TMP_MARK}{uuid.uuid4().hex}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._size = 0

    def write(self, data: bytes | memoryview) -> None:
        self._fh.write(data)
        self._size += len(data)

    def close(self) -> int:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self._final)
        return self._size

    def abort(self) -> None:
        self._fh.close()
        self._tmp.unlink(missing_ok=True)


class LocalObjectStore(ObjectStore):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.uri = self.root.resolve().as_uri()
        self.requests: Counter[str] = Counter()

    def _path(self, key: str) -> Path:
        return self.root / key

    def open_writer(self, key: str) -> ObjectWriter:
        self.requests["PUT"] += 1
        return _FileWriter(self._path(key))

    def get(self, key: str) -> bytes:
        self.requests["GET"] += 1
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.describe(key)} does not exist") from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.requests["GET_RANGE"] += 1
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(start)
                data = fh.read(end - start)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.describe(key)} does not exist") from None
        if len(data) != end - start:
            raise ShortObjectError(
                f"{self.describe(key)}: asked for bytes [{start}, {end}) but the object "
                f"ends at {start + len(data)}"
            )
        return data

    def get_range_into(self, key: str, start: int, end: int, sink: BinaryIO) -> None:
        self.requests["GET_RANGE"] += 1
        copied = 0
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(start)
                while copied < end - start:
                    piece = fh.read(min(_COPY_CHUNK, end - start - copied))
                    if not piece:
                        break
                    sink.write(piece)
                    copied += len(piece)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{self.describe(key)} does not exist") from None
        if copied != end - start:
            raise ShortObjectError(
                f"{self.describe(key)}: asked for bytes [{start}, {end}) but the object "
                f"ends at {start + copied}"
            )

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.requests["LIST"] += 1
        base = self._path(prefix)
        # "" is the whole store: its directory is the root itself, not the root's parent.
        directory = base if prefix == "" or prefix.endswith("/") else base.parent
        if not directory.is_dir():
            return []
        found = []
        for dirpath, _, filenames in os.walk(directory):
            for filename in filenames:
                path = Path(dirpath) / filename
                key = path.relative_to(self.root).as_posix()
                if (
                    key.startswith(prefix)
                    and _TMP_MARK not in filename
                    and not filename.endswith(_LOCK_SUFFIX)
                ):
                    found.append(ObjectInfo(key, path.stat().st_size))
        return sorted(found, key=lambda info: info.key)

    def delete_prefix(self, prefix: str) -> int:
        self.requests["DELETE"] += 1
        base = self._path(prefix)
        if prefix.endswith("/") and base.is_dir():
            count = sum(len(files) for _, _, files in os.walk(base))
            shutil.rmtree(base)
            return count
        count = 0
        for info in self.list(prefix):
            self._path(info.key).unlink(missing_ok=True)
            count += 1
        return count

    # Conditional operations (leases): see the module docstring.

    def _write_temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}{_TMP_MARK}{uuid.uuid4().hex}")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return tmp

    @contextlib.contextmanager
    def _key_lock(self, key: str) -> Iterator[Path]:
        """Exclusive lock of one key's conditional operations (threads and processes)."""
        import fcntl  # POSIX only; imported here so the rest of the store works anywhere

        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}{_LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield path
        finally:
            os.close(fd)  # drops the lock

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        self.requests["PUT"] += 1
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        except OSError as exc:
            raise StorageError(
                f"{self.describe(key)}: cannot create the object exclusively ({exc}); the file "
                "system must support hard links"
            ) from None
        finally:
            tmp.unlink(missing_ok=True)
        return _content_version(data)

    def get_with_version(self, key: str) -> tuple[bytes, str] | None:
        self.requests["GET"] += 1
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return data, _content_version(data)

    def put_if_version(self, key: str, data: bytes, version: str) -> str | None:
        self.requests["PUT"] += 1
        with self._key_lock(key) as path:
            try:
                current = path.read_bytes()
            except FileNotFoundError:
                return None
            if _content_version(current) != version:
                return None
            os.replace(self._write_temp(path, data), path)
        return _content_version(data)

    def delete_if_version(self, key: str, version: str) -> bool:
        self.requests["DELETE"] += 1
        with self._key_lock(key) as path:
            try:
                current = path.read_bytes()
            except FileNotFoundError:
                return False
            if _content_version(current) != version:
                return False
            path.unlink()
        return True
