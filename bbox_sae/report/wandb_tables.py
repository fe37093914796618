"""The report's W&B run: feature, kept-feature, findings, corpus and SAE tables; the tables that
join a latent to its findings (`latent_findings`) and a finding to its contexts
(`finding_contexts`); the gap account's tables; and the charts as one image each (not a panel
per latent, which floods a workspace at thousands of latents). Every cell is plain text or a number, so each column sorts and filters.
The findings' Parquet tables and each trained SAE go up as artifacts."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from bbox_sae.config import Config
from bbox_sae.layout import logprob_column
from bbox_sae.report.finding_views import context_text, finding_views, one_line
from bbox_sae.report.gap import GapAccount
from bbox_sae.report.gap_views import headline
from bbox_sae.report.inputs import ReportInputs
from bbox_sae.report.markup import num
from bbox_sae.report.plots import Charts
from bbox_sae.report.views import examples_for
from bbox_sae.schemas import latent_ids
from bbox_sae.tracking import wandb_run

# Columns of the W&B `features` and `kept_features` tables; the labeler's extra scores
# (inputs.EXTRA_SCORE_COLUMNS) follow `label_score` when the feature table has them.
WANDB_COLUMNS = [
    "latent", "model_a", "model_b", "pair", "source", "kept", "better_model", "label", "label_source",
    "label_score", "median_dlogp", "mean_dlogp", "ci_low", "ci_high", "median_dp", "q_value", "consistency",
    "holdout_n", "holdout_median_dlogp", "density", "n_top", "top_words", "finding", "rule", "rule_precision",
    "rule_recall", "rule_f1", "top_contexts",
]  # fmt: skip
# Columns of the W&B `findings` table, and the finding view's field each is read from (a
# finding's `delta` is its held-out median Δlog p; `n` its held-out words; `contexts` its
# held-out contexts as `left [[word]] right (a: log p / b: log p)`, one a line).
FINDING_FIELDS = {
    "finding": "finding", "statement": "statement", "kind": "kind", "better_model": "better_model", "model_a": "model_a",
    "model_b": "model_b", "delta": "holdout_median_dlogp", "ci_low": "holdout_ci_low", "ci_high": "holdout_ci_high",
    "q": "q_value", "n": "holdout_n", "detection": "detection", "statement_source": "statement_source", "rule_f1": "rule_f1",
    "latents": "latents", "proposer": "proposer", "single_rule": "single_rule", "top_words": "top_words", "contexts": "contexts",
}  # fmt: skip
FINDING_COLUMNS = list(FINDING_FIELDS)


# The W&B `latent_findings` table: one row per (latent, finding it proposed or carries), so a
# latent of several findings has a row for each; the finding's statement, Δ (held-out median), CI
# and n beside the latent's own label. Joined to `finding_contexts` on `finding`.
LATENT_FINDING_COLUMNS = [
    "latent", "finding", "statement", "better_model", "model_a", "model_b", "delta", "ci_low", "ci_high", "n", "share",
    "label", "label_source", "kept",
]  # fmt: skip
# The W&B `finding_contexts` table: one row per held-out context the report shows of a finding.
FINDING_CONTEXT_COLUMNS = ["finding", "rank", "doc_id", "word_idx", "left", "word", "right", "logprob_a", "logprob_b", "delta"]


def latent_finding_rows(findings: list[dict], features: list[dict]) -> list[list]:
    """Every (latent, finding) pair of the findings' `latents`, with the latent's label where it has one."""
    by_key = {(f["latent"], f["model_a"], f["model_b"]): f for f in features if f["source"] == "sae"}
    rows = []
    for f in findings:
        for latent in latent_ids(f["latents"]):
            feature = by_key.get((latent, f["model_a"], f["model_b"]), {})
            values = {
                "latent": latent, "finding": f["finding"], "statement": f.get("statement") or f.get("rule"), "better_model": f["better_model"],
                "model_a": f["model_a"], "model_b": f["model_b"], "delta": f.get("holdout_median_dlogp"), "ci_low": f.get("holdout_ci_low"),
                "ci_high": f.get("holdout_ci_high"), "n": f.get("holdout_n"), "share": f.get("gap_share"), "label": feature.get("label"),
                "label_source": feature.get("label_source"), "kept": bool(feature.get("kept")),
            }  # fmt: skip
            rows.append([values[c] for c in LATENT_FINDING_COLUMNS])
    return rows


def finding_context_rows(findings: list[dict]) -> list[list]:
    rows = []
    for f in findings:
        for rank, c in enumerate(f["contexts"]):
            a, b = c.get("logprob_a"), c.get("logprob_b")
            delta = None if a is None or b is None else num(a - b)
            rows.append([f["finding"], rank, c["doc_id"], c["word_idx"], one_line(c["left"]), one_line(c["word"]), one_line(c["right"]), a, b, delta])
    return rows


def wandb_columns(score_columns: list[str]) -> list[str]:
    at = WANDB_COLUMNS.index("label_score") + 1
    return WANDB_COLUMNS[:at] + score_columns + WANDB_COLUMNS[at:]


def contexts_text(feature: dict, contexts: dict, examples: int) -> str:
    """Top train contexts as plain text, one a line, the word in [[ ]], both log-probs after it."""
    a, b = feature["model_a"], feature["model_b"]
    rows = contexts.get(feature["latent"], {}).get("train", [])[:examples]
    return "\n".join(context_text({**c, "logprob_a": c.get(logprob_column(a)), "logprob_b": c.get(logprob_column(b))}, a, b) for c in rows)


def finding_rows(findings: list[dict]) -> list[list]:
    rows = []
    for f in findings:
        values = {col: f.get(key) for col, key in FINDING_FIELDS.items()}
        values["contexts"] = "\n".join(context_text(c, f["model_a"], f["model_b"]) for c in f["contexts"])
        rows.append([values[c] for c in FINDING_COLUMNS])
    return rows


def _wandb_row(feature: dict, cell, columns: list[str]) -> list:
    values = dict(feature, pair=f"{feature['model_a']} vs {feature['model_b']}", top_contexts=cell)
    return [values[c] for c in columns]


def _sae_table_rows(sae_runs: dict[str, dict]) -> list[list]:
    """One row per (run, metric); a number stays a number (it sorts and plots in W&B), anything else is JSON in `text`."""

    def is_number(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    return [
        [run, key, float(value) if is_number(value) else None, None if is_number(value) else json.dumps(value)]
        for run, metrics in sae_runs.items()
        for key, value in metrics.items()
    ]


GAP_FINDING_COLUMNS = ["pair", "finding", "better_model", "statement", "words", "dlogp_sum", "share"]
GAP_SLICE_COLUMNS = ["pair", "axis", "slice", "words", "documents", "mean_dlogp", "ci_low", "ci_high", "gap_share"]
FINDING_DOMAIN_COLUMNS = ["pair", "finding", "domain", "words", "median_dlogp", "share", "holds", "carried_by"]


def gap_summary(accounts: list[GapAccount]) -> dict:
    """The gap account under `gap/<pair>/`: what the report's first section says, as numbers and as its statements."""
    summary = {}
    for acc in accounts:
        key = f"gap/{acc.pair}"
        summary[f"{key}/statement"] = " ".join(headline(acc))
        summary[f"{key}/words"] = acc.words
        summary[f"{key}/documents"] = acc.documents
        for model, ppl in acc.perplexity.items():
            summary[f"{key}/perplexity/{model}"] = ppl
        summary.update({f"{key}/mean_dlogp": acc.mean_dlogp, f"{key}/ci_low": acc.ci_low, f"{key}/ci_high": acc.ci_high})
        summary[f"{key}/findings_net_share"] = acc.findings_net_share
        for w in acc.winners:
            summary.update({f"{key}/{w.model}/advantage": w.advantage, f"{key}/{w.model}/findings_share": w.union_share, f"{key}/{w.model}/left": w.left})
    return {k: num(v) if isinstance(v, float) else v for k, v in summary.items()}


def gap_rows(accounts: list[GapAccount], findings: list[dict]) -> dict[str, list[list]]:
    statements = {f["finding"]: f.get("statement") or f.get("rule") for f in findings}
    return {
        "gap_findings": [
            [a.pair, s.finding, s.better_model, statements.get(s.finding), s.words, num(s.dlogp_sum), num(s.share)] for a in accounts for s in a.findings
        ],
        "gap_slices": [
            [a.pair, s.axis, s.name, s.words, s.documents, num(s.mean_dlogp), num(s.ci_low), num(s.ci_high), num(s.gap_share)]
            for a in accounts
            for s in a.slices
        ],
        "finding_domains": [
            [a.pair, f, r.domain, r.words, num(r.median_dlogp), num(r.share), r.holds, d.carried_by]
            for a in accounts
            for f, d in sorted(a.finding_domains.items())
            for r in d.shown
        ],
    }


def _summary(inputs: ReportInputs) -> dict:
    stats = inputs.stats
    summary = {**gap_summary(inputs.gap), "corpus/documents": stats.get("documents"), "corpus/words": stats.get("words")}
    for model, s in stats.get("models", {}).items():
        for key in ("mean_logprob", "perplexity", "words"):
            summary[f"corpus/{model}/{key}"] = s.get(key)
    for run, metrics in inputs.sae_runs.items():
        for key, value in metrics.items():
            summary[f"sae/{run}/{key}"] = value
    # Not "findings": that key is the findings table's, and a number under it would replace the table in the summary.
    summary["findings/count"] = len(inputs.findings)
    summary["findings/beyond_single_rules"] = sum(1 for f in inputs.findings if f.get("single_rule") is False)
    if inputs.rule_search is not None:
        summary["rule_search/differences"] = inputs.rule_search.num_rows
        summary["rule_search/covered"] = inputs.rule_search.num_rows - inputs.rule_search["covered_by"].null_count
    summary["features/rows"] = len(inputs.features)
    summary["features/kept"] = sum(f["kept"] for f in inputs.features)
    return summary


def log_wandb(cfg: Config, inputs: ReportInputs, charts: Charts) -> dict:
    """Log the report to the `report` run; returns its id and directory (None when W&B is disabled)."""
    with wandb_run(cfg, "report") as run:
        if run is None:
            return {"wandb_run": None, "wandb_dir": None}
        import wandb

        columns = wandb_columns(inputs.score_columns)
        cells = [contexts_text(f, inputs.contexts, examples_for(f, cfg.report)) for f in inputs.features]
        rows = [_wandb_row(f, cell, columns) for f, cell in zip(inputs.features, cells)]
        payload = {
            "features": wandb.Table(columns=columns, data=rows, allow_mixed_types=True),
            "kept_features": wandb.Table(columns=columns, data=[r for r, f in zip(rows, inputs.features) if f["kept"]], allow_mixed_types=True),
            "corpus": wandb.Table(
                columns=["model", "mean_logprob", "perplexity", "words"],
                data=[[m, s.get("mean_logprob"), s.get("perplexity"), s.get("words")] for m, s in inputs.stats.get("models", {}).items()],
            ),
        }
        findings = finding_views(inputs, inputs.settings)
        payload["findings"] = wandb.Table(columns=FINDING_COLUMNS, data=finding_rows(findings), allow_mixed_types=True)
        payload["latent_findings"] = wandb.Table(columns=LATENT_FINDING_COLUMNS, data=latent_finding_rows(findings, inputs.features), allow_mixed_types=True)
        payload["finding_contexts"] = wandb.Table(columns=FINDING_CONTEXT_COLUMNS, data=finding_context_rows(findings), allow_mixed_types=True)
        if inputs.gap:
            columns_of = {"gap_findings": GAP_FINDING_COLUMNS, "gap_slices": GAP_SLICE_COLUMNS, "finding_domains": FINDING_DOMAIN_COLUMNS}
            for key, data in gap_rows(inputs.gap, inputs.findings).items():
                payload[key] = wandb.Table(columns=columns_of[key], data=data, allow_mixed_types=True)
        if inputs.rule_search is not None:
            payload["rule_search"] = wandb.Table(dataframe=inputs.rule_search.to_pandas())
        if inputs.sae_runs:
            payload["sae_runs"] = wandb.Table(columns=["run", "metric", "value", "text"], data=_sae_table_rows(inputs.sae_runs), allow_mixed_types=True)
        for key, path in (("findings_forest", charts.forest), ("domains_chart", charts.domains), ("gap_chart", charts.gap)):
            if path is not None:
                payload[key] = wandb.Image(str(path))
        run.log(payload)
        run.summary.update(_summary(inputs))
        _log_artifacts(run, cfg, inputs)
        run_id, sync_dir = run.id, Path(run.settings.sync_dir)
    drop_superseded_run_dirs(sync_dir, run_id)
    return {"wandb_run": run_id, "wandb_dir": str(sync_dir)}


def artifact_name(text: str) -> str:
    """A W&B artifact name (letters, digits, '-', '_', '.') for a run or SAE name."""
    return re.sub(r"[^\w.-]", "_", text)


def _log_artifacts(run, cfg: Config, inputs: ReportInputs) -> None:
    """The findings' tables as one `findings` artifact, and each trained SAE as a `model` artifact
    with its metrics: what a user on a GPU box browses and pulls from W&B (`run.use_artifact`)."""
    import wandb

    paths = cfg.paths
    tables = wandb.Artifact(
        artifact_name(f"{paths.root.resolve().name}-findings"),
        type="findings",
        description="findings.parquet, finding_words.parquet, rule_search.parquet and features.parquet (docs/artifacts.md)",
        metadata={"findings": len(inputs.findings), "features": len(inputs.features)},
    )
    for path in (paths.findings, paths.finding_words, paths.rule_search, paths.features):
        if path.is_file():
            tables.add_file(str(path))
    run.log_artifact(tables)
    for name, metrics in inputs.sae_runs.items():
        sae = paths.sae_run(name)
        if not sae.weights.is_file():
            continue
        model = wandb.Artifact(artifact_name(f"sae-{name}"), type="model", description="sae-lens SAE (load with SAE.load_from_disk)", metadata=metrics)
        for path in (sae.weights, sae.sae_config, sae.metrics):
            if path.is_file():
                model.add_file(str(path))
        run.log_artifact(model)


def drop_superseded_run_dirs(current: Path, run_id: str) -> None:
    """Remove earlier local dirs of the same run id.

    wandb names each local run dir by its start time (plus `-N` when that second is taken), so
    every re-run of the report adds one; the report re-logs everything, so older dirs would only
    make `wandb sync` upload it twice.
    """
    pattern = re.compile(rf"^(offline-)?run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?$")
    stale = [p for p in current.parent.iterdir() if p.is_dir() and p != current and pattern.match(p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
