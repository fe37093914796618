"""`bbox run`: every stage in order, skipping those that are current.

Whether a stage is current is the bookkeeping's call (`bbox_sae.bookkeeping`): its
content-addressed key is unchanged and its outputs are the ones it wrote. A stage re-runs
when its key changed, its outputs are gone or were changed, or it is forced (`--force STAGE`
also redoes everything after it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from bbox_sae.bookkeeping import execute, run_lock, staleness
from bbox_sae.config import Config, ensure_output_dir, save_resolved
from bbox_sae.errors import BBoxError, printable
from bbox_sae.layout import RunLayout
from bbox_sae.manifest import Manifest
from bbox_sae.schemas import latent_ids
from bbox_sae.stages import INGEST, STAGE_NAMES, STAGES

log = logging.getLogger(__name__)


def run_all(cfg: Config, force: list[str] | None = None, on_stage: Callable[[str, str], None] | None = None, until: str | None = None) -> dict:
    from rich.console import Console

    console = Console(stderr=True)
    stages = STAGES[: STAGE_NAMES.index(until) + 1] if until else STAGES
    forced_from = min((STAGE_NAMES.index(f) for f in force or []), default=len(STAGES))
    with run_lock(ensure_output_dir(cfg)):
        # Only now, holding the lock: a run refused by it must leave the directory as it was.
        save_resolved(cfg)
        manifest = Manifest.read(cfg.out)
        ran, timings = [], {}
        for i, stage in enumerate(stages):
            step = f"[{i + 1}/{len(stages)}] {stage.name}"
            # Decided in turn, after the stages before ran: their new digests are part of this key.
            if i < forced_from and staleness(stage, cfg, manifest) is None:
                console.print(f"{step}: up to date")
                if on_stage:
                    on_stage(stage.name, "skipped")
                continue
            console.print(f"{step} ...")
            start = time.perf_counter()
            execute(stage, cfg, manifest)
            seconds = time.perf_counter() - start
            ran.append(stage.name)
            timings[stage.name] = round(seconds, 2)
            if stage.writes_nothing(cfg):
                # The stages after it would read the outputs it did not write.
                console.print(f"{step}: dry run, nothing written; stopping here")
                return {"ran": ran, "seconds": timings}
            console.print(f"{step}: done in {seconds:.1f}s")
            if on_stage:
                on_stage(stage.name, "ran")
            if stage is INGEST:
                _warn_without_holdout(cfg, manifest)
        if stages[-1].name == STAGE_NAMES[-1]:
            _final_summary(cfg, console)
        return {"ran": ran, "seconds": timings}


def _warn_without_holdout(cfg: Config, manifest: Manifest) -> None:
    """Said as soon as the corpus is split, not after hours of scoring and training."""
    holdout = (manifest.get(INGEST.name).result or {}).get("holdout_documents")
    if holdout == 0 and cfg.features.require_generalize:
        log.warning(
            "no holdout documents (corpus.holdout_fraction %s): no feature can pass the holdout check, so none will be kept; "
            "raise corpus.holdout_fraction or set features.require_generalize=false",
            cfg.corpus.holdout_fraction,
        )


_SUMMARY_ROWS = 8  # findings printed per winning model; the report lists all


def shown(text: str) -> str:
    """Untrusted text (an LLM's label, corpus words, a model's name) as the console prints it: as
    it is, not as console markup ('[' in a corpus word), and without terminal escapes (an LLM's
    label may hold ANSI colours or an OSC-8 hyperlink to another host)."""
    from rich.markup import escape

    return escape(printable(text))


def _final_summary(cfg: Config, console) -> None:
    _print_findings(cfg.paths, console, _SUMMARY_ROWS)
    console.print(f"\nReport: {shown(str(cfg.paths.report_html.resolve()))}", soft_wrap=True)


def print_findings(run_dir: Path, as_json: bool = False) -> None:
    """`bbox findings RUN`: every finding of a finished run, as the run's summary says them."""
    from rich.console import Console

    from bbox_sae.labeling.finding_statements import labeled_findings

    paths = RunLayout(run_dir)
    if not paths.findings.is_file():
        raise BBoxError(f"{paths.findings}: no findings table here; run `bbox run` (or `bbox features`) for this run first")
    if as_json:
        for f in labeled_findings(paths):
            print(json.dumps({k: f.get(k) for k in FINDING_FIELDS}, default=str))
        return
    _print_findings(paths, Console(highlight=False), limit=None)


# What `bbox findings --json` says of each finding (the full rows are findings.parquet).
FINDING_FIELDS = (
    "finding", "statement", "better_model", "model_a", "model_b", "holdout_median_dlogp", "holdout_ci_low", "holdout_ci_high",
    "holdout_n", "q_value", "proposer", "kind", "single_rule", "top_words",
)  # fmt: skip


def _print_findings(paths: RunLayout, console, limit: int | None) -> None:
    """The gap account, then the findings per winning model, each statement on one line of its own
    (`soft_wrap`: a log read without a terminal gets no line broken mid-statement)."""
    from bbox_sae.labeling.finding_statements import labeled_findings
    from bbox_sae.report.finding_inputs import against_search

    def say(text: str = "") -> None:
        console.print(text, soft_wrap=True, highlight=False)

    findings = labeled_findings(paths)
    for line in _gap_lines(paths.root, findings):
        say(shown(line))
    carried = [f for f in findings if latent_ids(f["latents"])]
    n_latents = len({m for f in carried for m in latent_ids(f["latents"])})
    if len(carried) == len(findings):
        say(f"\n{len(findings)} finding(s), carried by {n_latents} latent(s).")
    else:
        say(
            f"\n{len(findings)} finding(s): {len(carried)} carried by {n_latents} latent(s), {len(findings) - len(carried)} found by the rule search alone (no latent carries them)."
        )
    against = against_search(paths, findings)
    if against:
        say(shown(against))
    by_model: dict[str, list[dict]] = {}
    for f in findings:
        by_model.setdefault(f["better_model"], []).append(f)
    for model, rows in sorted(by_model.items()):
        say(
            f"\nWhere [bold]{shown(model)}[/bold] is better ({len(rows)} finding(s); held-out median Δlog p [95% CI], n = held-out words; then its commonest train words):"
        )
        for f in rows[:limit]:
            label = f["statement"] or f["top_words"]
            if f.get("kind") == "latent":
                label = f"latent group: {label}"
            train = f" (train: {shown(f['top_words'])})" if f.get("top_words") else ""
            say(
                f"  finding {f['finding']:>3}  {f['holdout_median_dlogp']:+.2f} [{f['holdout_ci_low']:+.2f}, {f['holdout_ci_high']:+.2f}]  "
                f"n={f['holdout_n']:<5} {shown(label)}{train}"
            )
        if limit is not None and len(rows) > limit:
            say(
                f"  ... and {len(rows) - limit} more where {shown(model)} is better: every finding is in report.md and report.html, or run `bbox findings {shown(str(paths.root))}`"
            )


def _gap_lines(run_dir: Path, findings: list[dict]) -> list[str]:
    """The gap account's statements (`bbox_sae.report.gap_views.headline`), as the report says them; none for
    a run without corpus stats or a build index."""
    from bbox_sae.report.gap import gap_accounts
    from bbox_sae.report.gap_views import headline
    from bbox_sae.report.inputs import load_domains

    paths = RunLayout(run_dir)
    if not paths.corpus_stats.is_file():
        return []
    pairs = [tuple(p) for p in json.loads(paths.corpus_stats.read_text()).get("pairs", [])]
    accounts = gap_accounts(paths, pairs, findings, load_domains(paths.documents), breakdown=False)
    return ["", *(line for acc in accounts for line in headline(acc))] if accounts else []
