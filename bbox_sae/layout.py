"""Where every artifact of a run lives, and how per-model columns are named.

The one place that spells artifact file names: stages, readers, the report and the tests
ask a `RunLayout` for a path instead of joining strings, so renaming a file or moving a
table is one edit here plus one line in `docs/artifacts.md` (a test checks they agree).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LOGPROB_PREFIX = "logprob__"


def logprob_column(model: str) -> str:
    """Column holding `model`'s per-word log-prob in tables that carry several models."""
    return f"{LOGPROB_PREFIX}{model}"


@dataclass(frozen=True)
class SaeRunLayout:
    """One trained SAE: the sae-lens inference model plus our metrics and checkpoints."""

    root: Path

    @property
    def weights(self) -> Path:
        return self.root / "sae_weights.safetensors"

    @property
    def sae_config(self) -> Path:
        return self.root / "cfg.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def run_config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def checkpoint_key(self) -> Path:
        """The train stage key the checkpoints were written under (resume only from the same key)."""
        return self.checkpoints / "key.txt"

    @property
    def features(self) -> RunLayout:
        """`bbox sweep` with features: this SAE's feature tables, apart from the run's own."""
        return RunLayout(self.root / "features")


def checkpoint_complete(checkpoint: Path) -> Path:
    """Marker written into a checkpoint folder once all its files are; resume ignores folders without it."""
    return checkpoint / ".complete"


def beside_models(name: str) -> bool:
    """Whether `name` is one of the files `logprobs/` holds beside its per-model folders (`score_stats`)."""
    return re.fullmatch(r"stats-\d+of\d+\.json", name) is not None


def beside_sae_runs(name: str) -> bool:
    """Whether `name` is one of the files `sae/` holds beside its runs' folders (the sweep summary)."""
    return name in ("sweep_summary.csv", "sweep_summary.png")


# The report's charts, next to report.md (which links them by these names).
REPORT_FOREST_PNG, REPORT_DOMAINS_PNG, REPORT_GAP_PNG = "report-forest.png", "report-domains.png", "report-gap.png"


@dataclass(frozen=True)
class RunLayout:
    """Every artifact under one run's `output_dir` (documented in docs/artifacts.md)."""

    root: Path

    # Run bookkeeping.
    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    # ingest
    @property
    def documents(self) -> Path:
        return self.root / "documents.parquet"

    @property
    def ingest_marker(self) -> Path:
        return self.root / "ingest.json"

    @property
    def words(self) -> Path:
        return self.root / "words"

    # score
    @property
    def logprobs_root(self) -> Path:
        return self.root / "logprobs"

    def logprobs(self, model: str) -> Path:
        return self.logprobs_root / model

    def score_stats(self, shard_index: int, shard_count: int) -> Path:
        return self.logprobs_root / f"stats-{shard_index}of{shard_count}.json"

    # embed
    @property
    def embeddings(self) -> Path:
        return self.root / "embeddings"

    @property
    def embedding_stats(self) -> Path:
        return self.embeddings / "stats.json"

    def embedding_shard_stats(self, shard_index: int, shard_count: int) -> Path:
        return self.embeddings / f"stats-{shard_index}of{shard_count}.json"

    # build
    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def matrix(self) -> Path:
        return self.build / "matrix.npy"

    @property
    def index(self) -> Path:
        return self.build / "index.parquet"

    @property
    def build_info(self) -> Path:
        return self.build / "build.json"

    # train
    @property
    def sae_root(self) -> Path:
        return self.root / "sae"

    def sae_run(self, run_name: str) -> SaeRunLayout:
        return SaeRunLayout(self.sae_root / run_name)

    @property
    def sweep_summary_csv(self) -> Path:
        return self.sae_root / "sweep_summary.csv"

    @property
    def sweep_summary_png(self) -> Path:
        return self.sae_root / "sweep_summary.png"

    # features
    @property
    def features(self) -> Path:
        return self.root / "features.parquet"

    @property
    def findings(self) -> Path:
        return self.root / "findings.parquet"

    @property
    def rules(self) -> Path:
        return self.root / "rules.parquet"

    @property
    def finding_words(self) -> Path:
        return self.root / "finding_words.parquet"

    @property
    def rule_search(self) -> Path:
        return self.root / "rule_search.parquet"

    @property
    def contexts(self) -> Path:
        return self.root / "contexts.parquet"

    @property
    def top_activations(self) -> Path:
        return self.root / "top_activations.parquet"

    @property
    def corpus_stats(self) -> Path:
        return self.root / "corpus_stats.json"

    def baseline(self, name: str) -> RunLayout:
        """Feature tables of a baseline (`random`, `kmeans`) live in a run layout of their own."""
        return RunLayout(self.root / "baselines" / name)

    # label
    @property
    def labels(self) -> Path:
        return self.root / "labels.parquet"

    @property
    def finding_labels(self) -> Path:
        return self.root / "finding_labels.parquet"

    @property
    def labels_dir(self) -> Path:
        return self.root / "labels"

    @property
    def label_negatives(self) -> Path:
        return self.labels_dir / "negatives.parquet"

    @property
    def label_cache(self) -> Path:
        return self.labels_dir / "cache"

    @property
    def label_stats(self) -> Path:
        return self.labels_dir / "labels.json"

    # report
    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_forest(self) -> Path:
        return self.root / REPORT_FOREST_PNG

    @property
    def report_domains(self) -> Path:
        return self.root / REPORT_DOMAINS_PNG

    @property
    def report_gap(self) -> Path:
        return self.root / REPORT_GAP_PNG

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"

    # evaluations
    @property
    def planted_results(self) -> Path:
        return self.root / "planted_results.json"

    @property
    def ablation_results(self) -> Path:
        return self.root / "ablation_results.json"

    @property
    def coherence(self) -> Path:
        return self.root / "coherence.json"

    @property
    def ablation_w0(self) -> RunLayout:
        """`bbox eval ablation`'s w = 0 variant: a run of its own sharing this run's scored words."""
        return RunLayout(self.root / "ablation-w0")

    @property
    def planted_logprobs(self) -> Path:
        """`bbox eval planted`'s model B log-probs, written here whatever model B's `path` says."""
        return self.root / "planted-B.parquet"

    def null_seed(self, seed: int | str) -> RunLayout:
        """`bbox eval planted`'s null pair for one SAE seed: a run of its own (`"*"`: the glob of them all)."""
        return RunLayout(self.root / f"null-seed{seed}")

    def null_logprobs(self, seed: int) -> Path:
        """The null pair's model B log-probs (A plus noise), imported like a user's file."""
        return self.null_seed(seed).root / "null-B.parquet"
