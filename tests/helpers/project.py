"""The tests' one tiny project: a corpus, its models and a config YAML, written from overrides.

`make_project(root, **overrides)` writes what a user keeps in a folder: the corpus (`c.jsonl`),
a log-prob Parquet file for each `source: parquet` model (a user's scores, written from the
corpus) and `cfg.yaml`. The defaults are the smallest project every stage runs on in seconds:
the six sample documents, two users' log-prob files, the tiny random encoder. Tests ask the
returned `Project` for paths (`project.paths` is the run's `RunLayout`) instead of spelling them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bbox_sae.config import Config, load_config
from bbox_sae.corpus.words import word_spans
from bbox_sae.layout import RunLayout
from helpers.assets import tiny_encoder_dir, tiny_lm_dir

# The sample corpus: line breaks, numbers, punctuation runs, non-Latin script and accents, so
# that word splitting and token alignment meet what real text holds.
SENTENCES = [
    "The ships were late, and the men were tired.\n\nThey slept.",
    "Three hundred and 12 crowns, said the steward.",
    "O Romeo, Romeo! wherefore art thou Romeo?",
    "If you were here, the day would be bright.",
    "As if it were nothing, he walked away — 日本語 café.",
    "Now is the winter of our discontent made glorious summer.",
]
# The default corpus: one document per sentence.
TEXTS = {f"d{i}": sentence for i, sentence in enumerate(SENTENCES)}
# Each user's log-prob file is this much lower than the one before, so the models differ everywhere.
USER_OFFSET = 0.5
# A tiny SAE and few bootstrap samples: `bbox run` through every stage in seconds.
SMALL_RUN = {
    "sae": {"architecture": "topk", "d_sae": 16, "k": 2, "batch_size": 8, "epochs": 10, "lr": 0.003, "checkpoint_every": 5},
    "features": {"top_n": 5, "bootstrap_samples": 20},
}


def sample_docs(n_docs: int, sentences_per_doc: int = 3, seed: int = 0, domains: tuple[str, ...] = ()) -> list[dict]:
    """`n_docs` documents of sentences drawn from SENTENCES, given `domains` in turn if any."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n_docs):
        doc = {"id": f"doc{i}", "text": " ".join(rng.choice(SENTENCES, size=sentences_per_doc))}
        if domains:
            doc["domain"] = domains[i % len(domains)]
        docs.append(doc)
    return docs


def _records(docs: dict[str, str] | list[dict]) -> list[dict]:
    return [{"id": d, "text": t} for d, t in docs.items()] if isinstance(docs, dict) else list(docs)


def write_corpus(path: Path, docs: dict[str, str] | list[dict]) -> None:
    """JSONL, one document a line: `docs` maps id to text, or is a list of records."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _records(docs)))


def write_logprobs(path: Path, docs: dict[str, str] | list[dict], offset: float = 0.0) -> None:
    """A user's per-word log-probs for `docs`, as `source: parquet` reads them; `offset` lower."""
    ids, idx, lp = [], [], []
    for record in _records(docs):
        for i, _ in enumerate(word_spans(record["text"])):
            ids.append(record["id"])
            idx.append(i)
            lp.append(-1.0 - offset - (i % 5) / 10)
    pq.write_table(pa.table({"doc_id": ids, "word_idx": pa.array(idx, pa.int32()), "logprob": lp}), path)


def tiny_model(name: str, kind: str = "smollm2", seed: int = 0, **settings) -> dict:
    """A model entry for a tiny random-weight causal LM (helpers.assets) with `kind`'s tokenizer."""
    entry = {"name": name, "source": "hf", "path": str(tiny_lm_dir(kind, seed)), "window": 32, "stride": 16}
    if kind == "smollm2":
        entry["start_token"] = "<|endoftext|>"
    if kind == "gemma":
        entry["logprob_chunk"] = 64
    return {**entry, **settings}


def tiny_pair() -> list[dict]:
    """Two tiny random models with different tokenizers: SmolLM2 (byte-level BPE) and Gemma 3."""
    return [tiny_model("smol"), tiny_model("gem", "gemma")]


@dataclass(frozen=True)
class Project:
    """A tiny project on disk: its folder, corpus and config, and the run's layout."""

    root: Path
    config: Path
    corpus: Path
    out: Path

    @property
    def paths(self) -> RunLayout:
        return RunLayout(self.out)

    def logprob_file(self, model: str) -> Path:
        """Where a `source: parquet` model's log-probs are written (the user's input file)."""
        return self.root / f"{model}.parquet"

    def load(self, *overrides: str, output_dir: str | Path | None = None) -> Config:
        return load_config(self.config, list(overrides), output_dir=None if output_dir is None else str(output_dir))


def make_project(
    root: Path, docs: dict[str, str] | list[dict] | None = TEXTS, models: Iterable[str | dict] = ("a", "b"), config_name: str = "cfg.yaml", **overrides: Any
) -> Project:
    """Write a tiny project into `root` and return it.

    `docs`: the corpus written to `root/c.jsonl` (id -> text, or records with a `domain`); None
    writes none (the test names or writes its own). `models`: a name is a user's log-prob file
    `root/<name>.parquet`, written from `docs` (each model USER_OFFSET lower than the one before);
    a dict is the model's config entry as is (`tiny_model`). `overrides`: config sections; a dict
    updates that section of the defaults, any other value replaces it, None removes it.
    """
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "c.jsonl"
    if docs is not None:
        write_corpus(corpus, docs)
    entries, users = [], 0
    for model in models:
        if isinstance(model, dict):
            entries.append(model)
            continue
        path = root / f"{model}.parquet"
        if docs is not None:
            write_logprobs(path, docs, USER_OFFSET * users)
        users += 1
        entries.append({"name": model, "source": "parquet", "path": str(path)})
    cfg: dict[str, Any] = {
        "output_dir": str(root / "out"),
        "cache_dir": str(root / "cache"),
        "corpus": {"path": str(corpus), "shard_docs": 2, "holdout_fraction": 0.3},
        "models": entries,
        "embedding": {"model": str(tiny_encoder_dir()), "window": 16, "stride": 8},
        "wandb": {"mode": "disabled"},
    }
    for section, value in overrides.items():
        if value is None:
            cfg.pop(section, None)
        elif isinstance(value, dict) and isinstance(cfg.get(section), dict):
            cfg[section] = {**cfg[section], **value}
        else:
            cfg[section] = value
    config = root / config_name
    config.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return Project(root=root, config=config, corpus=Path(cfg["corpus"]["path"]), out=Path(cfg["output_dir"]))


# A small SAE and lenient features, so that a run through `features` takes seconds; label.only_kept
# false, so that the label stage has latents to label although nothing passes on six documents.
SMALL_FEATURES_RUN = {
    "sae": {"architecture": "topk", "d_sae": 16, "k": 2, "epochs": 2, "batch_size": 16, "checkpoint_every": 2, "dead_feature_window": 2},
    "features": {"bootstrap_samples": 50, "top_n": 5, "min_activations": 1},
    "label": {"only_kept": False, "max_retries": 0, "backoff_base_s": 0.01, "backoff_max_s": 0.05, "api_key_env": "BBOX_TEST_UNSET_KEY"},
}


def run_through_features(directory: Path) -> Project:
    """A `SMALL_FEATURES_RUN` project in `directory`, run up to `features` (a module fixture's, copied by its tests with `copy_of`)."""
    from bbox_sae.cli import main

    project = make_project(directory, **SMALL_FEATURES_RUN)
    assert main(["run", "-c", str(project.config), "--until", "features"]) == 0
    return project


def copy_of(finished: Project, tmp_path: Path) -> RunLayout:
    """The finished run in a new output dir (copy2 keeps the times the manifest recorded)."""
    shutil.copytree(finished.out, tmp_path / "out")
    return RunLayout(tmp_path / "out")
