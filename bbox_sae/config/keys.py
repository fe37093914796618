"""Which config fields are part of a stage's key: declared once, on each field of the schema.

A stage is redone when its key changes (`bbox_sae/bookkeeping.py`), so every field says which it is:

- `Key[T]`: changes what a stage writes; in the key of every stage that reads its section.
- `Operational[T]`: changes only where, how fast or in how much memory something runs (batching,
  devices, retries, concurrency, chunk sizes), or is read by no stage: in no key, so changing it
  never redoes work.
- `Name[T]`: names an entry of a list (a model); keys hold it as the entry's label, not among
  its settings.
- `Annotated[T, key_when(condition)]`: in the key only when `condition(section)` holds.

A section whose field says none of these is refused when the class is defined.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo

T = TypeVar("T")


@dataclass(frozen=True)
class KeyPolicy:
    """How a field takes part in the keys of the stages that read its section."""

    kind: Literal["key", "operational", "name"]
    condition: Callable[[Any], bool] | None = None

    def in_key(self, section: BaseModel) -> bool:
        return self.kind == "key" and (self.condition is None or self.condition(section))


Key = Annotated[T, KeyPolicy("key")]
Operational = Annotated[T, KeyPolicy("operational")]
Name = Annotated[T, KeyPolicy("name")]


def key_when(condition: Callable[[Any], bool]) -> KeyPolicy:
    """In the key only when `condition(section)` holds."""
    return KeyPolicy("key", condition)


def _section_type(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds (`corpus: CorpusConfig`, `models: list[ModelConfig]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return _section_type(item)
    return None


def _policies(info: FieldInfo) -> list[KeyPolicy]:
    return [m for m in info.metadata if isinstance(m, KeyPolicy)]


def field_policy(info: FieldInfo) -> KeyPolicy | None:
    """The field's declared policy; None for a field that holds a section (its fields say theirs)."""
    return next(iter(_policies(info)), None)


def unclassified_fields(section: type[BaseModel]) -> list[str]:
    """Fields that say neither Key, Operational, Name nor key_when (nor hold a section), or say two."""
    return [name for name, info in section.model_fields.items() if len(_policies(info)) != 1 and _section_type(info.annotation) is None]


def key_settings(section: BaseModel) -> dict:
    """The section's settings as stage keys hold them: its key fields, and its sections' by the same rule."""
    data = section.model_dump(mode="json")
    settings = {}
    for name, info in type(section).model_fields.items():
        policy = field_policy(info)
        value = getattr(section, name)
        if policy is None:
            settings[name] = [key_settings(v) for v in value] if isinstance(value, list) else key_settings(value)
        elif policy.in_key(section):
            settings[name] = data[name]
    return settings
