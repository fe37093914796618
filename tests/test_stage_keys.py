"""Stage keys follow the policy each config field declares (bbox_sae/config/keys.py).

Every field of the schema is walked: an operational field changes no stage's key, a key field
changes the key of exactly the stages that read its section, and a field that says neither is
refused when its section is defined.
"""

from __future__ import annotations

import copy
import typing
from typing import Literal

import pytest
from pydantic.fields import FieldInfo

from bbox_sae.bookkeeping import stage_key, staleness
from bbox_sae.config import Config, config_from_dict
from bbox_sae.config.keys import Key, Operational, field_policy, unclassified_fields
from bbox_sae.config.section import Section
from bbox_sae.manifest import Manifest, StageRecord
from bbox_sae.scoring.stage import model_key
from bbox_sae.stages import BY_NAME, STAGES
from helpers.stages import recorded

# Which stages read each section (or top-level field), as they declare it: a key field there is in their keys only.
READERS = {section: {s.name for s in STAGES if section in s.reads} for s_ in STAGES for section in s_.reads}
# The code versions in keys, each defined next to its code: (module, constant) -> the stage whose key holds it.
VERSIONS = {
    ("bbox_sae.scoring.precision", "PRECISION_VERSION"): "score",
    ("bbox_sae.features.grouping", "FINDINGS_VERSION"): "features",
    ("bbox_sae.labeling.heuristic", "OFFLINE_LABELER_VERSION"): "label",
}
# Fields whose other value is valid only together with another setting (applied before and after).
CONTEXT = {
    "corpus.hf_config": {"corpus.format": "hf"},
    "corpus.hf_streaming": {"corpus.format": "hf"},
    "models.0.tokenizer": {"models.0.source": "endpoint", "models.0.endpoints": ["http://x"], "models.0.tokenizer": "gpt2"},
    "models.0.device_map": {"models.0.source": "hf"},
}
MANIFEST = recorded("unused", *(s.name for s in STAGES))


def _sections(section: type[Section] = Config, prefix: str = "") -> list[tuple[str, type[Section]]]:
    """Every section of the schema with its path (a list's as its first entry's: `models.0.`)."""
    found = [(prefix, section)]
    for name, info in section.model_fields.items():
        if field_policy(info) is None:
            inner = info.annotation
            is_list = typing.get_origin(inner) is list
            found += _sections(typing.get_args(inner)[0] if is_list else inner, f"{prefix}{name}.{'0.' if is_list else ''}")
    return found


FIELDS = [(prefix + name, info) for prefix, section in _sections() for name, info in section.model_fields.items() if field_policy(info) is not None]


def _base(tmp_path) -> dict:
    (tmp_path / "c.jsonl").write_text('{"id": "d0", "text": "one two"}\n')
    return {
        "output_dir": str(tmp_path / "out"),
        "corpus": {"path": str(tmp_path / "c.jsonl")},
        "models": [{"name": "a", "source": "hf", "path": "org/a"}, {"name": "b", "source": "hf", "path": "org/b"}],
        "wandb": {"mode": "disabled"},
    }


def _set(raw: dict, path: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node = raw
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return raw


def _get(cfg: Config, path: str):
    node = cfg
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    return node


def _another_value(path: str, info: FieldInfo, value):
    """A valid value other than `value` for the field."""
    if path == "compare":
        return [["b", "a"]]
    annotation = info.annotation
    if type(None) in typing.get_args(annotation):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is Literal:
        return next(option for option in typing.get_args(annotation) if option != value)
    if annotation is bool:
        return not value
    if annotation is int:
        return 2 if value is None else value + 1
    if annotation is float:
        return value / 2 if value else 0.5
    if annotation is str:
        return f"{value or ''}x"
    if typing.get_origin(annotation) is list:
        item = typing.get_args(annotation)[0]
        return [*value, 0.5] if float in (item, *typing.get_args(item)) else ["x"]
    raise AssertionError(f"{path}: no other value for {annotation}")


def _keys(cfg: Config) -> dict:
    return {**{s.name: stage_key(s, cfg, MANIFEST) for s in STAGES}, **{f"model_key {m.name}": model_key(m) for m in cfg.models}}


def _before_after(tmp_path, path: str, info: FieldInfo) -> tuple[dict, dict]:
    raw = _base(tmp_path)
    for setting, value in CONTEXT.get(path, {}).items():
        raw = _set(raw, setting, value)
    before = config_from_dict(raw)
    after = config_from_dict(_set(raw, path, _another_value(path, info, _get(before, path))))
    assert _get(after, path) != _get(before, path)
    return _keys(before), _keys(after)


def test_every_config_field_says_whether_it_is_part_of_a_key():
    assert [s.__name__ for _, s in _sections() if unclassified_fields(s)] == []
    # Every section is read by some stage; the top level's other fields are operational.
    operational = {path for path, info in FIELDS if "." not in path and field_policy(info).kind == "operational"}
    assert {path.split(".")[0] for path, _ in FIELDS} - operational == set(READERS)

    with pytest.raises(TypeError, match=r"\['retries'\] must say whether they are part of a stage's key"):

        class Undecided(Section):
            depth: Key[int] = 1
            batch: Operational[int] = 8
            retries: int = 3


@pytest.mark.parametrize("path,info", [(p, i) for p, i in FIELDS if field_policy(i).kind == "operational"], ids=lambda v: v if isinstance(v, str) else "")
def test_an_operational_field_changes_no_key(tmp_path, path, info):
    before, after = _before_after(tmp_path, path, info)
    assert before == after


@pytest.mark.parametrize("path,info", [(p, i) for p, i in FIELDS if field_policy(i).kind == "key"], ids=lambda v: v if isinstance(v, str) else "")
def test_a_key_field_changes_the_keys_of_the_stages_that_read_it(tmp_path, path, info):
    before, after = _before_after(tmp_path, path, info)
    changed = {name for name in before if before[name] != after[name]}
    stages = changed & set(BY_NAME)
    assert stages == READERS[path.split(".")[0]]
    assert ("model_key a" in changed) == path.startswith("models.0.")


def test_a_model_name_labels_its_scores_and_is_not_among_their_settings(tmp_path):
    raw = _base(tmp_path)
    before, after = _keys(config_from_dict(raw)), _keys(config_from_dict(_set(raw, "models.0.name", "c")))
    # features: compare names it. The build follows through the score stage's digest (its outputs are named by the model).
    assert {n for n in before if n in after and before[n] != after[n]} == {"score", "features"}
    assert after["model_key c"] == before["model_key a"]


def test_conditional_key_fields_keep_the_keys_of_runs_made_before_them(tmp_path):
    raw = _base(tmp_path)
    default = _keys(config_from_dict(raw))
    # `head` and `refine_top` spelled at their defaults: the key of a run from before they existed.
    assert _keys(config_from_dict(_set(_set(raw, "models.0.head", "auto"), "models.0.refine_top", 32))) == default
    # A tokenizer decides an endpoint's tokens only; a local model brings its own.
    assert _keys(config_from_dict(_set(raw, "models.0.tokenizer", "gpt2"))) == default


@pytest.mark.parametrize("where,stage", VERSIONS.items(), ids=lambda v: v if isinstance(v, str) else v[1])
def test_a_new_code_version_is_in_the_key_of_its_stage(tmp_path, monkeypatch, where, stage):
    import importlib

    # The rounding code's version is in the key of the models that use it: `a`, in `mixed`, not `b`.
    cfg = config_from_dict(_set(_set(_base(tmp_path), "models.0.dtype", "mixed"), "models.1.dtype", "float32"))
    before = _keys(cfg)
    module, constant = where
    monkeypatch.setattr(importlib.import_module(module), constant, getattr(importlib.import_module(module), constant) + 1)
    after = _keys(cfg)
    assert {name for name in before if before[name] != after[name]} == ({"score", "model_key a"} if stage == "score" else {stage})


def test_a_run_stays_current_when_only_operational_fields_change(tmp_path):
    """The build stage recorded, then its chunk size changed: still current; its weight changed: redone."""
    raw = {**_base(tmp_path), "models": [{"name": n, "source": "parquet", "path": str(tmp_path / f"{n}.parquet")} for n in ("a", "b")]}
    cfg = config_from_dict(raw)
    build = BY_NAME["build"]
    for p in build.outputs(cfg):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(p.name)
    inputs = recorded(cfg.out, *(d.name for d in build.inputs))
    inputs.put(build.name, StageRecord.finished_now(cfg.out, stage_key(build, cfg, inputs), build.outputs(cfg), 0.0, None))
    manifest = Manifest.read(cfg.out)
    manifest.stages.update({n: inputs.get(n) for n in inputs.stages if n != build.name})
    assert staleness(build, cfg, manifest) is None
    assert staleness(build, config_from_dict(_set(raw, "build.chunk_rows", 7)), manifest) is None
    assert staleness(build, config_from_dict(_set(raw, "build.output_feature_weight", 0.5)), manifest) == "is out of date (its inputs or settings changed)"
