"""report.html: one self-contained page, the template and its CSS and JS read from package data
(`assets/`), the corpus-level header rendered here and the features embedded as JSON.

Corpus text and labels are untrusted: the page embeds them only as JSON with `<`, `>` and `&`
escaped (`markup.for_script`) and renders them with `textContent`, so a document containing
`</script>` shows as text; the header's HTML is built with `markup.el`, which escapes every text.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

from bbox_sae.config import Config
from bbox_sae.report.inputs import EXTRA_SCORE_COLUMNS, ReportInputs
from bbox_sae.report.markup import Markup, el, fmt, for_script, join, num, text
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
    ("consistency", "consistency", "fixed", None),
    ("holdout_median_dlogp", "holdout Δ", "signed", None),
    ("density", "density", "small", None),
    ("top_words", "top words", "text", None),
]  # fmt: skip
SCORE_TITLES = {key: title for key, title, _, _ in FEATURE_TABLE if key in ("label_score", *EXTRA_SCORE_COLUMNS)}
NUMERIC_FORMATS = {"int", "fixed", "signed", "small", "ci"}
# More domains than this and the per-domain table starts folded, so the findings stay in view.
DOMAINS_OPEN_MAX = 12
PLACEHOLDER = re.compile(r"__([A-Z_]+)__")


@cache
def asset(name: str) -> str:
    return files("bbox_sae.report").joinpath("assets", name).read_text(encoding="utf-8")


def table_columns(score_columns: list[str]) -> list[tuple[str, str, str, str | None]]:
    """FEATURE_TABLE without the optional scores the run does not have."""
    absent = set(EXTRA_SCORE_COLUMNS) - set(score_columns)
    return [c for c in FEATURE_TABLE if c[0] not in absent]


def feature_head(score_columns: list[str]) -> Markup:
    cells = [
        el("th", title, cls="num" if form in NUMERIC_FORMATS else None, data_sort=key, data_format=form, title=hover)
        for key, title, form, hover in table_columns(score_columns)
    ]
    return el("tr", join(cells))


def _corpus_rows(stats: dict) -> Markup:
    return join(
        el(
            "tr",
            el("td", m),
            el("td", fmt(num(s.get("mean_logprob")), ".4f"), cls="num mean-logprob"),
            el("td", fmt(num(s.get("perplexity")), ".3f"), cls="num perplexity"),
            el("td", fmt(s.get("words"), ","), cls="num"),
            data_model=m,
        )
        for m, s in stats.get("models", {}).items()
    )


def _head_row(*titles: str) -> Markup:
    return el("thead", el("tr", join(el("th", t) for t in titles)))


def header_html(cfg: Config, inputs: ReportInputs, shown: int) -> Markup:
    stats = inputs.stats
    pairs = ", ".join(f"{a} vs {b}" for a, b in stats.get("pairs", []))
    kept = sum(f["kept"] for f in inputs.features)
    summary = el(
        "p",
        "Models: ", el("b", ", ".join(inputs.models), id="models"), f" · pairs: {pairs} · ",
        el("span", fmt(stats.get("documents"), ","), id="n-documents"), " documents · ",
        el("span", fmt(stats.get("words"), ","), id="n-words"), " words · ",
        f"{len(inputs.features)} feature rows, {kept} kept, {shown} shown",
        id="corpus-summary",
    )  # fmt: skip
    corpus = el("table", _head_row("model", "mean log p", "perplexity", "words"), el("tbody", _corpus_rows(stats)), id="corpus-table")
    return join(
        [
            el("h1", "BehaviorBox report ", el("small", cfg.out.name)),
            summary,
            corpus,
            pair_stats_html(stats),
            domains_html(stats),
            findings_html(inputs.findings),
            sae_html(inputs),
        ]
    )


def findings_html(findings: list[dict]) -> Markup:
    """The findings, ranked by held-out |Δ|: what a reader should look at first. `kind` says how a
    finding's words were chosen (a context rule, or a latent's group of words) and its statement's
    held-out detection how well the statement predicts them."""
    rows = [
        el(
            "tr",
            el("td", f["finding"], cls="num"),
            el("td", str(f["better_model"])),
            el("td", f.get("statement") or f["rule"] or "–"),
            el("td", f"{f.get('kind') or 'rule'} ({f.get('statement_source') or '–'})"),
            el("td", fmt(f.get("detection"), ".2f"), cls="num"),
            el("td", f'{fmt(f["holdout_median_dlogp"], "+.2f")} [{fmt(f["holdout_ci_low"], "+.2f")}, {fmt(f["holdout_ci_high"], "+.2f")}]', cls="num"),
            el("td", fmt(f["holdout_n"], ","), cls="num"),
            el("td", f["latents"]),
            el("td", f["top_words"] or ""),
        )
        for f in findings
    ]
    head = _head_row("finding", "better", "statement", "kind (said by)", "detection", "held-out Δlog p [95% CI]", "held-out words", "latents", "top words")
    return join([el("h2", f"Findings ({len(findings)})"), el("table", head, el("tbody", join(rows)), id="findings-table")])


def domains_html(stats: dict) -> Markup:
    """Each model's perplexity per domain (corpus_stats.json `domains`), the lowest in bold."""
    domains = stats.get("domains") or {}
    if not domains:
        return Markup()
    models = list(stats.get("models", {}))
    pairs = [f"{a} vs {b}" for a, b in stats.get("pairs", [])]
    body = []
    for name, s in domains.items():
        ppl = {m: num((s.get("models", {}).get(m) or {}).get("perplexity")) for m in models}
        best = min((v for v in ppl.values() if v is not None), default=None)
        cells = [el("td", el("b", fmt(v, ".2f")) if v is not None and v == best else fmt(v, ".2f"), cls="num perplexity", data_model=m) for m, v in ppl.items()]
        cells += [el("td", fmt(num((s.get("pair_stats", {}).get(p) or {}).get("mean_dlogp")), "+.3f"), cls="num") for p in pairs]
        body.append(el("tr", el("td", name), el("td", fmt(s.get("documents"), ","), cls="num"), el("td", fmt(s.get("words"), ","), cls="num"), join(cells), data_domain=name))
    head = _head_row("domain", "documents", "words", *(f"perplexity {m}" for m in models), *(f"mean Δlog p {p}" for p in pairs))
    return el(
        "details",
        el("summary", f"Perplexity per domain ({len(domains)} domains, same words as above)"),
        el("table", head, el("tbody", join(body)), id="domain-table"),
        id="domain-stats",
        open=len(domains) <= DOMAINS_OPEN_MAX,
    )


def pair_stats_html(stats: dict) -> Markup:
    pair_stats = stats.get("pair_stats") or {}
    if not pair_stats:
        return Markup()
    items = [
        el(
            "li",
            f"{pair}: mean Δlog p {fmt(num(s.get('mean_dlogp')), '+.4f')}, median {fmt(num(s.get('median_dlogp')), '+.4f')}, "
            f"first model better on {fmt(num(s.get('share_a_better')), '.1%')} of words",
        )
        for pair, s in pair_stats.items()
    ]
    return el("ul", join(items), id="pair-stats")


def sae_html(inputs: ReportInputs) -> Markup:
    if not inputs.sae_runs:
        return Markup()
    parts = []
    for run, metrics in inputs.sae_runs.items():
        rows = join(el("tr", el("td", k), el("td", str(v))) for k, v in metrics.items())
        where = inputs.paths.sae_run(run).metrics.relative_to(inputs.paths.root)
        parts.append(el("details", el("summary", f"SAE {run} ({where})"), el("table", rows), cls="sae-run", data_run=run))
    return el("section", join(parts), id="sae-runs")


def build_html(cfg: Config, inputs: ReportInputs) -> tuple[str, int]:
    shown = display_order(inputs.features)[: cfg.report.max_features]
    views = [feature_view(f, inputs, cfg.report) for f in shown]
    domains = sorted(set(inputs.stats.get("domains") or {}) | {d["domain"] for v in views for d in v["domains"]})
    scores = [[c, SCORE_TITLES[c]] for c in ["label_score", *inputs.score_columns]]
    data = {"models": inputs.models, "domains": domains, "scores": scores, "features": views}
    parts = {
        "TITLE": text(f"BehaviorBox report: {cfg.out.name}"),
        "CSS": asset("report.css"),
        "HEADER": header_html(cfg, inputs, len(shown)),
        "FEATURE_HEAD": feature_head(inputs.score_columns),
        "JS": asset("report.js"),
        "DATA": for_script(data),
    }
    # One pass over the template: text put in is never searched for placeholders again.
    return PLACEHOLDER.sub(lambda m: parts[m.group(1)], asset("page.html")), len(shown)
