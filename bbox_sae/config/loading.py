"""Reading a config file: YAML that refuses repeated keys, validated into `Config` with errors that
name the key and the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bbox_sae.config.overrides import apply_overrides
from bbox_sae.config.schema import Config
from bbox_sae.config.unique_yaml import yaml_load
from bbox_sae.errors import ConfigError


def _format_validation_error(err: ValidationError, source: str) -> str:
    problems = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            problems.append(f"unknown key '{loc}'")
        elif e["type"] == "missing":
            problems.append(f"missing key '{loc}'")
        else:
            problems.append(f"'{loc}': {e['msg']}")
    return f"{source}: invalid config: " + "; ".join(problems)


def config_from_dict(raw: Any, source: str = "<config>") -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a config must be a YAML mapping, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def load_raw(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: config is not UTF-8 (byte {err.start})") from None
    try:
        raw = yaml_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except ValueError as err:
        # PyYAML lets int() errors through, e.g. an integer past Python's 4300-digit limit.
        raise ConfigError(f"{path}: invalid YAML: {str(err).split(';')[0]}") from None
    if raw is None:
        raise ConfigError(f"{path}: config file is empty")
    return raw


def load_config(path: str | Path, overrides: list[str] | None = None, output_dir: str | None = None) -> Config:
    raw = load_raw(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config must be a YAML mapping, got {type(raw).__name__}")
    raw = apply_overrides(raw, overrides or [], source=f"{path} (--set)")
    if output_dir is not None:
        if not output_dir.strip():
            raise ConfigError("--output-dir: is empty (an unset shell variable?); name the output folder")
        raw["output_dir"] = output_dir
    return config_from_dict(raw, source=str(path))
