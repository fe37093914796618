"""No stale result, ever: after any edit between runs, `bbox run` gives exactly what a
fresh run in a new directory gives.

The property test draws a corpus, runs the pipeline, applies random edits (a document's text
with the same or another word count, documents added or removed, the split settings, a user's
log-prob Parquet rewritten, the shard size), runs again in the same directory and compares
every artifact, byte for byte, with a fresh run on the edited inputs. It runs the stages up to
build: every later stage's key is built from the build's recorded digest and its own settings
(`bbox_sae.stages`), so they follow from a correct build key; the chain itself is checked on
the real CLI in the regression tests below.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbox_sae.config import load_config
from bbox_sae.corpus.words import word_spans
from bbox_sae.layout import RunLayout
from bbox_sae.manifest import Manifest
from bbox_sae.pipeline import run_all
from helpers.hardening import hardening_project
from helpers.project import tiny_model

WORDS = ["the", "ships", "were", "late", "Romeo", "café", "crowns", "said", "12", ",", ".", "!", "\n", "日本語", "thou"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Written with the run's time or the command's own config, not derived from the inputs.
_RUN = RunLayout(Path())
NOT_COMPARED = {_RUN.manifest.name, _RUN.config.name, _RUN.embedding_stats.name, _RUN.score_stats(0, 1).name, _RUN.lock.name}


def user_logprobs(texts: dict[str, str], salt: int) -> pa.Table:
    """A user's per-word log-probs for this corpus: a deterministic function of (salt, document, word)."""
    ids, idx, lp = [], [], []
    for doc_id, text in texts.items():
        for i, (s, e) in enumerate(word_spans(text)):
            ids.append(doc_id)
            idx.append(i)
            digest = hashlib.sha256(json.dumps([salt, doc_id, i, text[s:e]]).encode()).digest()
            lp.append(-1.0 - int.from_bytes(digest[:4], "little") % 997 / 100)
    return pa.table({"doc_id": ids, "word_idx": pa.array(idx, pa.int32()), "logprob": lp})


class EditedProject:
    """The inputs a user edits: corpus, their log-prob file, the corpus and split settings."""

    def __init__(self, root: Path):
        self.root = root
        self.texts: dict[str, str] = {}
        self.salt = 0
        self.corpus: dict[str, object] = {"shard_docs": 2, "holdout_fraction": 0.3}
        self.seed = 0
        self.config: Path | None = None

    def write(self) -> None:
        # The hardening tests' project, one of its models replaced by the user's log-prob file.
        project = hardening_project(self.root, docs=self.texts, models=[tiny_model("smol"), "user"], corpus=self.corpus, seed=self.seed)
        pq.write_table(user_logprobs(self.texts, self.salt), project.logprob_file("user"))
        self.config = project.config

    def run(self, out: Path) -> None:
        run_all(load_config(self.config, output_dir=str(out)), until="build")


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name not in NOT_COMPARED and not p.name.startswith(".")
    }


def assert_same_as_fresh(stale: Path, fresh: Path) -> None:
    mine, theirs = _files(stale), _files(fresh)
    assert sorted(mine) == sorted(theirs), f"files differ: only stale {sorted(set(mine) - set(theirs))}, only fresh {sorted(set(theirs) - set(mine))}"
    differ = [rel for rel in mine if mine[rel] != theirs[rel]]
    assert not differ, f"stale artifacts after the edit: {differ}"
    keys = {n: (r.key, r.digest) for n, r in Manifest.read(stale).stages.items()}
    assert keys == {n: (r.key, r.digest) for n, r in Manifest.read(fresh).stages.items()}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Loaded models are reused across examples (they never change); fsync is skipped (durability is not under test)."""
    from bbox_sae.embedding import stage as embedding
    from bbox_sae.scoring import stage

    root = tmp_path_factory.mktemp("edits")
    scorers, embedders = {}, {}
    real_scorer, real_embedder = stage.make_scorer, embedding.load_embedder
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stage, "make_scorer", lambda m, cfg: scorers.get(m.name) or scorers.setdefault(m.name, real_scorer(m, cfg)))
        mp.setattr(embedding, "load_embedder", lambda e: embedders.get("e") or embedders.setdefault("e", real_embedder(e)))
        mp.setattr(os, "fsync", lambda fd: None)
        yield root


def _text(draw) -> str:
    return " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=10))) + "."


@st.composite
def corpus(draw) -> dict[str, str]:
    n = draw(st.integers(2, 6))
    return {f"d{i}": _text(draw) for i in range(n)}


@st.composite
def edit(draw):
    kind = draw(st.sampled_from(["same_count", "other_count", "add", "remove", "split", "user_file", "shard_docs"]))
    if kind == "same_count":
        return kind, draw(st.integers(0, 10**6)), draw(st.sampled_from(LETTERS))
    if kind in ("other_count", "add"):
        return kind, draw(st.integers(0, 10**6)), _text(draw)
    if kind == "remove":
        return kind, draw(st.integers(0, 10**6))
    if kind == "split":
        return kind, draw(st.sampled_from([0.0, 0.2, 0.5, 0.8])), draw(st.integers(0, 3))
    if kind == "user_file":
        return kind, draw(st.integers(1, 10**6))
    return kind, draw(st.integers(1, 4))


def apply(project: EditedProject, change) -> None:
    kind, *args = change
    ids = sorted(project.texts)
    if kind == "same_count":
        # One letter of one word changed: the same words, one of them spelt differently.
        doc_id = ids[args[0] % len(ids)]
        text = project.texts[doc_id]
        letters = [i for i, c in enumerate(text) if c in LETTERS]
        if letters:
            i = letters[args[0] % len(letters)]
            project.texts[doc_id] = text[:i] + (args[1] if text[i] != args[1] else "z" if args[1] != "z" else "y") + text[i + 1 :]
    elif kind == "other_count":
        doc_id = ids[args[0] % len(ids)]
        project.texts[doc_id] = project.texts[doc_id] + " " + args[1]
    elif kind == "add":
        project.texts[f"n{args[0]}"] = args[1]
    elif kind == "remove" and len(ids) > 1:
        del project.texts[ids[args[0] % len(ids)]]
    elif kind == "split":
        project.corpus["holdout_fraction"], project.seed = args[0], args[1]
    elif kind == "user_file":
        project.salt = args[0]
    elif kind == "shard_docs":
        project.corpus["shard_docs"] = args[0]


EXAMPLES = int(os.environ.get("BBOX_EDIT_EXAMPLES", 200))


@pytest.mark.slow  # 10 examples took 27 s with model setup on a lightly loaded 2-core machine; 200, several minutes
@given(before=corpus(), changes=st.lists(edit(), min_size=1, max_size=3))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_any_edit_then_run_equals_a_fresh_run(shared, before, changes):
    root = shared
    for d in ("stale", "fresh"):
        shutil.rmtree(root / d, ignore_errors=True)
    project = EditedProject(root)
    project.texts = dict(before)
    project.write()
    project.run(root / "stale")
    for change in changes:
        apply(project, change)
    project.write()
    project.run(root / "stale")
    project.run(root / "fresh")
    assert_same_as_fresh(root / "stale", root / "fresh")
