"""Report stage: W&B tables, a self-contained HTML feature browser and a Markdown summary.

Inputs (`cfg.paths`): `features.parquet`, `contexts.parquet` and `corpus_stats.json` are
required; `documents.parquet` (document domains), `corpus_stats.json`'s `domains` (perplexity
per domain), `labels.parquet` (joined on latent and pair) and each SAE run's `metrics.json` are
used when present. With domains, each feature's card tells in which domains its top
words occur and whether its difference holds there, and the feature list can be filtered by
domain.

Modules: `inputs` reads the artifacts (`finding_inputs`: each finding's held-out contexts and q;
`gap`: the gap account of the held-out words, how much of it the findings carry and where the rest
lives, said in words by `gap_views`), `views` shapes one feature for the browser, `finding_views`
one finding (and a latent's findings), `plots` draws the gap chart, the forest plot and the
per-domain chart, `html_page` fills the page template
(`assets/`), `markdown` writes report.md, `wandb_tables` logs the W&B run, `markup` builds
escaped HTML.
"""

from __future__ import annotations

from bbox_sae.artifacts import atomic_write_text
from bbox_sae.config import Config
from bbox_sae.report.html_page import build_html
from bbox_sae.report.inputs import load_inputs
from bbox_sae.report.markdown import build_markdown
from bbox_sae.report.plots import draw_charts
from bbox_sae.report.wandb_tables import FINDING_COLUMNS, WANDB_COLUMNS, log_wandb

__all__ = ["FINDING_COLUMNS", "WANDB_COLUMNS", "run_report"]


def run_report(cfg: Config) -> dict:
    inputs = load_inputs(cfg)
    html_path, md_path = cfg.paths.report_html, cfg.paths.report_md
    charts = draw_charts(inputs.findings, inputs.models, inputs.stats, md_path.parent, inputs.gap)
    page, shown = build_html(cfg, inputs, charts)
    atomic_write_text(html_path, page)
    atomic_write_text(md_path, build_markdown(cfg, inputs, charts))
    result = {
        "report_html": str(html_path),
        "report_md": str(md_path),
        "features": len(inputs.features),
        "kept": sum(f["kept"] for f in inputs.features),
        "shown": shown,
        "sae_runs": list(inputs.sae_runs),
        "charts": [str(p) for p in (charts.forest, charts.domains, charts.gap) if p is not None],
    }
    result.update(log_wandb(cfg, inputs, charts))
    return result
