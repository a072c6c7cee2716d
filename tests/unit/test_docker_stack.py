"""Static checks of the production-like stack in docker/ (no Docker engine runs here).

The development machines have only a ``docker`` client, so the stack is never
started by the test suite. These checks catch, without an engine, what would
otherwise surface only at ``docker compose up``: a dependency on a service that
does not exist (or only exists in a profile), a ``${VAR}`` nobody defines, an
unpinned image, a long-running service without a health check, a credential
committed by mistake, an image that installs other Python pins than the tests
use, and a CDC config the project's own parser rejects.

Each check is a function returning a list of problems, run on the real files
(expected: none) and on broken copies (expected: the breakage is reported), so
every check is shown to be able to fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import pyarrow.compute as pc
import pytest
import yaml

from cdc_devtools.connect_server import COORDINATOR_JAVA_OPTIONS
from iceberg_cdc.config import CdcConfig, parse_config
from iceberg_cdc.errors import ConfigError
from iceberg_cdc.pipeline.worker_heap import WORKER_ENV

REPO = Path(__file__).resolve().parents[2]
STACK_FILES = [
    "docker/compose.yaml",
    "docker/.env.example",
    "docker/Dockerfile",
    "docker/Dockerfile.dockerignore",
    "docker/cdc.yaml",
    "docker/seed_demo.py",
    "requirements.txt",
    "constraints.txt",
    "pyproject.toml",
]

# Compose interpolation: `$$` (an escaped dollar), `${NAME}`, `${NAME:-default}`,
# `${NAME-default}`, `${NAME:?message}`, `${NAME?message}`, `${NAME:+alternative}`,
# `${NAME+alternative}`, or a bare `$NAME`.
_TOKEN = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)
_ENV_LINE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
_CONFIG_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DEPENDENCY_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
_PLACEHOLDER = re.compile(r"^(change-me|replace-with)[a-z0-9-]*$")
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|PRIVATE|_KEY$", re.IGNORECASE)
_AWS_KEY_ID = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")
_LONG_TOKEN = re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}")
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.\-\[\],]+?)==(?P<version>[^\s;#]+)")


@dataclass(frozen=True)
class Stack:
    """The files of the stack, read from a repository root (the real one or a broken copy)."""

    root: Path

    def text(self, relative: str) -> str:
        return (self.root / relative).read_text()

    @cached_property
    def compose(self) -> dict[str, Any]:
        return yaml.safe_load(self.text("docker/compose.yaml"))

    @property
    def services(self) -> dict[str, dict[str, Any]]:
        return self.compose["services"]

    @cached_property
    def env_example(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for number, line in enumerate(self.text("docker/.env.example").splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            match = _ENV_LINE.match(line)
            if not match:
                raise ValueError(f".env.example line {number} is not KEY=value: {line!r}")
            if match["key"] in values:
                raise ValueError(f".env.example defines {match['key']} twice")
            values[match["key"]] = match["value"]
        return values

    def interpolate(self, value: Any) -> Any:
        """``value`` (a string, or lists and mappings of them) as compose resolves it with .env.example."""
        if isinstance(value, dict):
            return {k: self.interpolate(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.interpolate(v) for v in value]
        if isinstance(value, str):
            return interpolate(value, self.env_example)
        return value

    def environment(self, service: str) -> dict[str, str]:
        """A service's container environment, interpolated as compose would with .env.example."""
        raw = self.services[service].get("environment") or {}
        if isinstance(raw, list):
            raw = dict(item.split("=", 1) for item in raw)
        return {k: str(self.interpolate(v)) for k, v in raw.items()}


def interpolate(text: str, env: dict[str, str]) -> str:
    def resolve(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        name = match["name"] or match["bare"]
        op, arg, value = match["op"], match["arg"], env.get(name)
        if op in (":+", "+"):  # the alternative value: used only when the variable is set
            return arg if (value if op == ":+" else value is not None) else ""
        if (op in (":-", ":?") and not value) or (op in ("-", "?") and value is None):
            if op.endswith("?"):
                raise KeyError(f"required variable {name} is not set: {arg}")
            return arg
        return value or ""

    return _TOKEN.sub(resolve, text)


def references(text: str) -> list[re.Match[str]]:
    """Every interpolation in ``text`` (escaped `$$` excluded)."""
    return [m for m in _TOKEN.finditer(text) if m[0] != "$$"]


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raw = service.get("depends_on") or {}
    return {name: {"condition": "service_started"} for name in raw} if isinstance(raw, list) else raw


def config_services(stack: Stack) -> list[str]:
    """Services whose processes load the CDC config (CDC_CONFIG in their environment)."""
    return [
        name for name, service in stack.services.items() if "CDC_CONFIG" in (service.get("environment") or {})
    ]


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    with mock.patch.dict(os.environ, values, clear=False):
        yield


# ---------------------------------------------------------------------------------------
# The checks: each returns a list of problems (empty when the stack is right).
# ---------------------------------------------------------------------------------------


def structure_problems(stack: Stack) -> list[str]:
    """Every service runs something and states its restart policy (so one-shots are explicit)."""
    problems = []
    for name, service in stack.services.items():
        if "image" not in service and "build" not in service:
            problems.append(f"{name}: neither image nor build")
        if "restart" not in service:
            problems.append(f'{name}: no restart policy (use "no" for one-shot services)')
    build = [s["build"] for s in stack.services.values() if "build" in s]
    for spec in build:
        context = (stack.root / "docker" / spec["context"]).resolve()
        if context != stack.root.resolve():
            problems.append(f"build context {spec['context']} is not the repository root")
        if not (context / spec["dockerfile"]).is_file():
            problems.append(f"build dockerfile {spec['dockerfile']} does not exist in the context")
    return problems


def dependency_problems(stack: Stack) -> list[str]:
    """depends_on / links / extends name services that exist, with valid conditions and profiles."""
    services = stack.services
    problems = []
    for name, service in services.items():
        for target, spec in depends_on(service).items():
            if target not in services:
                problems.append(f"{name} depends on {target}, which is not a service")
                continue
            condition = spec.get("condition", "service_started")
            if condition not in _DEPENDENCY_CONDITIONS:
                problems.append(f"{name} -> {target}: unknown condition {condition!r}")
            one_shot = services[target].get("restart") == "no"
            if one_shot and condition != "service_completed_successfully":
                problems.append(f"{name} -> {target}: a one-shot service must be awaited to completion")
            if not one_shot and condition == "service_completed_successfully":
                problems.append(f"{name} -> {target}: {target} is long-running, it never completes")
            if condition == "service_healthy" and "healthcheck" not in services[target]:
                problems.append(f"{name} waits for {target} to be healthy, but it has no healthcheck")
            if (
                services[target].get("profiles")
                and not set(service.get("profiles") or []) & set(services[target]["profiles"])
                and spec.get("required", True)
            ):
                problems.append(
                    f"{name} depends on {target}, which only runs in profile(s) {services[target]['profiles']}"
                )
        for link in service.get("links") or []:
            if link.split(":")[0] not in services:
                problems.append(f"{name} links to {link}, which is not a service")
        extends = service.get("extends")
        if extends and "file" not in extends and extends["service"] not in services:
            problems.append(f"{name} extends {extends['service']}, which is not a service")
    return problems


def address_problems(stack: Stack) -> list[str]:
    """Every URL in a container's environment or command names a service of the stack (or itself)."""
    problems = []
    # Network URLs only: in s3:// and file:// URIs the "host" is a bucket or nothing.
    url = re.compile(r"\b(?!s3://|file://)[a-z][a-z0-9+]*://(?:[^@/\s\"']*@)?(?P<host>[A-Za-z0-9_.-]+)")
    for name, service in stack.services.items():
        try:
            values = [*stack.environment(name).values(), *_strings(stack.interpolate(service.get("command")))]
        except KeyError as exc:
            problems.append(f"{name}: {exc}")
            continue
        for value in values:
            for match in url.finditer(value):
                host = match["host"]
                if host not in stack.services and host not in ("localhost", "127.0.0.1") and "." not in host:
                    problems.append(f"{name}: {match[0]} names {host}, which is not a service")
    return problems


def variable_problems(stack: Stack) -> list[str]:
    """Every ${VAR} is defined in .env.example or has a default; .env.example lists nothing unused."""
    problems = []
    defined = stack.env_example
    used: set[str] = set()
    for value in _strings(stack.compose):  # compose interpolates values (comments are not)
        for match in references(value):
            if match["bare"]:
                problems.append(
                    f"compose.yaml: bare ${match['bare']} is interpolated by compose; write "
                    f"$${match['bare']} for the container's shell, or ${{...}} for compose"
                )
                continue
            used.add(match["name"])
            if match["name"] not in defined and match["op"] not in (":-", "-"):
                problems.append(
                    f"compose.yaml: ${{{match['name']}}} is neither in .env.example nor defaulted"
                )
    # docker/cdc.yaml is expanded by the project's loader from the *container* environment.
    cdc_values = _strings(yaml.safe_load(stack.text("docker/cdc.yaml")))
    cdc_refs = sorted({name for value in cdc_values for name in _CONFIG_REF.findall(value)})
    services = config_services(stack)
    if not services:
        problems.append("no service sets CDC_CONFIG: nothing would load docker/cdc.yaml")
    for service in services:
        try:
            env = stack.environment(service)
        except KeyError as exc:
            problems.append(f"{service}: {exc}")
            continue
        problems += [
            f"docker/cdc.yaml uses ${{{name}}}, not set in {service}'s environment"
            for name in cdc_refs
            if not env.get(name)
        ]
    problems += [
        f".env.example defines {name}, which compose.yaml never uses" for name in sorted(set(defined) - used)
    ]
    return problems


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def image_pin_problems(stack: Stack) -> list[str]:
    """Every image (compose and Dockerfile FROM) has an explicit tag other than latest."""
    images = [(name, stack.interpolate(s["image"])) for name, s in stack.services.items() if "image" in s]
    images += [
        ("Dockerfile FROM", line.split()[1])
        for line in stack.text("docker/Dockerfile").splitlines()
        if line.upper().startswith("FROM ")
    ]
    problems = []
    for where, image in images:
        if "@sha256:" in image:
            continue
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        if not tag or tag == "latest":
            problems.append(f"{where}: image {image!r} is not pinned to a version")
    return problems


def healthcheck_problems(stack: Stack) -> list[str]:
    """Every long-running service (restart policy other than "no") has a real health check."""
    problems = []
    for name, service in stack.services.items():
        if service.get("restart", "no") == "no":
            continue
        check = service.get("healthcheck")
        if not check or check.get("disable"):
            problems.append(f"{name}: long-running but no healthcheck")
            continue
        test = check.get("test")
        if isinstance(test, list):
            if test[:1] not in (["CMD"], ["CMD-SHELL"]) or len(test) < 2:
                problems.append(f"{name}: healthcheck test must be [CMD, ...] or [CMD-SHELL, command]")
        elif not isinstance(test, str) or not test.strip():
            problems.append(f"{name}: healthcheck has no test")
    return problems


def credential_problems(stack: Stack) -> list[str]:
    """No secret is written down: .env.example holds placeholders, compose only references."""
    problems = []
    for key, value in stack.env_example.items():
        if _SECRET_NAME.search(key) and not _PLACEHOLDER.match(value):
            problems.append(f".env.example {key}: a secret must be a change-me/replace-with placeholder")
    for name, service in stack.services.items():
        raw = service.get("environment") or {}
        items = raw.items() if isinstance(raw, dict) else (i.split("=", 1) for i in raw)
        for key, value in items:
            if _SECRET_NAME.search(key) and not references(str(value)):
                problems.append(f"{name}: {key} is a literal value; take it from .env with ${{...}}")
    for relative in ("docker/compose.yaml", "docker/.env.example", "docker/cdc.yaml"):
        text = stack.text(relative)
        if _AWS_KEY_ID.search(text):
            problems.append(f"{relative}: holds something shaped like an AWS access key id")
        for token in _LONG_TOKEN.findall(text):
            if _looks_random(token):
                problems.append(f"{relative}: {token[:6]}... looks like a generated key or token")
    return problems


def _looks_random(token: str) -> bool:
    """Generated keys mix cases and digits; names, paths and placeholders do not."""
    return all(any(test(c) for c in token) for test in (str.isdigit, str.islower, str.isupper))


def requirements_problems(stack: Stack) -> list[str]:
    """The image installs exactly the repository's requirements.txt with constraints.txt."""
    dockerfile = stack.text("docker/Dockerfile")
    problems = []
    copied: dict[str, str] = {}  # context path -> path in the image
    sources: list[str] = []
    for line in _instructions(dockerfile):
        words = line.split()
        if words[0].upper() != "COPY":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        *srcs, dest = args
        sources += srcs
        for src in srcs:
            copied[src] = dest.rstrip("/") + "/" + Path(src).name if dest.endswith("/") else dest
    installs = [line for line in _instructions(dockerfile) if re.search(r"\bpip3? install\b", line)]
    if not installs:
        problems.append("the Dockerfile never runs pip install")
    for name, flag in (("requirements.txt", "-r"), ("constraints.txt", "-c")):
        if name not in copied:
            problems.append(f"the Dockerfile does not COPY the repository's {name}")
        elif not any(f"{flag} {copied[name]}" in line for line in installs):
            problems.append(f"pip install does not use {flag} {copied[name]}")
    for line in installs:
        extra = [
            w
            for w in re.sub(r"&&.*", "", line.split("install", 1)[1]).split()
            if not w.startswith("-") and w not in copied.values()
        ]
        if extra:
            problems.append(f"pip install adds packages outside requirements.txt: {extra}")
    allowed = [
        line[1:].strip().rstrip("/")
        for line in stack.text("docker/Dockerfile.dockerignore").splitlines()
        if line.startswith("!")
    ]
    for src in sources:
        if not any(src.rstrip("/") == a or src.startswith(a + "/") for a in allowed):
            problems.append(f"COPY {src}: excluded from the build context by Dockerfile.dockerignore")
        elif not (stack.root / src).exists():
            problems.append(f"COPY {src}: no such file in the repository")
    pins = _pins(stack)
    for required in ("apache-airflow", "pyspark"):
        if required not in pins:
            problems.append(f"constraints.txt does not pin {required} with ==")
    return problems


def base_image_problems(stack: Stack) -> list[str]:
    """The base image is apache/airflow at constraints.txt's version (the newest tested), on the project's Python."""
    pins = _pins(stack)
    python = re.search(r'requires-python\s*=\s*">=(\d+\.\d+)', stack.text("pyproject.toml"))
    froms = [
        line.split()[1] for line in _instructions(stack.text("docker/Dockerfile")) if line.startswith("FROM ")
    ]
    match = re.fullmatch(
        r"apache/airflow:(?P<airflow>[\d.]+)-python(?P<python>[\d.]+)", froms[-1] if froms else ""
    )
    if not match:
        return [f"the final FROM is not apache/airflow:<version>-python<version>: {froms}"]
    problems = []
    if match["airflow"] != pins.get("apache-airflow"):
        problems.append(
            f"base image Airflow {match['airflow']} != constraints.txt apache-airflow=={pins.get('apache-airflow')}"
        )
    if python is None or match["python"] != python[1]:
        problems.append(f"base image Python {match['python']} is not the project's ({python and python[1]})")
    return problems


def java_problems(stack: Stack) -> list[str]:
    """The image installs a Java 17 runtime, and only that one."""
    dockerfile = stack.text("docker/Dockerfile")
    versions = set(re.findall(r"openjdk-(\d+)-jre", dockerfile))
    return [] if versions == {"17"} else [f"the image installs Java {sorted(versions) or 'none'}, not 17"]


def cdc_config_problems(stack: Stack) -> list[str]:
    """docker/cdc.yaml loads with the project's parser in each config-loading container's environment."""
    problems = [] if config_services(stack) else ["no service loads docker/cdc.yaml"]
    raw = yaml.safe_load(stack.text("docker/cdc.yaml"))
    for service in config_services(stack):
        try:
            env = stack.environment(service)
            with environment(env):
                config = parse_config(raw, f"docker/cdc.yaml in {service}")
        except (ConfigError, KeyError) as exc:
            problems.append(str(exc))
            continue
        problems += _config_fits_stack(stack, service, env, config)
    return problems


def _config_fits_stack(stack: Stack, service: str, env: dict[str, str], config: CdcConfig) -> list[str]:
    """The config's connections, endpoints and shuffle prefix agree with compose."""
    problems = []
    spark_conn_id = config.spark.conn_id if config.spark.mode == "submit" else config.spark.connect_conn_id
    if config.spark.mode == "connect" and not config.spark.connect_url:
        problems += _connect_connection_problems(stack, service, env, spark_conn_id)
    for conn_id in filter(
        None, [spark_conn_id, config.shuffle.airflow_conn_id, config.catalog.airflow_conn_id]
    ):
        if f"AIRFLOW_CONN_{conn_id.upper()}" not in env:
            problems.append(
                f"{service}: connection {conn_id} is not defined (AIRFLOW_CONN_{conn_id.upper()})"
            )
    spark = urlsplit(env.get("AIRFLOW_CONN_SPARK_DEFAULT", ""))
    if spark.scheme != "spark" or spark.hostname not in stack.services:
        problems.append(f"{service}: AIRFLOW_CONN_SPARK_DEFAULT does not name a Spark master service")
    elif str(spark.port) != stack.environment(spark.hostname).get("SPARK_MASTER_PORT"):
        problems.append(
            f"{service}: Spark connection port {spark.port} is not the master's SPARK_MASTER_PORT"
        )
    for key in ("uri", "s3.endpoint"):
        url = config.catalog.properties.get(key, "")
        if urlsplit(url).hostname not in stack.services:
            problems.append(f"{service}: catalog {key} {url!r} does not name a service of the stack")
    aws = json.loads(env.get("AIRFLOW_CONN_AWS_MINIO", "{}"))
    if aws.get("conn_type") != "aws" or aws.get("extra", {}).get(
        "endpoint_url"
    ) != config.catalog.properties.get("s3.endpoint"):
        problems.append(
            f"{service}: AIRFLOW_CONN_AWS_MINIO is not an aws connection to the catalog's endpoint"
        )
    bucket, _, prefix = config.shuffle.uri.removeprefix("s3://").partition("/")
    init_env = stack.environment("minio-init")
    rules = _lifecycle_rules(stack, init_env)
    expired = [r["Filter"]["Prefix"] for r in rules if r.get("Status") == "Enabled" and r.get("Expiration")]
    if bucket != init_env.get("CDC_SHUFFLE_BUCKET") or expired != [f"{prefix}/"]:
        problems.append(
            f"shuffle uri {config.shuffle.uri} is not the bucket and prefix minio-init creates and expires "
            f"(bucket {init_env.get('CDC_SHUFFLE_BUCKET')}, expired prefixes {expired})"
        )
    return problems


CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _connect_command(stack: Stack) -> tuple[list[str], dict[str, str]]:
    """The spark-connect service's command (interpolated) and its ``--conf`` settings."""
    command = [str(word) for word in stack.interpolate(stack.services["spark-connect"].get("command") or [])]
    confs = dict(command[i + 1].split("=", 1) for i, word in enumerate(command[:-1]) if word == "--conf")
    return command, confs


def _connect_connection_problems(stack: Stack, service: str, env: dict[str, str], conn_id: str) -> list[str]:
    """The ``spark_connect`` connection ``conn_id`` in ``service`` reaches the spark-connect server's port."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    if "spark-connect" not in stack.services:
        return [f"{service}: {var} has no spark-connect service to reach"]
    port = _connect_command(stack)[1].get("spark.connect.grpc.binding.port", "15002")
    try:
        connection = json.loads(env.get(var, "{}"))
    except ValueError:
        return [f"{service}: {var} is not a JSON connection"]
    url = urlsplit(str(connection.get("host", "")))
    if (
        connection.get("conn_type") != "spark_connect"
        or url.scheme != "sc"
        or url.hostname != "spark-connect"
        or str(connection.get("port") or url.port or 15002) != port
    ):
        return [f"{service}: {var} is not a spark_connect connection to sc://spark-connect:{port}"]
    return []


def spark_connect_problems(stack: Stack) -> list[str]:
    """The Spark Connect server runs the project image on the cluster, and every task can reach it."""
    services = stack.services
    if "spark-connect" not in services:
        return ["no spark-connect service: spark.mode: connect would have no server"]
    service = services["spark-connect"]
    problems = []
    if service.get("image") != services["airflow-scheduler"].get("image"):
        problems.append("spark-connect does not run the project image (its Python workers need the pins)")
    command, confs = _connect_command(stack)
    if command[:1] != ["spark-submit"] or CONNECT_SERVER_CLASS not in command:
        problems.append(f"spark-connect does not run spark-submit --class {CONNECT_SERVER_CLASS}")
    master = urlsplit(command[command.index("--master") + 1] if "--master" in command[:-1] else "")
    if master.scheme != "spark" or master.hostname not in services:
        problems.append(f"spark-connect: --master {master.geturl()!r} does not name a Spark master service")
    elif str(master.port) != stack.environment(master.hostname).get("SPARK_MASTER_PORT"):
        problems.append(f"spark-connect: --master port {master.port} is not the master's SPARK_MASTER_PORT")
    if depends_on(service).get(master.hostname or "", {}).get("condition") != "service_healthy":
        problems.append("spark-connect does not wait for its Spark master to be healthy")
    if not stack.environment("spark-connect").get("PYSPARK_PYTHON"):
        problems.append(
            "spark-connect: PYSPARK_PYTHON is not set (the server starts Python workers with it, not with "
            "spark.pyspark.python)"
        )
    for variable, value in WORKER_ENV.items():
        if confs.get(f"spark.executorEnv.{variable}") != value:
            problems.append(f"spark-connect: the Python workers lack {variable}={value} (spark.executorEnv)")
    if COORDINATOR_JAVA_OPTIONS not in confs.get("spark.driver.extraJavaOptions", "").split():
        problems.append(
            f"spark-connect: the driver JVM lacks {COORDINATOR_JAVA_OPTIONS} (spark.driver.extraJavaOptions)"
        )
    for name in config_services(stack):
        problems += _connect_connection_problems(
            stack, name, stack.environment(name), "spark_connect_default"
        )
    return problems


def _lifecycle_rules(stack: Stack, init_env: dict[str, str]) -> list[dict[str, Any]]:
    """The lifecycle rules minio-init imports: its printf format filled in as the shell would."""
    script = interpolate("\n".join(stack.services["minio-init"]["command"]), stack.env_example)
    match = re.search(r"printf '(?P<format>[^']*)' \"\$\{(?P<var>\w+)\}\"", script)
    if not match:
        return []
    return json.loads(match["format"] % init_env[match["var"]])["Rules"]


def layout_problems(stack: Stack) -> list[str]:
    """The project lands where Airflow and the DAG factory look, and CDC_CONFIG names the mounted file.

    Airflow's folders in the image are /opt/airflow/{dags,plugins}; the DAG factory
    submits spark_jobs/cdc_phase.py from the folder *beside* plugins/.
    """
    copies: dict[str, str] = {}
    for line in _instructions(stack.text("docker/Dockerfile")):
        words = [w for w in line.split() if not w.startswith("--")]
        if words[0] == "COPY":
            copies.update({src.rstrip("/"): words[-1].rstrip("/") for src in words[1:-1]})
    problems = [
        f"{src}/ is copied to {copies.get(src)}, not {target}"
        for src, target in (("dags", "/opt/airflow/dags"), ("plugins", "/opt/airflow/plugins"))
        if copies.get(src) != target
    ]
    if Path(copies.get("spark_jobs", "/")).parent != Path(copies.get("plugins", "/")).parent:
        problems.append(
            "spark_jobs/ is not beside plugins/ in the image: the DAG would submit the fallback app"
        )
    for name in config_services(stack):
        target = stack.services[name]["environment"]["CDC_CONFIG"]
        mounts = [
            v.split(":")[1] for v in stack.services[name].get("volumes", []) if v.startswith("./cdc.yaml:")
        ]
        if mounts != [target]:
            problems.append(f"{name}: CDC_CONFIG={target} but docker/cdc.yaml is mounted at {mounts}")
    return problems


def init_script_problems(stack: Stack) -> list[str]:
    """The Python that airflow-init runs (connections + config check) compiles."""
    script = "\n".join(stack.services["airflow-init"]["command"])
    match = re.search(r"<<'PY'\n(?P<code>.*?)\nPY\b", script, re.DOTALL)
    if not match:
        return ["airflow-init does not check the connections and the CDC config"]
    try:
        compile(match["code"], "airflow-init", "exec")
    except SyntaxError as exc:
        return [f"airflow-init's Python check does not compile: {exc}"]
    return []


def _instructions(dockerfile: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    )
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip()]


def _pins(stack: Stack) -> dict[str, str]:
    """``name -> version`` of constraints.txt's ``==`` pins (extras dropped): requirements.txt holds ranges."""
    lines = [line.strip() for line in stack.text("constraints.txt").splitlines()]
    matches = [_PIN.match(line) for line in lines if line and not line.startswith("#")]
    return {m["name"].split("[")[0].lower(): m["version"] for m in matches if m}


CHECKS: dict[str, Callable[[Stack], list[str]]] = {
    "structure": structure_problems,
    "dependencies": dependency_problems,
    "addresses": address_problems,
    "variables": variable_problems,
    "images": image_pin_problems,
    "healthchecks": healthcheck_problems,
    "credentials": credential_problems,
    "requirements": requirements_problems,
    "base_image": base_image_problems,
    "java": java_problems,
    "cdc_config": cdc_config_problems,
    "init_script": init_script_problems,
    "layout": layout_problems,
    "spark_connect": spark_connect_problems,
}


# ---------------------------------------------------------------------------------------
# The real stack passes every check.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_the_stack_passes(check):
    assert CHECKS[check](Stack(REPO)) == []


def test_compose_holds_the_stack():
    services = Stack(REPO).services
    expected = {
        "postgres", "minio", "minio-init", "iceberg-rest", "spark-master", "spark-worker-1",
        "spark-worker-2", "airflow-init", "airflow-api-server", "airflow-scheduler",
        "airflow-dag-processor", "airflow-triggerer", "redis", "airflow-worker",
    }  # fmt: skip
    assert expected <= set(services)
    assert services["redis"]["profiles"] == ["celery"] == services["airflow-worker"]["profiles"]
    spark_images = {services[name]["image"] for name in ("spark-master", "spark-worker-1", "spark-worker-2")}
    assert spark_images == {services["airflow-scheduler"]["image"]}, "Spark must run the project image"


def test_interpolation_follows_compose_rules():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("a${SET}b$${SET}$$x", env) == "avb${SET}$x"
    assert interpolate("${EMPTY:-d}|${EMPTY-d}|${MISSING-d}|${MISSING:-d}", env) == "d||d|d"
    assert interpolate("${SET:+alt}|${EMPTY:+alt}|${EMPTY+alt}|${MISSING+alt}", env) == "alt||alt|"
    with pytest.raises(KeyError, match="MISSING"):
        interpolate("${MISSING:?say why}", env)


# ---------------------------------------------------------------------------------------
# Every check fails on a broken copy of the stack.
# ---------------------------------------------------------------------------------------


def _replace(relative: str, old: str, new: str) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / relative
        text = path.read_text()
        assert old in text, f"mutation target {old!r} not in {relative}"
        path.write_text(text.replace(old, new, 1))

    return mutate


def _delete_healthcheck(service: str) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / "docker/compose.yaml"
        data = yaml.safe_load(path.read_text())
        del data["services"][service]["healthcheck"]
        path.write_text(yaml.safe_dump(data))

    return mutate


def _connect_mode(**spark: str) -> Callable[[Path], None]:
    """docker/cdc.yaml switched to ``spark.mode: connect`` (as docs/operating.md describes), plus ``spark``."""

    def mutate(root: Path) -> None:
        path = root / "docker/cdc.yaml"
        raw = yaml.safe_load(path.read_text())
        raw["spark"] = {"mode": "connect", "parallel_jobs": 2, **spark}
        path.write_text(yaml.safe_dump(raw))

    return mutate


BREAKAGES = {
    "dependency on a missing service": (
        "dependencies",
        _replace(
            "docker/compose.yaml",
            "  iceberg-rest:\n    condition: service_healthy",
            "  iceberg-rst:\n    condition: service_healthy",
        ),
    ),
    "default service depends on a profile-only one": (
        "dependencies",
        _replace(
            "docker/compose.yaml",
            "  airflow-init:\n    condition: service_completed_successfully\n\n# Where",
            "  airflow-init:\n    condition: service_completed_successfully\n  redis:\n    condition: service_healthy\n\n# Where",
        ),
    ),
    "one-shot awaited as healthy": (
        "dependencies",
        _replace(
            "docker/compose.yaml",
            "minio-init:\n        condition: service_completed_successfully\n    environment:\n      # CATALOG",
            "minio-init:\n        condition: service_healthy\n    environment:\n      # CATALOG",
        ),
    ),
    "URL to a service that does not exist": (
        "addresses",
        _replace(
            "docker/compose.yaml",
            "http://airflow-api-server:8080/execution/",
            "http://airflow-apiserver:8080/execution/",
        ),
    ),
    "variable nobody defines": (
        "variables",
        _replace("docker/compose.yaml", 'SPARK_MASTER_PORT: "7077"', "SPARK_MASTER_PORT: ${SPARK_PORT_TYPO}"),
    ),
    "variable dropped from .env.example": (
        "variables",
        _replace("docker/.env.example", "MINIO_ROOT_USER=minio-admin\n", ""),
    ),
    "bare $VAR that compose would swallow": (
        "variables",
        _replace("docker/compose.yaml", '--hostname \\"$${HOSTNAME}\\"', '--hostname \\"$HOSTNAME\\"'),
    ),
    "cdc.yaml uses a variable the containers lack": (
        "variables",
        _replace("docker/cdc.yaml", "uri: ${ICEBERG_REST_URI}", "uri: ${ICEBERG_REST_URL}"),
    ),
    "image on latest": (
        "images",
        _replace("docker/compose.yaml", "image: postgres:16.4", "image: postgres:latest"),
    ),
    "image without a tag": ("images", _replace("docker/compose.yaml", "image: redis:7.2.5", "image: redis")),
    "base image without a tag": (
        "images",
        _replace("docker/Dockerfile", "FROM apache/airflow:3.3.2-python3.11", "FROM apache/airflow"),
    ),
    "long-running service without healthcheck": ("healthchecks", _delete_healthcheck("iceberg-rest")),
    "service without restart policy": (
        "structure",
        _replace("docker/compose.yaml", '    restart: "no"\n\n  iceberg-rest:', "\n  iceberg-rest:"),
    ),
    "real-looking secret in .env.example": (
        "credentials",
        _replace(
            "docker/.env.example",
            "POSTGRES_PASSWORD=change-me-postgres-password",
            "POSTGRES_PASSWORD=Tr0ub4dor3",
        ),
    ),
    "literal password in compose": (
        "credentials",
        _replace(
            "docker/compose.yaml",
            "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD in docker/.env}\n      POSTGRES_DB",
            "POSTGRES_PASSWORD: airflow\n      POSTGRES_DB",
        ),
    ),
    "key-shaped token": (
        "credentials",
        _replace(
            "docker/.env.example",
            "CDC_S3_ACCESS_KEY_ID=cdc-pipeline",
            # built at run time, so no key-shaped literal sits in the repository
            "CDC_S3_ACCESS_KEY_ID=AKIA" + "EXAMPLE0" * 2,
        ),
    ),
    "dev requirements in the image": (
        "requirements",
        _replace("docker/Dockerfile", "-r /opt/cdc/requirements.txt", "-r /opt/cdc/requirements-dev.txt"),
    ),
    "extra package pinned apart": (
        "requirements",
        _replace(
            "docker/Dockerfile", "-c /opt/cdc/constraints.txt", "-c /opt/cdc/constraints.txt pyspark==3.5.1"
        ),
    ),
    "COPY source ignored by the build context": (
        "requirements",
        _replace("docker/Dockerfile.dockerignore", "!spark_jobs/\n", ""),
    ),
    "base image on another Airflow": (
        "base_image",
        _replace("docker/Dockerfile", "apache/airflow:3.3.2-python3.11", "apache/airflow:3.2.1-python3.11"),
    ),
    "base image on another Python": (
        "base_image",
        _replace("docker/Dockerfile", "apache/airflow:3.3.2-python3.11", "apache/airflow:3.3.2-python3.12"),
    ),
    "Java 21": ("java", _replace("docker/Dockerfile", "openjdk-17-jre-headless", "openjdk-21-jre-headless")),
    "config value the parser rejects": (
        "cdc_config",
        _replace("docker/cdc.yaml", "partitions: 64", "partitions: 0"),
    ),
    "config key the parser does not know": (
        "cdc_config",
        _replace("docker/cdc.yaml", "  retain_files: false", "  retain_file: false"),
    ),
    "shuffle prefix the lifecycle rule misses": (
        "cdc_config",
        _replace("docker/cdc.yaml", "/cdc-shuffle  ", "/shuffle  "),
    ),
    "connection the config names but compose lacks": (
        "cdc_config",
        _replace("docker/cdc.yaml", "airflow_conn_id: aws_minio", "airflow_conn_id: aws_s3"),
    ),
    "spark_jobs away from plugins": (
        "layout",
        _replace("docker/Dockerfile", "spark_jobs/ /opt/airflow/spark_jobs/", "spark_jobs/ /opt/spark_jobs/"),
    ),
    "config mounted where CDC_CONFIG does not point": (
        "layout",
        _replace(
            "docker/compose.yaml",
            "- ./cdc.yaml:/opt/cdc/cdc.yaml:ro\n    - airflow-logs",
            "- ./cdc.yaml:/opt/cdc/config.yaml:ro\n    - airflow-logs",
        ),
    ),
    "Spark Connect connection to another port": (
        "spark_connect",
        _replace(
            "docker/compose.yaml",
            '"sc://spark-connect", "port": 15002}',
            '"sc://spark-connect", "port": 15003}',
        ),
    ),
    "Spark Connect server without PYSPARK_PYTHON": (
        "spark_connect",
        _replace("docker/compose.yaml", "      PYSPARK_PYTHON: python\n", ""),
    ),
    "Spark Connect server on a master that does not exist": (
        "spark_connect",
        _replace(
            "docker/compose.yaml",
            "spark://spark-master:7077\n      - --driver-memory",
            "spark://spark-mastr:7077\n      - --driver-memory",
        ),
    ),
    "Spark Connect server whose workers give memory back": (
        "spark_connect",
        _replace("docker/compose.yaml", "spark.executorEnv.MIMALLOC_PURGE_DELAY=-1", "spark.executorEnv.X=1"),
    ),
    "Spark Connect server with the JVM's second JIT tier": (
        "spark_connect",
        _replace("docker/compose.yaml", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1", "spark.x=1"),
    ),
    "connect mode without its connection": (
        "cdc_config",
        _connect_mode(connect_conn_id="spark_connect_prod"),
    ),
    "init check that does not compile": (
        "init_script",
        _replace("docker/compose.yaml", "for conn_id in (", "for conn_id in ((("),
    ),
}


def test_cdc_config_in_connect_mode_fits_the_stack(stack_copy):
    """Switching docker/cdc.yaml to spark.mode: connect (as docs/operating.md says) needs nothing else."""
    _connect_mode()(stack_copy)
    assert yaml.safe_load((stack_copy / "docker/cdc.yaml").read_text())["spark"]["mode"] == "connect"
    assert cdc_config_problems(Stack(stack_copy)) == []


@pytest.fixture
def stack_copy(tmp_path: Path) -> Path:
    for relative in STACK_FILES:
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, target)
    for directory in ("dags", "plugins", "spark_jobs"):
        (tmp_path / directory).mkdir()  # COPY sources must exist; their content is not checked here
    return tmp_path


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_each_check_catches_its_breakage(stack_copy, breakage):
    check, mutate = BREAKAGES[breakage]
    assert CHECKS[check](Stack(stack_copy)) == [], "the unbroken copy must pass"
    mutate(stack_copy)
    assert CHECKS[check](Stack(stack_copy)), f"{check} did not notice: {breakage}"


# ---------------------------------------------------------------------------------------
# The demo seeder the `demo` profile runs, on a real catalog.
# ---------------------------------------------------------------------------------------


def test_seed_demo_creates_then_merges(tmp_path):
    spec = importlib.util.spec_from_file_location("seed_demo", REPO / "docker" / "seed_demo.py")
    seed_demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed_demo)
    config = tmp_path / "cdc.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "catalog": {
                    "name": "seed",
                    "type": "sql",
                    "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
                    "warehouse": f"file://{tmp_path / 'warehouse'}",
                },
                "shuffle": {"uri": f"file://{tmp_path / 'shuffle'}"},
                "tables": [{"source": "shop.orders", "sink": "shop.orders_changes"}],
            }
        )
    )
    created, first = seed_demo.seed(str(config), seed_value=1)
    merged, second = seed_demo.seed(str(config), seed_value=2)

    from pyiceberg.catalog import load_catalog

    table = load_catalog("seed", type="sql", uri=f"sqlite:///{tmp_path / 'catalog.db'}").load_table(
        "shop.orders"
    )
    snapshots = table.snapshots()
    assert [s.snapshot_id for s in snapshots] == [first, second]
    assert [s.summary.operation.value for s in snapshots] == ["append", "overwrite"]
    before, after = table.scan(snapshot_id=first).to_arrow(), table.scan(snapshot_id=second).to_arrow()
    assert before.num_rows == seed_demo.INITIAL_ROWS and after.num_rows == seed_demo.INITIAL_ROWS - 10 + 50
    assert pc.sum(pc.equal(after.column("status"), "shipped")).as_py() == 100
    assert "created shop.orders" in created and "merged into shop.orders" in merged
