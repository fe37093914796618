"""What the pipeline does with its inputs: the matrix, the SAE, features, labels, the report."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from bbox_sae.config.keys import Key, Operational
from bbox_sae.config.section import Section, path_component
from bbox_sae.layout import beside_sae_runs


class BuildConfig(Section):
    performance: Key[Literal["probs", "logprobs", "delta", "delta_context"]] = "probs"
    output_feature_weight: Key[float] = Field(default=0.7, ge=0.0, le=1.0)
    prob_powers: Key[list[Annotated[float, Field(gt=0.0, le=1.0)]]] = Field(
        default=[1.0, 0.25],
        min_length=1,
        description="`performance: probs`: one column per model and power, p**power. p itself (1) shows differences "
        "on likely words and hides them on words neither model finds likely (p 5e-5 against 4e-6: both about 0); "
        "0.25 shows those (0.08 against 0.04) and compresses likely ones; [1, 0.25] gives both (docs/findings.md)",
    )
    dtype: Key[Literal["float32", "float16"]] = Field(
        default="float32",
        description="how matrix.npy stores its values: float16 halves its disk and page-cache size (10M words: ~16 GB "
        "instead of ~31 GB); every reader computes in float32. Its cost on the demo is in docs/scaling.md",
    )
    chunk_rows: Operational[int] = Field(default=65536, ge=1, description="rows held in memory at once")

    @field_validator("prob_powers")
    @classmethod
    def _powers_once(cls, powers: list[float]) -> list[float]:
        repeated = sorted({p for p in powers if powers.count(p) > 1})
        if repeated:
            # The same column twice would silently weigh that power double.
            raise ValueError(f"repeats {repeated}: each power is one column per model; list it once")
        return powers


class SAEConfig(Section):
    architecture: Key[Literal["topk", "batchtopk"]] = "batchtopk"
    d_sae: Key[int] = Field(default=3000, ge=1)
    k: Key[int] = Field(default=50, ge=1)
    lr: Key[float] = Field(default=2e-4, gt=0)
    lr_end: Key[float | None] = Field(default=None, ge=0, description="default lr / 10")
    lr_warm_up_steps: Key[int] = Field(default=0, ge=0)
    lr_decay_steps: Key[int] = Field(default=0, ge=0)
    lr_scheduler: Key[Literal["constant", "cosineannealing", "cosineannealingwarmrestarts"]] = "constant"
    batch_size: Key[int] = Field(default=4096, ge=1)
    epochs: Key[float] = Field(default=10.0, gt=0)
    total_rows: Key[int | None] = Field(default=None, ge=1, description="overrides epochs")
    aux_coefficient: Key[float] = Field(default=1 / 32, ge=0)
    sample_weighting: Key[Literal["none", "delta"]] = Field(
        default="none", description="draw train rows in proportion to how much the models differ on them (delta) or uniformly"
    )
    dead_feature_window: Key[int] = Field(default=1000, ge=1, description="steps without firing before a latent counts as dead")
    decoder_init_norm: Key[float] = Field(default=0.1, gt=0)
    seed: Key[int] = Field(default=0, ge=0, lt=2**32, description="torch and numpy take seeds 0 .. 2**32-1")
    dtype: Key[Literal["float32", "bfloat16"]] = "float32"
    device: Operational[str] = "auto"
    checkpoint_every: Operational[int] = Field(default=500, ge=1, description="steps between resumable checkpoints")
    run_name: Key[str | None] = Field(default=None, description="default derived from d_sae/k/architecture")

    @field_validator("run_name")
    @classmethod
    def _run_name_is_a_folder(cls, value: str | None) -> str | None:
        if value is None:
            return value
        value = path_component(value, "run_name")
        if beside_sae_runs(value):
            # Training would run to the end, then fail writing its weights into that file's place.
            raise ValueError(f"run_name {value!r} is reserved: sae/ holds a file of that name (bbox sweep's summary)")
        return value

    @model_validator(mode="after")
    def _check_k(self) -> SAEConfig:
        if self.k > self.d_sae:
            raise ValueError(f"k ({self.k}) must be <= d_sae ({self.d_sae})")
        return self

    def resolved_run_name(self) -> str:
        return self.run_name or f"{self.architecture}-d{self.d_sae}-k{self.k}"


class FeaturesConfig(Section):
    top_n: Key[int] = Field(default=50, ge=1)
    chunk_rows: Operational[int] = Field(default=16384, ge=1)
    min_abs_median_dlogp: Key[float] = Field(default=1.0, ge=0)
    min_abs_median_dp: Key[float] = Field(default=0.1, ge=0)
    q_threshold: Key[float] = Field(default=0.05, gt=0, le=1)
    require_generalize: Key[bool] = True
    require_significance: Key[bool] = True
    bootstrap_samples: Key[int] = Field(default=1000, ge=10)
    context_chars: Key[int] = Field(default=80, ge=0)
    baseline: Key[Literal["none", "random", "kmeans"]] = "none"
    min_activations: Key[int] = Field(default=5, ge=1, description="fewer top words (train or holdout) than this: never kept")
    ranking: Key[Literal["blind", "full"]] = Field(
        default="full",
        description="rank a latent's examples by its activation on the full row (the paper) or with the models made "
        "indistinguishable (blind: needed when `test: top`, so that the holdout top words are not chosen by their Δ)",
    )
    test: Key[Literal["rule", "top"]] = Field(
        default="rule",
        description="what is tested on holdout: the context rules latents propose (rule: on every holdout word the rule "
        "matches) or each latent's own holdout top words (top)",
    )
    max_rules_per_latent: Key[int] = Field(default=3, ge=1, description="rules a latent may propose (one per group it mixes)")
    min_rule_f1: Key[float] = Field(
        default=0.0, ge=0, le=1, description="kept latents need a context rule with at least this held-out F1 (0: no coherence requirement)"
    )
    rule_min_share: Key[float] = Field(default=0.1, gt=0, le=1, description="a rule's conditions must hold for this share of the top words")
    member_min_share: Key[float] = Field(
        default=0.2,
        ge=0,
        le=1,
        description="`test: rule`: a latent that proposed a kept rule is a kept feature only when its findings' rules cover this share of its train top words",
    )
    finding_overlap: Key[float] = Field(default=0.5, gt=0, le=1, description="kept rules (or latents) sharing this share of their words form one finding")
    rule_search: Key[bool] = Field(
        default=True,
        description="`test: rule`: also test every rule of the grammar with train support whose train median passes the effect rule "
        "(no SAE needed; latents then add the groups no single rule states, and join rules they carry together)",
    )
    latent_sets: Key[bool] = Field(
        default=True,
        description="`test: rule`: also test each difference-carrying latent's own word set, chosen by context alone (a group no single rule states)",
    )

    @property
    def source(self) -> str:
        """What the latents come from: the trained SAE, or the baseline."""
        return "sae" if self.baseline == "none" else self.baseline


class LabelConfig(Section):
    labeler: Key[Literal["auto", "heuristic", "llm"]] = "auto"
    base_url: Key[str | None] = None
    model: Key[str | None] = None
    api_key_env: Key[str] = "OPENAI_API_KEY"
    concurrency: Operational[int] = Field(default=4, ge=1)
    max_retries: Operational[int] = Field(default=4, ge=0)
    timeout_s: Operational[float] = Field(default=60.0, gt=0)
    backoff_base_s: Operational[float] = Field(default=1.0, ge=0, description="first retry waits about this long, doubling after")
    backoff_max_s: Operational[float] = Field(default=60.0, ge=0, description="cap on one backoff wait, a server's Retry-After included")
    temperature: Key[float | None] = Field(default=0.0, ge=0, description="null: leave it to the server (some models accept only their default)")
    examples: Key[int] = Field(default=20, ge=1, description="train contexts shown to the labeler")
    validation_examples: Key[int] = Field(default=10, ge=1, description="holdout positives (and as many negatives)")
    finding_validation_examples: Key[int] = Field(
        default=40, ge=2, description="a finding's statement: held-out words of the finding judged (and as many outside it, half of its own forms)"
    )
    contrast_examples: Key[int] = Field(
        default=10, ge=0, description="LLM labeler: train contexts of the same word forms where the latent is inactive, shown as counter-examples"
    )
    fuzz_examples: Key[int] = Field(
        default=10, ge=0, description="holdout positives for fuzzing scoring, half with the mark moved to a wrong word; 0: no fuzzing"
    )
    max_tokens_total: Key[int | None] = Field(
        default=None,
        ge=1,
        description="LLM labeler: send no request once this many prompt + completion tokens are spent, counting requests in flight "
        "at their estimate (prompt bytes / 3 + 100) and replies without token counts at theirs",
    )
    only_kept: Key[bool] = True
    json_mode: Key[bool] = True
    dry_run: Operational[bool] = Field(default=False, description="LLM labeler: print the label prompts, send and write nothing")
    prompt_cost_per_1k: Key[float] = 0.0
    completion_cost_per_1k: Key[float] = 0.0

    def resolved_labeler(self) -> str:
        if self.labeler == "auto":
            return "llm" if (self.base_url and self.model) else "heuristic"
        return self.labeler


class ReportConfig(Section):
    max_features: Key[int] = Field(default=500, ge=1, description="features shown in report.html")
    examples_per_feature: Key[int] = Field(default=20, ge=1, description="contexts per split for kept features and those of a finding")
    examples_per_other_feature: Key[int] = Field(
        default=10, ge=1, description="contexts per split for the other features: keeps report.html a few MB over thousands of latents"
    )
    domain_min_words: Key[int] = Field(default=3, ge=1, description="a finding's top words in a domain below this: too few to say whether it holds there")
    markdown_features: Key[int] = Field(default=10, ge=1, description="kept features per winning model in report.md")


class WandbConfig(Section):
    mode: Key[Literal["offline", "online", "disabled"]] = "offline"
    project: Key[str] = "bbox-sae"
    entity: Key[str | None] = None
    group: Key[str | None] = None
