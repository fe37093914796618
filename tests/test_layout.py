"""The artifact layout: docs/artifacts.md agrees with `bbox_sae.layout`, and the features stage's
tables conform to the schemas declared in `bbox_sae.schemas`."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bbox_sae.artifacts import read_table
from bbox_sae.config import config_from_dict
from bbox_sae.labeling import run_label
from bbox_sae.layout import RunLayout, SaeRunLayout, logprob_column
from bbox_sae.schemas import TOP_ACTIVATIONS_SCHEMA, contexts_schema

DOCS = Path(__file__).resolve().parents[1] / "docs" / "artifacts.md"
ROOT = Path("/run")

# How docs/artifacts.md spells the argument of each parametrised path.
PLACEHOLDERS = {
    "logprobs": ("<model>",),
    "score_stats": ("<i>", "<n>"),
    "embedding_shard_stats": ("<i>", "<n>"),
    "sae_run": ("<run_name>",),
    "baseline": ("<random|kmeans>",),
    "null_seed": ("<seed>",),
    "null_logprobs": ("<seed>",),
}


def _rel(path: Path) -> str:
    return str(PurePosixPath(path.relative_to(ROOT)))


def named_paths(layout: RunLayout | SaeRunLayout) -> list[tuple[str, str]]:
    """(path relative to the run root, member naming it) for every path the layout names. A nested
    SaeRunLayout is walked; a nested RunLayout (baseline, variant) is a run of its own, named by its root."""
    found = []
    for name, member in inspect.getmembers(type(layout)):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            value = getattr(layout, name)
        elif inspect.isfunction(member):
            assert name in PLACEHOLDERS, f"layout method {name}: add its docs placeholder to PLACEHOLDERS"
            value = getattr(layout, name)(*PLACEHOLDERS[name])
        else:
            continue
        if isinstance(value, SaeRunLayout):
            found.append((_rel(value.root), name))
            found.extend((p, f"{name}.{m}") for p, m in named_paths(value))
        elif isinstance(value, RunLayout):
            found.append((_rel(value.root), name))
        else:
            found.append((_rel(value), name))
    return found


def layout_paths(layout: RunLayout) -> dict[str, str]:
    return dict(named_paths(layout))


def docs_rows() -> dict[str, str]:
    """First-column paths of the artifacts table (the one headed `| path |`) -> their whole row."""
    rows, in_table = {}, False
    for line in DOCS.read_text().splitlines():
        if line.startswith("| path |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if not in_table or line.startswith("|---"):
            continue
        first = re.split(r"(?<!\\)\|", line)[1]
        for path in re.findall(r"`([^`]+)`", first):
            rows[path.replace("\\|", "|").rstrip("/")] = line.replace("\\|", "|")
    return rows


def _mentioned(rel: str, row: str) -> bool:
    return any(token.rstrip("/") == rel for token in re.findall(r"`([^`]+)`", row))


def test_docs_table_parses():
    rows = docs_rows()
    assert {"documents.parquet", "words", "build/matrix.npy", "sae/<run_name>", "baselines/<random|kmeans>"} <= set(rows)


def test_every_layout_path_is_documented():
    rows = docs_rows()
    undocumented = []
    for path, member in layout_paths(RunLayout(ROOT)).items():
        if path in rows or any(doc.startswith(path + "/") for doc in rows):
            continue  # listed, or a folder whose contents are listed
        parents = [str(p) for p in PurePosixPath(path).parents if str(p) in rows]
        # Inside a listed folder: that folder's row names it (e.g. `cfg.json` in `sae/<run_name>/`).
        if parents and _mentioned(str(PurePosixPath(path).relative_to(parents[0])), rows[parents[0]]):
            continue
        undocumented.append(f"{member}: {path}")
    assert not undocumented, f"paths missing from {DOCS.name}: {undocumented}"


def test_every_documented_path_is_in_the_layout():
    named = set(layout_paths(RunLayout(ROOT)))
    unknown = sorted(set(docs_rows()) - named)
    assert not unknown, f"{DOCS.name} lists paths bbox_sae.layout does not name: {unknown}"


def test_layout_paths_are_distinct_and_inside_the_run():
    named = named_paths(RunLayout(ROOT))
    assert all(p and not p.startswith("..") for p, _ in named)
    # No two members name one path: two stages would overwrite each other's artifact.
    by_path: dict[str, list[str]] = {}
    for p, member in named:
        by_path.setdefault(p, []).append(member)
    shared = {p: m for p, m in by_path.items() if len(m) > 1}
    assert not shared, f"paths named twice: {shared}"


def test_config_paths_follow_the_config():
    cfg = config_from_dict(
        {
            "output_dir": "/tmp/some-run",
            "corpus": {"path": "unused"},
            "models": [{"name": "a", "source": "parquet", "path": "x"}, {"name": "b", "source": "parquet", "path": "y"}],
            "sae": {"d_sae": 64, "k": 4},
        }
    )
    assert cfg.paths == RunLayout(cfg.out)
    assert cfg.sae_paths.root.parent == cfg.paths.sae_root
    assert cfg.sae_paths.root.name == cfg.sae.resolved_run_name()


# ------------------------------------------------------------------ schemas of the features stage


@pytest.fixture(scope="module")
def features_run(tmp_path_factory, tiny_encoder):
    """ingest -> score (imported log-probs) -> embed (tiny encoder) -> build -> train -> features, small."""
    from bbox_sae.build.matrix import run_build
    from bbox_sae.corpus.ingest import ingest
    from bbox_sae.embedding.stage import run_embed
    from bbox_sae.features import run_features
    from bbox_sae.train.sae import run_train
    from helpers.stages import score

    root = tmp_path_factory.mktemp("layout")
    rng = np.random.default_rng(0)
    sentences = ["If you were here, all would be well.", "The men were tired.", "We sat by the fire.", "Bring me the book."]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": " ".join(rng.choice(sentences, size=3))}) + "\n" for i in range(40)))
    cfg = config_from_dict(
        {
            "output_dir": str(root / "out"),
            "corpus": {"path": str(root / "corpus.jsonl"), "shard_docs": 16, "holdout_fraction": 0.3},
            "models": [{"name": m, "source": "parquet", "path": str(root / f"{m}.parquet")} for m in ("A", "B")],
            "embedding": {"model": str(tiny_encoder), "window": 32, "stride": 16},
            "sae": {"architecture": "topk", "d_sae": 16, "k": 2, "batch_size": 64, "epochs": 2, "lr": 0.003, "dead_feature_window": 10},
            "features": {"top_n": 8, "bootstrap_samples": 50},
            # Negatives are drawn for every labeled latent: label them all, so some are drawn.
            "label": {"only_kept": False},
            "wandb": {"mode": "disabled"},
        }
    )
    ingest(cfg)
    words = read_table(cfg.paths.words)
    for m in ("A", "B"):
        lp = np.log(rng.uniform(0.05, 0.9, size=words.num_rows))
        pq.write_table(pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp}), root / f"{m}.parquet")
    score(cfg)
    run_embed(cfg)
    run_build(cfg)
    run_train(cfg)
    run_features(cfg)
    return cfg


def test_top_activations_conform_to_their_schema(features_run):
    top = read_table(features_run.paths.top_activations)
    assert top.num_rows > 0
    assert top.schema.remove_metadata().equals(TOP_ACTIVATIONS_SCHEMA), f"{top.schema} != {TOP_ACTIVATIONS_SCHEMA}"


def test_contexts_conform_to_their_schema(features_run):
    models = [m.name for m in features_run.models]
    contexts = read_table(features_run.paths.contexts)
    assert set(contexts["split"].to_pylist()) == {"train", "holdout"}
    expected = contexts_schema(models)
    assert contexts.schema.remove_metadata().equals(expected), f"{contexts.schema} != {expected}"
    assert [logprob_column(m) for m in models] == expected.names[-len(models) :]


def test_label_negatives_conform_to_the_contexts_schema(features_run):
    run_label(features_run)
    negatives = read_table(features_run.paths.label_negatives)
    assert set(negatives["split"].to_pylist()) == {"negative"}
    expected = contexts_schema([m.name for m in features_run.models])
    assert negatives.schema.remove_metadata().equals(expected), f"{negatives.schema} != {expected}"


def test_records_spell_the_columns_of_their_tables_once():
    """features, findings and rules tables are built from records whose fields are their columns: a
    row that names a column the table does not have is refused, not left out without a word."""
    from dataclasses import fields

    from bbox_sae.schemas import FEATURE_SCHEMA, FINDING_SCHEMA, TESTED_RULE_SCHEMA, FeatureRecord, FindingRecord, TestedRuleRecord, records_table

    for record, schema in ((FeatureRecord, FEATURE_SCHEMA), (FindingRecord, FINDING_SCHEMA), (TestedRuleRecord, TESTED_RULE_SCHEMA)):
        assert [f.name for f in fields(record)] == schema.names
    table = records_table([TestedRuleRecord(model_a="a", passed=True), {"model_a": "b", "q_value": 0.5}], TestedRuleRecord)
    assert table.schema == TESTED_RULE_SCHEMA and table["model_a"].to_pylist() == ["a", "b"] and table["passed"].to_pylist() == [True, None]
    with pytest.raises(TypeError, match="better_modle"):
        records_table([{"model_a": "a", "better_modle": "a"}], TestedRuleRecord)
