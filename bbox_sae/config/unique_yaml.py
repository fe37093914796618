"""YAML as configs are read: a key given twice is an error, not the last one silently kept."""

from __future__ import annotations

from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys: `d_sae: 32` then `d_sae: 16` would silently train 16."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` then a key of its own is YAML's way to override, not a repeat
            key = self.construct_object(key_node, deep=True)
            try:
                first = first_line.get(key)
            except TypeError:
                continue  # an unhashable key: the base class names it
            if first is not None:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (first at line {first})", key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)
