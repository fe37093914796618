"""What the report shows of each finding beyond findings.parquet: held-out contexts and its BH q.

The features stage stores which held-out words each finding was tested on
(`finding_words.parquet`) but not their text, and the BH q of each tested candidate
(`rules.parquet`) but not of the finding the kept candidates form. Both are derived here from
tables the run already has, so a report re-run on an existing run shows them without re-running
the features stage.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from bbox_sae.artifacts import read_table, resolve_files
from bbox_sae.features.contexts import cut_context
from bbox_sae.layout import RunLayout, logprob_column
from bbox_sae.report.markup import num

FINDING_CONTEXTS = 5  # held-out contexts shown per finding
# Held-out words behind a finding in report.html's panel: all of them up to this many (evenly
# spread beyond), so a run with a finding of many thousands of words still gives a page of MBs.
FINDING_PANEL_WORDS = 2000


def spread(n: int, k: int) -> list[int]:
    """k positions out of n, evenly spread from first to last (all n when n <= k): examples that
    show the whole held-out set in corpus order, not its most striking words."""
    if n <= k:
        return list(range(n))
    return sorted({int(round(i)) for i in np.linspace(0, n - 1, k)})


def _chosen_words(paths: RunLayout, findings: list[dict], per_finding: int) -> pa.Table:
    """(finding, row, doc_id, word_idx) of the held-out words shown per finding, in corpus order."""
    words = read_table(paths.finding_words, columns=["finding", "split", "row", "doc_id", "word_idx"])
    words = words.filter(pc.equal(words["split"], "holdout")).sort_by([("finding", "ascending"), ("doc_id", "ascending"), ("word_idx", "ascending")])
    finding_col = words["finding"].to_numpy()
    keep = []
    for f in findings:
        at = np.flatnonzero(finding_col == f["finding"])
        keep.extend(at[spread(len(at), per_finding)].tolist())
    return words.take(pa.array(keep, pa.int64())).drop_columns(["split"])


def finding_contexts(paths: RunLayout, findings: list[dict], context_chars: int, per_finding: int = FINDING_CONTEXTS) -> dict[int, list[dict]]:
    """Per finding, up to `per_finding` of its held-out words with their text (cut as in
    contexts.parquet) and both models' log-probs; empty when the run lacks the tables to build them
    (no finding_words.parquet, build index, words or documents)."""
    needed = [paths.finding_words, paths.index, paths.documents, paths.words]
    if not findings or not all(p.exists() for p in needed):
        return {}
    chosen = _chosen_words(paths, findings, per_finding)
    models = sorted({m for f in findings for m in (f["model_a"], f["model_b"])})
    index = read_table(paths.index, columns=["row", *(logprob_column(m) for m in models)])
    index = index.filter(pc.is_in(index["row"], value_set=chosen["row"]))
    docs = pc.unique(chosen["doc_id"])
    files = [str(f) for f in resolve_files(paths.words)]
    offsets = pads.dataset(files, format="parquet").to_table(columns=["doc_id", "word_idx", "char_start", "char_end"], filter=pc.field("doc_id").isin(docs))
    documents = read_table(paths.documents, columns=["doc_id", "text"]).filter(pc.is_in(pc.field("doc_id"), value_set=docs))
    text_of = dict(zip(documents["doc_id"].to_pylist(), documents["text"].to_pylist()))
    span_of = {(d, i): (s, e) for d, i, s, e in zip(*(offsets[c].to_pylist() for c in ("doc_id", "word_idx", "char_start", "char_end")))}
    logprobs = {r["row"]: r for r in index.to_pylist()}
    expected = {m: _alternatives(paths, m, docs) for m in models}
    out: dict[int, list[dict]] = {}
    for w in chosen.to_pylist():
        span = span_of.get((w["doc_id"], w["word_idx"]))
        if span is None or w["doc_id"] not in text_of:
            continue
        left, word, right = cut_context(text_of[w["doc_id"]], *span, context_chars)
        scores = logprobs.get(w["row"], {})
        out.setdefault(w["finding"], []).append(
            {
                "doc_id": w["doc_id"],
                "word_idx": w["word_idx"],
                "left": left,
                "word": word,
                "right": right,
                "logprob": {m: scores.get(logprob_column(m)) for m in models},
                "expected": {m: expected[m].get((w["doc_id"], w["word_idx"])) for m in models},
            }
        )
    return out


def _alternatives(paths: RunLayout, model: str, docs: pa.Array) -> dict[tuple[str, int], list[tuple[str, float]]]:
    """(doc_id, word_idx) -> the tokens `model` expected most at the word, with their log-probs
    (`ModelConfig.alternatives`); empty for a model whose scores keep none (an endpoint, a Parquet
    file, a run scored before they were kept)."""
    directory = paths.logprobs(model)
    files = [str(f) for f in resolve_files(directory)] if directory.exists() else []
    if not files:
        return {}
    dataset = pads.dataset(files, format="parquet")
    if "top_tokens" not in dataset.schema.names:
        return {}
    table = dataset.to_table(columns=["doc_id", "word_idx", "top_tokens", "top_logprobs"], filter=pc.field("doc_id").isin(docs))
    return {
        (d, i): list(zip(tokens, lps))
        for d, i, tokens, lps in zip(*(table[c].to_pylist() for c in ("doc_id", "word_idx", "top_tokens", "top_logprobs")))
        if tokens is not None
    }


def finding_q_values(paths: RunLayout, findings: list[dict]) -> tuple[dict[int, float], int | None]:
    """Per finding the largest BH q among the passed candidates it joins (`findings.parquet`
    q_value), and how many candidates BH was over; ({}, None) when the run has no rules.parquet
    (`features.test: top`)."""
    if not paths.rules.exists():
        return {}, None
    family = sum(num(q) is not None for q in read_table(paths.rules, columns=["q_value"])["q_value"].to_pylist())  # untested: NaN
    return {f["finding"]: f["q_value"] for f in findings if num(f.get("q_value")) is not None}, family


def against_search(paths: RunLayout, findings: list[dict]) -> str | None:
    """The findings against the rule search (`rule_search.parquet`): how many distinct differences
    the grammar alone confirms, how many of them a finding covers, and how many findings no single
    rule states (what the SAE added). None for a run without the table (`features.test: top`)."""
    if not paths.rule_search.exists():
        return None
    covered = read_table(paths.rule_search, columns=["covered_by"])["covered_by"].to_pylist()
    beyond = sum(1 for f in findings if f.get("single_rule") is False)
    n = len(covered)
    share = f" ({sum(c is not None for c in covered) / n:.0%})" if n else ""
    return (
        f"Against the rule search: every rule of the grammar (a form; a form after a form or a class; a form at a line start or after a blank line; "
        f"a class after a form; a context attribute such as a long-range repeat, brackets or the sentence's first word, alone or with a form "
        f"or class; a form or any word with a cue word shortly before, earlier in its sentence or earlier in the text; a set of forms with a "
        f"topic word earlier in the text) tested the same way, with no SAE, confirms {n} distinct difference(s); the findings cover "
        f"{sum(c is not None for c in covered)}{share} of them (rule_search.parquet). {beyond} finding(s) are stated by no single rule of the "
        "grammar (a latent's group of words, or rules of one place joined by a latent or a layout): what the SAE and the grouping added."
    )
