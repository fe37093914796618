"""Each finding's statement, checked on held-out words it was not chosen on.

A rule finding is said by its rules; a latent finding offline by what its words share
(`features.word_sets.WordSet`, marked `word set`: a description, not a rule) or, with an LLM
endpoint, by the LLM's description (contrastive: the finding's train contexts against train
contexts of the same word forms outside it, delphi's contrastive explainer; HypotheSAEs' "the SAE
proposes a group, an LLM names it, the name is tested"), kept when it detects better.

Detection: a judge reading only the statement picks, among held-out words of the finding
(positives) and held-out words outside it (negatives: half of the finding's own word forms, the
near misses a statement naming only the words would take, half any word), those that fit.
Balanced accuracy, as for latents' labels (`scoring.detection_scores`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import read_table, sha256_file
from bbox_sae.corpus.words import split_words
from bbox_sae.features import FeatureSource, contexts_table
from bbox_sae.features.rules import normalize_form, rules_from_json
from bbox_sae.features.word_sets import WordSet
from bbox_sae.labeling.client import Stats
from bbox_sae.labeling.heuristic import context_matches, judged
from bbox_sae.labeling.llm import label_with_llm
from bbox_sae.labeling.records import Comparison, Context, FeatureExamples, LabelResult, context_of
from bbox_sae.layout import RunLayout

# finding_labels.parquet
FINDING_LABEL_SCHEMA = pa.schema(
    [
        ("finding", pa.int32()),
        ("statement", pa.string()),
        ("statement_source", pa.string()),
        ("statement_reason", pa.string()),
        ("detection", pa.float64()),
        ("detection_precision", pa.float64()),
        ("detection_recall", pa.float64()),
        ("detection_same_forms", pa.float64()),
        ("fuzz_score", pa.float64()),
    ]
)


@dataclass(frozen=True)
class Statement:
    """A finding's offline statement and its judge."""

    text: str
    source: str  # "rule" or "word set"
    rules: tuple = ()
    word_set: WordSet | None = None

    def fits(self, ctx: Context) -> bool:
        if self.word_set is not None:
            return self.word_set.matches(split_words(ctx.left), ctx.word)
        return any(context_matches(r, ctx) for r in self.rules)


def offline_statement(finding: dict) -> Statement:
    if finding.get("word_set_json"):
        word_set = WordSet.from_json(finding["word_set_json"])
        return Statement(word_set.describe(), "word set", word_set=word_set)
    return Statement(finding["statement"] or finding["rule"], "rule", rules=tuple(rules_from_json(finding["rule_json"])))


def _example_rows(src: FeatureSource, paths: RunLayout, findings: list[dict], rng: np.random.Generator, n: int, n_train: int, n_contrast: int) -> list[tuple]:
    """(finding, split, rank, row, 0.0, False) for each finding's shown words: `train` (its train
    words), `holdout` (its held-out words: the positives), `negative` (held-out words outside it,
    half of its own forms), `contrast` (train words of its forms outside it)."""
    m = src.matrix
    # Integer codes, and one reusable mask: per finding, strings compared over every row and a
    # sort per split made this stage grow faster than the corpus (3M words, 70 findings).
    _, form_code = np.unique(np.array([normalize_form(w) for w in src.words_of_row], dtype=object), return_inverse=True)
    covered = read_table(paths.finding_words, columns=["finding", "split", "row"])
    in_finding = np.zeros(len(form_code), dtype=bool)
    examples: list[tuple] = []
    for f in findings:
        mine = covered.filter(pc.field("finding") == f["finding"])
        rows = {split: mine.filter(pc.field("split") == split)["row"].to_numpy() for split in ("train", "holdout")}
        own_forms = np.unique(form_code[rows["train"]])
        outside = {}
        for split in ("train", "holdout"):
            in_finding[rows[split]] = True
            outside[split] = m.rows_by_split[split][~in_finding[m.rows_by_split[split]]]
            in_finding[rows[split]] = False
        same_form = {split: pool[np.isin(form_code[pool], own_forms)] for split, pool in outside.items()}
        picks = {
            "train": rng.permutation(rows["train"])[:n_train],
            "holdout": rng.permutation(rows["holdout"])[:n],
            "contrast": rng.permutation(same_form["train"])[:n_contrast],
        }
        near = rng.permutation(same_form["holdout"])[: n // 2]
        picks["negative"] = np.concatenate([near, rng.permutation(outside["holdout"])[: n - len(near)]])
        examples += [(f["finding"], split, rank, int(r), 0.0, False) for split, picked in picks.items() for rank, r in enumerate(picked)]
    return examples


def finding_examples(src: FeatureSource, paths: RunLayout, findings: list[dict], n: int, n_train: int, n_contrast: int) -> list[FeatureExamples]:
    """What a judge (and an LLM labeler) reads about each finding, in FeatureExamples' shape with
    the finding's number as its id."""
    if not findings:
        return []
    rng = np.random.default_rng(src.cfg.seed)
    examples = _example_rows(src, paths, findings, rng, n, n_train, n_contrast)
    m = src.matrix
    table = contexts_table(src.cfg, examples, m.index, m.models).to_pylist()
    by: dict[tuple[int, str], list[Context]] = {}
    for row in table:
        by.setdefault((row["latent"], row["split"]), []).append(context_of(row, m.models))
    return [
        FeatureExamples(
            latent=f["finding"],
            train=tuple(by.get((f["finding"], "train"), ())),
            holdout=tuple(by.get((f["finding"], "holdout"), ())),
            negative=tuple(by.get((f["finding"], "negative"), ())),
            comparisons=(Comparison(f["model_a"], f["model_b"], f["better_model"], f["holdout_median_dlogp"]),),
            contrast=tuple(by.get((f["finding"], "contrast"), ())),
        )
        for f in findings
    ]


def same_forms_detection(statement: Statement, feature: FeatureExamples) -> float | None:
    """Balanced accuracy of the statement on the finding's held-out words against held-out words of
    the same forms outside it: a list of forms scores chance, so what is left is what the statement
    says of the context. What a shown context cannot tell (a cue earlier in the text) is taken as
    holding (`rules.shown_word_attributes`), so a topic's statement scores chance here too."""
    own = {normalize_form(c.word) for c in (*feature.train, *feature.holdout)}
    near = [c for c in feature.negative if normalize_form(c.word) in own]
    if not near or not feature.holdout:
        return None
    hits = np.mean([statement.fits(c) for c in feature.holdout])
    rejections = np.mean([not statement.fits(c) for c in near])
    return float((hits + rejections) / 2)


def label_findings(src: FeatureSource, paths: RunLayout, stats: Stats | None) -> tuple[pa.Table, int]:
    """finding_labels.parquet's table (one row per finding), and how many findings were offered to
    the LLM: with an LLM labeler's `stats` (None offline), latent findings are, and its requests
    are counted there."""
    llm = stats is not None
    # Feature tables written by a user's own tool may come without findings: nothing to say then.
    findings = read_table(paths.findings).to_pylist() if paths.findings.exists() else []
    cfg = src.cfg
    lc = cfg.label
    examples = finding_examples(src, paths, findings, lc.finding_validation_examples, lc.examples, lc.contrast_examples if llm else 0)
    statements = {f["finding"]: offline_statement(f) for f in findings}

    def offline(feature: FeatureExamples, seed: int, n_fuzz: int) -> LabelResult:
        s = statements[feature.latent]
        return judged(s.text, s.source, True, s.fits, feature, seed, n_fuzz)

    to_llm = [e for e in examples if llm and statements[e.latent].source == "word set"]
    if to_llm:
        # Rule findings are said by their rules: an LLM's paraphrase adds nothing a reader cannot check.
        results, _ = asyncio.run(label_with_llm(to_llm, lc, paths.label_cache, cfg.seed, offline, stats, what="finding"))
        results.update({e.latent: offline(e, cfg.seed, lc.fuzz_examples) for e in examples if e.latent not in results})
    else:
        results = {e.latent: offline(e, cfg.seed, lc.fuzz_examples) for e in examples}
    same_forms = {e.latent: same_forms_detection(statements[e.latent], e) for e in examples}
    rows = [
        {
            "finding": f["finding"],
            "statement": r.label,
            "statement_source": r.source,
            "statement_reason": r.reason,
            "detection": r.score,
            "detection_precision": r.precision,
            "detection_recall": r.recall,
            "detection_same_forms": same_forms.get(f["finding"]) if r.label == statements[f["finding"]].text else None,
            "fuzz_score": r.fuzz,
        }
        for f in findings
        for r in [results[f["finding"]]]
    ]
    return pa.Table.from_pylist(rows, schema=FINDING_LABEL_SCHEMA), len(to_llm)


def _labels_describe(paths: RunLayout) -> bool:
    """finding_labels.parquet is of the findings.parquet there now: a features stage re-run since
    (new findings under the old numbers) leaves statements of other findings behind, which were
    read as these findings' own. Labels written before labels.json recorded the digest are taken."""
    if not paths.finding_labels.exists():
        return False
    try:
        labeled = json.loads(paths.label_stats.read_text()).get("findings_sha256")
    except (OSError, ValueError, AttributeError):
        return False
    return labeled is None or labeled == sha256_file(paths.findings)


def labeled_findings(paths: RunLayout) -> list[dict]:
    """findings.parquet rows with their statement's source and detection (finding_labels.parquet,
    once the label stage has run; the features stage's statement until then)."""
    findings = read_table(paths.findings).to_pylist()
    labels = {r["finding"]: r for r in read_table(paths.finding_labels).to_pylist()} if _labels_describe(paths) else {}
    out = []
    for f in findings:
        label = labels.get(f["finding"])
        extra = (
            {k: label[k] for k in FINDING_LABEL_SCHEMA.names if k != "finding"}
            if label
            else {
                "statement_source": "rule" if f.get("kind") == "rule" else "word set",
                "statement_reason": None,
                "detection": None,
                "detection_precision": None,
                "detection_recall": None,
                "detection_same_forms": None,
                "fuzz_score": None,
            }
        )
        out.append({**f, **extra, "statement": (label or {}).get("statement") or f.get("statement") or f.get("rule")})
    return out
