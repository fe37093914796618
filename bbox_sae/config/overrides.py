"""`--set a.b=value`: overrides applied to the raw YAML before validation, so they are checked
exactly like the file."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from bbox_sae.config.unique_yaml import yaml_load
from bbox_sae.errors import ConfigError


def _parse_value(key: str, text: str, source: str) -> Any:
    if text == "":
        return ""
    try:
        return yaml_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}: '{key}': value {text!r} is not valid YAML ({problem}); quote a string, e.g. {key}='\"{text}\"'") from None
    except (RecursionError, ValueError) as err:
        raise ConfigError(f"{source}: '{key}': value {text[:40]!r} is not valid YAML ({str(err).split(';')[0][:80] or 'nested too deeply'})") from None


def apply_overrides(raw: dict, overrides: list[str], source: str = "--set") -> dict:
    raw = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: override '{item}' is not key=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"{source}: override '{item}' does not name a config field (key '{key}')")
        node: Any = raw
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict):
                node = node.setdefault(part, {})
            else:
                raise ConfigError(f"{source}: '{key}': '{'.'.join(parts[: i + 1])}' is not a section")
        last = parts[-1]
        if isinstance(node, list) and last.isdigit() and int(last) < len(node):
            node[int(last)] = _parse_value(key, value, source)
        elif isinstance(node, dict):
            node[last] = _parse_value(key, value, source)
        else:
            raise ConfigError(f"{source}: '{key}' does not name a config field")
    return raw
