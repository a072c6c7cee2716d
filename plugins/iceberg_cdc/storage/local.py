"""``file://`` object store for single-machine runs and tests.

Objects are written to a temporary sibling and renamed into place, so a
reader sees either the whole object or none of it, as with S3.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections import Counter
from pathlib import Path

from iceberg_cdc.errors import ObjectNotFoundError, ShortObjectError
from iceberg_cdc.storage.base import ObjectInfo, ObjectStore, ObjectWriter

_TMP_MARK = ".tmp-"


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

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.requests["LIST"] += 1
        base = self._path(prefix)
        directory = base if prefix.endswith("/") else base.parent
        if not directory.is_dir():
            return []
        found = []
        for dirpath, _, filenames in os.walk(directory):
            for filename in filenames:
                path = Path(dirpath) / filename
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix) and _TMP_MARK not in filename:
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
