"""The base of every config section: strict fields, and the checks every field gets."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from bbox_sae.config.keys import unclassified_fields


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def not_empty(value: str) -> str:
    # An empty path is the working directory: an unset shell variable (`-o "$OUT"`) would write
    # the run there, over whatever config.yaml it holds, or read it as the corpus.
    if not value.strip():
        raise ValueError("is empty (an unset shell variable?); name a file or folder")
    return value


def path_component(value: str, what: str) -> str:
    # The name becomes a folder (logprobs/<name>, sae/<run_name>): '..' would be the output dir
    # itself, and removing "its" folder would remove the whole run.
    if value in ("", ".", "..") or "/" in value or "\\" in value:
        raise ValueError(f"{what} {value!r} is not usable as a folder name (empty, '.', '..', or holds '/' or '\\')")
    return value


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType, list, tuple):
        return any(_admits_bool(a) for a in typing.get_args(annotation))
    return False


def type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # A field nobody classified would silently be part of every key, or of none.
        super().__pydantic_init_subclass__(**kwargs)
        missing = unclassified_fields(cls)
        if missing:
            raise TypeError(
                f"{cls.__name__}: field(s) {missing} must say whether they are part of a stage's key: "
                "Key[...], Operational[...], Name[...] or key_when(...) (bbox_sae/config/keys.py)"
            )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # Pydantic reads true as 1 for a number; `sae.epochs=true` is a mistake, not one epoch.
        if isinstance(value, bool) and not _admits_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected {type_name(cls.model_fields[info.field_name].annotation)}, got a boolean")
        return value

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # A NUL in a path or name would only fail later, deep in the OS layer, as a bare ValueError.
        if _has_nul(value):
            raise ValueError("contains a NUL character")
        return value
