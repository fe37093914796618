"""The label stage: negatives for validation, labels by the configured labeler, `labels.parquet`."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa

from bbox_sae.artifacts import atomic_write_json, atomic_write_table, read_table, require_columns, sha256_file
from bbox_sae.config import Config
from bbox_sae.errors import ConfigError, EndpointError
from bbox_sae.features import feature_source
from bbox_sae.labeling.broader import broader_rules
from bbox_sae.labeling.client import Stats
from bbox_sae.labeling.finding_statements import label_findings
from bbox_sae.labeling.heuristic import heuristic_label
from bbox_sae.labeling.llm import label_with_llm, print_prompts
from bbox_sae.labeling.messages import PROMPT_VERSION
from bbox_sae.labeling.negatives import draw_negatives, finding_members, latent_forms
from bbox_sae.labeling.records import CONTEXT_COLUMNS, FEATURE_COLUMNS, feature_examples, latent_rules, latent_word_sets, select_latents
from bbox_sae.labeling.table import labels_table

log = logging.getLogger(__name__)


def run_label(cfg: Config) -> dict:
    """Label the features of the run (those of the SAE, or of `features.baseline`)."""
    paths = cfg.paths
    features = read_table(paths.features)
    require_columns(features, FEATURE_COLUMNS, str(paths.features))
    contexts = read_table(paths.contexts)
    require_columns(contexts, CONTEXT_COLUMNS + ["in_top"], str(paths.contexts))
    lc = cfg.label
    latents = select_latents(features, lc.only_kept)
    findings = read_table(paths.findings) if paths.findings.exists() else None
    labeler = lc.resolved_labeler()
    if labeler == "llm" and not (lc.base_url and lc.model):
        raise ConfigError("label.labeler is 'llm' but label.base_url and label.model are not both set")
    contrast = lc.contrast_examples if labeler == "llm" else 0
    src = feature_source(cfg, cfg.features.source)
    negatives = draw_negatives(src, latent_forms(contexts, latents), contrast, finding_members(findings, latents))
    columns = [c for c in contexts.column_names if c in negatives.column_names]
    shown = pa.concat_tables([contexts.select(columns), negatives.select(columns).cast(contexts.select(columns).schema)])
    wanted = set(latents)
    rules = {latent: r for latent, r in latent_rules(features, findings).items() if latent in wanted}
    broader = broader_rules(src, contexts, rules)
    word_sets = {latent: w for latent, w in latent_word_sets(findings).items() if latent in wanted}
    examples = feature_examples(features, shown, latents, lc.examples, lc.validation_examples, rules, contrast, broader, word_sets)
    if labeler == "llm" and lc.dry_run:
        print_prompts(examples, cfg.seed, lc.fuzz_examples)
        return {"dry_run": True, "labeler": "llm", "model": lc.model, "features": len(latents), "requests": 0}

    atomic_write_table(paths.label_negatives, negatives)
    if labeler == "llm":
        results, stats = asyncio.run(label_with_llm(examples, lc, paths.label_cache, cfg.seed))
    else:
        results, stats = {f.latent: heuristic_label(f, cfg.seed, lc.fuzz_examples) for f in examples}, Stats()

    atomic_write_table(paths.labels, labels_table(features, results))
    said, offered = label_findings(src, paths, stats if labeler == "llm" else None)
    atomic_write_table(paths.finding_labels, said)
    cost = stats.prompt_tokens / 1000 * lc.prompt_cost_per_1k + stats.completion_tokens / 1000 * lc.completion_cost_per_1k
    summary = {
        "labeler": labeler,
        "model": lc.model if labeler == "llm" else None,
        "prompt_version": PROMPT_VERSION,
        "features": len(examples),
        "findings_offered_to_llm": offered,
        "labeled": sum(r.source != "unlabeled" for r in results.values()),
        "unlabeled": sum(r.source == "unlabeled" for r in results.values()),
        "budget_exhausted": stats.budget_refused > 0,
        **asdict(stats),
        "cost": round(cost, 6),
        # finding_labels.parquet describes these findings only (finding_statements.labeled_findings).
        "findings_sha256": sha256_file(paths.findings) if paths.findings.exists() else None,
    }
    atomic_write_json(paths.label_stats, summary)
    if stats.labels_failed:
        _report_failed_labels(lc.base_url, stats, len(examples) + offered, paths.labels)
    return summary


def _report_failed_labels(base_url: str | None, stats: Stats, n_labels: int, labels_path: Path) -> None:
    """Some LLM labels failed: say so once; when none arrived at all, fail (one line), so the stage is
    not recorded as done and the next run asks again (answers that did arrive are cached)."""
    common = sorted(stats.label_errors.items(), key=lambda kv: -kv[1])
    why = common[0][0] + (f" (and {len(common) - 1} other reason(s), labels.json: label_errors)" if len(common) > 1 else "")
    if not stats.labels_answered:
        raise EndpointError(
            f"label.base_url {base_url}: every label request failed ({stats.labels_failed} of {n_labels}: latents and latent findings): {why}; "
            f"the offline labels are kept in {labels_path}; check label.base_url and label.model, then re-run to retry"
        )
    log.warning("label: %d of %d LLM label request(s) failed: %s; those keep their offline label; `bbox label` asks again", stats.labels_failed, n_labels, why)
