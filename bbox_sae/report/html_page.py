"""report.html: one self-contained page, rendered with Jinja from package data (`assets/`:
`page.html`, which includes the corpus-level `header.html`, inlines the CSS and JS and embeds the
features as JSON).

Corpus text and labels are untrusted: the page embeds them only as JSON with `<`, `>` and `&`
escaped (`markup.for_script`) and renders them with `textContent`, so a document containing
`</script>` shows as text; the templates are autoescaped, so every text the header shows is escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup as SafeMarkup

from bbox_sae.config import Config
from bbox_sae.report.finding_views import finding_refs, finding_views, finding_word_rows, how_to_read, kept_reason, one_line
from bbox_sae.report.gap import GapAccount
from bbox_sae.report.gap_views import SHARE_NOTE, SLICE_NOTE, carried_lines, domain_note, headline, pct, slice_rows
from bbox_sae.report.inputs import EXTRA_SCORE_COLUMNS, ReportInputs
from bbox_sae.report.markup import fmt, for_script, num
from bbox_sae.report.plots import Charts
from bbox_sae.report.views import display_order, feature_view

# The feature table: (field, title, format, hover text). The format names a formatter in
# report.js; the scores of inputs.EXTRA_SCORE_COLUMNS appear only when the feature table has them.
FEATURE_TABLE = [
    ("latent", "latent", "int", None),
    ("pair", "pair", "pair", None),
    ("better_model", "better", "name", None),
    ("kept", "kept", "check", None),
    ("label", "label", "text", None),
    ("label_score", "detection", "fixed", "label detection score: balanced accuracy on held-out examples"),
    ("fuzz_score", "fuzzing", "fixed", "label fuzzing score: balanced accuracy telling correctly from wrongly marked words"),
    ("rule", "rule", "text", "the context rule the latent's top words follow"),
    ("rule_precision", "rule prec.", "fixed", "held-out share of the words the rule matches on which the latent fires"),
    ("rule_recall", "rule rec.", "fixed", "held-out share of the latent's top words the rule matches"),
    ("median_dlogp", "median Δlog p", "signed", None),
    ("ci_low", "95% CI", "ci", None),
    ("q_value", "q", "small", None),
    ("holdout_median_dlogp", "holdout Δ", "signed", None),
    ("top_words", "top words", "text", None),
]  # fmt: skip
# Sign consistency and density are on the feature card, in W&B and in features.parquet: as table
# columns they made the demo's table 1,555 px wide in a 1,320 px box.
SCORE_TITLES = {key: title for key, title, _, _ in FEATURE_TABLE if key in ("label_score", *EXTRA_SCORE_COLUMNS)}
NUMERIC_FORMATS = {"int", "fixed", "signed", "small", "ci"}
# More domains than this and the per-domain table starts folded, so the findings stay in view.
DOMAINS_OPEN_MAX = 12


@cache
def asset(name: str) -> str:
    return files("bbox_sae.report").joinpath("assets", name).read_text(encoding="utf-8")


@cache
def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("bbox_sae.report", "assets"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(fmt=fmt, num=num, one_line=one_line, pct=pct, domain_note=domain_note)
    return env


def table_columns(score_columns: list[str], pairs: int = 1) -> list[tuple[str, str, str, str | None]]:
    """FEATURE_TABLE without the optional scores the run does not have, and without the pair
    column when there is one pair (it would repeat it on every row of a table already too wide)."""
    absent = set(EXTRA_SCORE_COLUMNS) - set(score_columns) | ({"pair"} if pairs <= 1 else set())
    return [c for c in FEATURE_TABLE if c[0] not in absent]


@dataclass(frozen=True)
class DomainRow:
    """One domain of corpus_stats.json: each model's perplexity there (the lowest is `best`)
    and each pair's mean Δlog p."""

    name: str
    documents: int | None
    words: int | None
    perplexity: dict[str, float | None]
    best: float | None
    mean_dlogp: list[float | None]


def domain_rows(stats: dict) -> list[DomainRow]:
    models = list(stats.get("models", {}))
    pairs = [f"{a} vs {b}" for a, b in stats.get("pairs", [])]
    rows = []
    for name, s in (stats.get("domains") or {}).items():
        ppl = {m: num((s.get("models", {}).get(m) or {}).get("perplexity")) for m in models}
        deltas = [num((s.get("pair_stats", {}).get(p) or {}).get("mean_dlogp")) for p in pairs]
        best = min((v for v in ppl.values() if v is not None), default=None)
        rows.append(DomainRow(name, s.get("documents"), s.get("words"), ppl, best, deltas))
    return rows


def gap_view(acc: GapAccount, findings: list[dict]) -> dict:
    """One pair's gap account as gap.html shows it."""
    statements = {f["finding"]: f.get("statement") or f.get("rule") or "–" for f in findings}
    return {
        "account": acc,
        "headline": headline(acc),
        "shares": [{**vars(s), "statement": statements.get(s.finding, "–"), "share": pct(s.share)} for s in acc.findings],
        "slices": slice_rows(acc),
        "carried": carried_lines(acc, statements),
    }


@dataclass(frozen=True)
class SaeRun:
    name: str
    where: str  # metrics.json, relative to the output dir
    metrics: dict


def build_html(cfg: Config, inputs: ReportInputs, charts: Charts) -> tuple[str, int]:
    shown = display_order(inputs.features)[: cfg.report.max_features]
    findings = {f["finding"]: f for f in inputs.findings}
    views = []
    for f in shown:
        view = feature_view(f, inputs, cfg.report)
        view["finding_refs"] = finding_refs(f, findings)
        view["kept_reason"] = kept_reason(f, view["finding_refs"], inputs.settings)
        views.append(view)
    domains = sorted(set(inputs.stats.get("domains") or {}) | {d["domain"] for v in views for d in v["domains"]})
    scores = [[c, SCORE_TITLES[c]] for c in ["label_score", *inputs.score_columns]]
    findings_shown = finding_views(inputs, inputs.settings)
    words = {f["finding"]: finding_word_rows(f, inputs.finding_words.get(f["finding"], []), inputs.domains) for f in findings_shown}
    data = {"models": inputs.models, "domains": domains, "scores": scores, "features": views, "finding_words": words}
    root = inputs.paths.root
    page = (
        _templates()
        .get_template("page.html")
        .render(
            run_name=cfg.out.name,
            # Trusted as they are: our own CSS and JS, and JSON that cannot end its <script> element.
            css=SafeMarkup(asset("report.css")),
            js=SafeMarkup(asset("report.js")),
            data=SafeMarkup(for_script(data)),
            columns=table_columns(inputs.score_columns, len({(f["model_a"], f["model_b"]) for f in inputs.features})),
            numeric_formats=NUMERIC_FORMATS,
            models=inputs.models,
            stats=inputs.stats,
            pairs=[f"{a} vs {b}" for a, b in inputs.stats.get("pairs", [])],
            domains=domain_rows(inputs.stats),
            domains_open_max=DOMAINS_OPEN_MAX,
            findings=findings_shown,
            gap=[gap_view(acc, inputs.findings) for acc in inputs.gap],
            gap_chart=charts.gap_base64,
            share_note=SHARE_NOTE,
            slice_note=SLICE_NOTE,
            domain_min_words=cfg.report.domain_min_words,
            how_to_read=how_to_read(inputs.settings, inputs.candidate_family, inputs.against_search),
            forest_plot=charts.forest_base64,
            domain_chart=charts.domains_base64,
            sae_runs=[SaeRun(run, str(inputs.paths.sae_run(run).metrics.relative_to(root)), m) for run, m in inputs.sae_runs.items()],
            n_features=len(inputs.features),
            n_kept=sum(f["kept"] for f in inputs.features),
            n_shown=len(shown),
        )
    )
    return page, len(shown)
