"""What the report reads: the feature table (with its labels), contexts, corpus stats, domains,
SAE metrics and findings (with their held-out contexts and q, `finding_inputs`), all located
through `cfg.paths`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import ValidationError

from bbox_sae.artifacts import read_table, require_columns, resolve_files
from bbox_sae.config import Config, FeaturesConfig
from bbox_sae.errors import ArtifactError
from bbox_sae.labeling.finding_statements import labeled_findings
from bbox_sae.labeling.table import labeled_features
from bbox_sae.layout import RunLayout, logprob_column
from bbox_sae.report.finding_inputs import FINDING_PANEL_WORDS, against_search, finding_contexts, finding_q_values
from bbox_sae.report.gap import GapAccount, gap_accounts
from bbox_sae.report.markup import num

FEATURE_REQUIRED = ["latent", "model_a", "model_b", "kept", "better_model", "median_dlogp", "top_words"]
FEATURE_OPTIONAL = [
    "n_top", "density", "max_activation", "mean_dlogp", "median_dp", "ci_low", "ci_high", "consistency",
    "p_value", "q_value", "coherence", "holdout_n", "holdout_median_dlogp", "holdout_mean_dlogp",
    "holdout_median_dp", "generalizes", "paper_rule", "source", "label", "label_source", "label_reason",
    "label_coherent", "label_score", "label_precision", "label_recall", "finding", "rule", "rule_precision",
    "rule_recall", "rule_f1", "holdout_ci_low", "holdout_ci_high", "findings",
]  # fmt: skip
# Label scores beyond detection (`label_score`): shown in the browser and W&B only when the
# labeler wrote the column, so a run labeled without them has no column of blanks.
EXTRA_SCORE_COLUMNS = ["fuzz_score"]
CONTEXT_REQUIRED = ["latent", "split", "rank", "doc_id", "word_idx", "in_top", "left", "word", "right"]


@dataclass
class ReportInputs:
    paths: RunLayout
    features: list[dict]
    contexts: dict[int, dict[str, list[dict]]]  # latent -> split -> rows in rank order
    stats: dict
    domains: dict[str, str]
    sae_runs: dict[str, dict]
    settings: FeaturesConfig  # those the features stage decided with (corpus_stats.json)
    findings: list[dict] = field(default_factory=list)
    score_columns: list[str] = field(default_factory=list)  # the EXTRA_SCORE_COLUMNS present
    finding_contexts: dict[int, list[dict]] = field(default_factory=dict)  # finding -> held-out contexts
    finding_words: dict[int, list[dict]] = field(default_factory=dict)  # finding -> every held-out word (report.html's panel)
    finding_q: dict[int, float] = field(default_factory=dict)  # finding -> BH q (finding_inputs.finding_q_values)
    candidate_family: int | None = None  # how many candidates BH was over
    against_search: str | None = None  # the findings against the rule search (finding_inputs.against_search)
    rule_search: pa.Table | None = None  # rule_search.parquet, when the run has one
    gap: list[GapAccount] = field(default_factory=list)  # per pair, on held-out words (`gap`); empty without a build index

    @property
    def models(self) -> list[str]:
        return list(self.stats.get("models", {}))


def _feature_record(row: dict, extra: list[str]) -> dict:
    rec = {k: row.get(k) for k in FEATURE_REQUIRED + FEATURE_OPTIONAL + extra}
    for k, v in rec.items():
        if isinstance(v, float):
            rec[k] = num(v)
    rec["kept"] = bool(rec["kept"])
    rec["source"] = rec["source"] or "sae"
    rec["key"] = f"{rec['source']}:{rec['latent']}:{rec['model_a']}:{rec['model_b']}"
    return rec


def read_feature_table(paths: RunLayout) -> pa.Table:
    """features.parquet with the label columns of labels.parquet joined on (latent, pair)."""
    table = labeled_features(paths)
    require_columns(table, FEATURE_REQUIRED, str(paths.features))
    return table


def load_features(table: pa.Table) -> tuple[list[dict], list[str]]:
    """Feature records, and which of EXTRA_SCORE_COLUMNS the table fills for at least one feature."""
    extra = [c for c in EXTRA_SCORE_COLUMNS if c in table.column_names and table[c].null_count < table.num_rows]
    return [_feature_record(r, extra) for r in table.to_pylist()], extra


def load_contexts(path: Path, models: list[str]) -> dict[int, dict[str, list[dict]]]:
    table = read_table(path)
    require_columns(table, CONTEXT_REQUIRED + [logprob_column(m) for m in models], str(path))
    table = table.filter(pc.is_in(table["split"], value_set=pa.array(["train", "holdout"], pa.string())))
    out: dict[int, dict[str, list[dict]]] = {}
    for row in table.to_pylist():
        out.setdefault(row["latent"], {"train": [], "holdout": []})[row["split"]].append(row)
    for splits in out.values():
        for rows in splits.values():
            rows.sort(key=lambda r: r["rank"])
    return out


def load_domains(path: Path) -> dict[str, str]:
    """doc_id -> domain from documents.parquet; empty when the file or its domain column is absent."""
    if not path.exists() or "domain" not in pq.read_schema(resolve_files(path, verify=False)[0]).names:
        return {}
    table = read_table(path, columns=["doc_id", "domain"])
    return {d: dom for d, dom in zip(table["doc_id"].to_pylist(), table["domain"].to_pylist()) if dom}


def flatten_scalars(obj: dict, prefix: str = "") -> dict:
    """Nested dicts become dotted keys; lists (e.g. loss curves) are left out."""
    out = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            out.update(flatten_scalars(value, f"{prefix}{key}."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[f"{prefix}{key}"] = num(value) if isinstance(value, float) else value
    return out


def load_sae_runs(paths: RunLayout) -> dict[str, dict]:
    """Every trained SAE's metrics, by run name (runs without metrics are left out)."""
    runs = {}
    names = sorted(p.name for p in paths.sae_root.iterdir() if p.is_dir()) if paths.sae_root.is_dir() else []
    for name in names:
        path = paths.sae_run(name).metrics
        if not path.exists():
            continue
        try:
            runs[name] = flatten_scalars(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as err:
            raise ArtifactError(f"{path}: cannot read SAE metrics: {err}") from None
    return runs


def load_stats(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: artifact not found (was the features stage run?)") from None
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{path}: invalid JSON: {err}") from None


def features_settings(path: Path, stats: dict) -> FeaturesConfig:
    try:
        return FeaturesConfig.model_validate(stats["features_settings"])
    except (KeyError, ValidationError):
        raise ArtifactError(f"{path}: no valid `features_settings` (written by an older features stage?); run `bbox features` again") from None


def load_inputs(cfg: Config) -> ReportInputs:
    paths = cfg.paths
    stats = load_stats(paths.corpus_stats)
    settings = features_settings(paths.corpus_stats, stats)
    features, score_columns = load_features(read_feature_table(paths))
    pair_models = sorted({f["model_a"] for f in features} | {f["model_b"] for f in features})
    findings = labeled_findings(paths) if paths.findings.exists() else []
    finding_q, family = finding_q_values(paths, findings)
    domains = load_domains(paths.documents)
    pairs = [tuple(p) for p in stats.get("pairs", [])]
    return ReportInputs(
        paths=paths,
        features=features,
        contexts=load_contexts(paths.contexts, pair_models),
        stats=stats,
        domains=domains,
        sae_runs=load_sae_runs(paths),
        settings=settings,
        findings=findings,
        score_columns=score_columns,
        finding_contexts=finding_contexts(paths, findings, settings.context_chars),
        finding_words=finding_contexts(paths, findings, settings.context_chars, FINDING_PANEL_WORDS),
        finding_q=finding_q,
        candidate_family=family,
        against_search=against_search(paths, findings),
        rule_search=read_table(paths.rule_search) if paths.rule_search.exists() else None,
        gap=gap_accounts(paths, pairs, findings, domains, min_words=cfg.report.domain_min_words),
    )
