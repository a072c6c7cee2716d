"""Reading the YAML file: ``${ENV_VAR}`` expansion, validation errors that name the key and the fix."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from iceberg_cdc.config.model import CdcConfig
from iceberg_cdc.errors import ConfigError

CONFIG_ENV = "CDC_CONFIG"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(
                    f"{where}: environment variable {name} is not set (referenced as ${{{name}}})"
                )
            return os.environ[name]

        return _ENV_REF.sub(replace, value)
    return value


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_config(raw: Any, source: str = "config") -> CdcConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with catalog, shuffle and tables")
    try:
        expanded = _expand_env(raw, "")
    except ConfigError as exc:
        raise ConfigError(
            f"{source} is invalid:\n  {exc}; set it in the environment of every process "
            "that reads the config (the DAG processor, the workers, the Spark driver)"
        ) from None
    try:
        return CdcConfig.model_validate(expanded)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = _location(error["loc"])
            if error["type"] == "extra_forbidden":
                problems.append(f"{where}: unknown key (check the spelling; see docs/configuration.md)")
            elif error["type"] == "missing":
                problems.append(f"{where}: required key is missing")
            else:
                message = error["msg"].removeprefix("Value error, ")
                problems.append(f"{where}: {message}" if where else message)
        raise ConfigError(f"{source} is invalid:\n  " + "\n  ".join(problems)) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML found wrong and where, without the snippet of the line it quotes.

    ``str()`` of a PyYAML error shows the offending line, and that line may hold
    a secret (a credential with a stray colon): line and column are enough.
    """
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = "; ".join(part for part in (exc.context, exc.problem) if part) or type(exc).__name__
        return f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark else what
    return type(exc).__name__


# libyaml's loader when PyYAML has it (the DAG processor loads the config at every parse of every DAG
# file: ~10x faster for a 1,000-table config); the same safe subset of YAML either way.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_config(path: str | os.PathLike[str] | None = None) -> CdcConfig:
    """Load the config from ``path``, or from the file ``CDC_CONFIG`` names."""
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"no config file: set {CONFIG_ENV} to the path of the YAML config")
    file = Path(path)
    try:
        raw = yaml.load(file.read_text(), Loader=_SAFE_LOADER)
    except FileNotFoundError:
        raise ConfigError(f"config file {file} does not exist (from {CONFIG_ENV} or --config)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {file} is not valid YAML: {_yaml_problem(exc)}") from None
    return parse_config(raw, str(file))
