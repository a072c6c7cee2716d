"""The ``--py-files`` archive that carries ``iceberg_cdc`` to Spark drivers and executors.

Built once per package content (its name holds a hash of every source file),
so parsing DAG files or submitting many jobs never rebuilds it, and a changed
package can never be mistaken for the old one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

import iceberg_cdc

PACKAGE_DIR = Path(iceberg_cdc.__file__).resolve().parent
CACHE_ENV = "CDC_PACKAGE_CACHE"


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def package_digest() -> str:
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def package_zip(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Path of the archive for the current package content, building it if missing."""
    directory = Path(cache_dir or os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "iceberg-cdc")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"iceberg_cdc-{iceberg_cdc.__version__}-{package_digest()}.zip"
    if target.exists():
        return str(target)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".zip.tmp")
    os.close(fd)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in _sources():
            archive.write(path, Path("iceberg_cdc") / path.relative_to(PACKAGE_DIR))
    os.replace(tmp, target)  # atomic: concurrent builders produce identical files
    return str(target)
