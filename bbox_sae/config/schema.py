"""The whole config: one section per stage, and the paths of the run it describes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import yaml
from pydantic import Field, field_validator, model_validator

from bbox_sae.config.analysis import BuildConfig, FeaturesConfig, LabelConfig, ReportConfig, SAEConfig, WandbConfig
from bbox_sae.config.inputs import CorpusConfig, EmbeddingConfig, ModelConfig
from bbox_sae.config.keys import Key, Operational
from bbox_sae.config.section import Section, not_empty
from bbox_sae.errors import ConfigError, UndeclaredRead
from bbox_sae.layout import RunLayout, SaeRunLayout


class Config(Section):
    output_dir: Operational[str] = "runs/default"
    cache_dir: Operational[str] = Field(default="~/.cache/bbox-sae", description="converted model cache")
    seed: Key[int] = Field(default=0, ge=0, lt=2**32, description="numpy and torch take seeds 0 .. 2**32-1")
    # 100000 threads exhausted the address space before any stage ran.
    threads: Operational[int | None] = Field(default=None, ge=1, le=1024, description="torch CPU threads; default torch's choice")
    planted_rules: Operational[str | None] = Field(
        default=None, description="bbox eval planted: YAML file of the planted rules (--rules overrides; default configs/planted-rules-shakespeare.yaml)"
    )
    corpus: CorpusConfig
    models: list[ModelConfig] = Field(min_length=2)
    compare: Key[list[tuple[str, str]]] = Field(default_factory=list, description="pairs (A, B); default first two models")
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    build: BuildConfig = Field(default_factory=BuildConfig)
    sae: SAEConfig = Field(default_factory=SAEConfig)
    features: FeaturesConfig = Field(default_factory=FeaturesConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)

    _paths_not_empty = field_validator("output_dir", "cache_dir")(not_empty)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelConfig]) -> list[ModelConfig]:
        names = [m.name for m in models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate model names: {dupes}")
        return models

    @field_validator("compare")
    @classmethod
    def _each_pair_once(cls, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """A pair listed twice had every row of the features and labels twice; listed both ways,
        one difference was reported as two findings of opposite sign."""
        for i, (a, b) in enumerate(pairs):
            if (a, b) in pairs[:i]:
                raise ValueError(f"pair ({a}, {b}) is listed twice; list each pair once")
            if (b, a) in pairs[:i]:
                raise ValueError(f"pair ({a}, {b}) is pair ({b}, {a}) reversed, the same comparison with the opposite sign; list it once")
        return pairs

    @model_validator(mode="after")
    def _check_pairs(self) -> Config:
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

    def __getattribute__(self, name: str):
        # Only inside `reading`: the sections a running stage may read (a section it reads goes into
        # its key, so a read it does not declare is a result that can go stale unnoticed).
        readable = _READABLE.get()
        if readable is not None and name in SECTIONS and name not in readable[1]:
            raise UndeclaredRead(f"stage '{readable[0]}' read config section '{name}', which it does not declare (bbox_sae/stages.py)")
        return super().__getattribute__(name)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# Every field a stage may read only by declaring it; the run's folders (output_dir, cache_dir) and
# torch's threads are where and how it runs, not what it computes.
SECTIONS = frozenset(Config.model_fields) - {"output_dir", "cache_dir", "threads"}
_READABLE: ContextVar[tuple[str, frozenset[str]] | None] = ContextVar("readable_sections", default=None)


@contextmanager
def reading(stage: str, sections: frozenset[str]) -> Iterator[None]:
    """While `stage` runs, any other section of any `Config` refuses to be read."""
    unknown = sections - SECTIONS
    if unknown:
        raise ValueError(f"stage '{stage}' declares unknown config section(s) {sorted(unknown)}")
    token = _READABLE.set((stage, sections))
    try:
        yield
    finally:
        _READABLE.reset(token)
