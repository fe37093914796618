"""report.md: the gap account (and where the gap lives), the corpus-level numbers, the findings (with the forest plot and held-out contexts),
the per-domain chart and table, then each pair's kept features as Markdown tables."""

from __future__ import annotations

import html
import re
from pathlib import Path

from bbox_sae.config import Config
from bbox_sae.report.finding_views import finding_views, how_to_read, one_line
from bbox_sae.report.gap import GapAccount
from bbox_sae.report.gap_views import SHARE_NOTE, SLICE_NOTE, carried_lines, domain_note, headline, pct, slice_rows
from bbox_sae.report.inputs import ReportInputs
from bbox_sae.report.markup import fmt, num
from bbox_sae.report.plots import Charts
from bbox_sae.report.views import display_order

# Markdown's inline syntax: links and images (`[`, `]`), emphasis, code, strikethrough, table cells.
_MD_SYNTAX = re.compile(r"([\\`*_\[\]~|])")
# What GFM turns into a link with no brackets at all: `scheme://`, `www.`, `user@host`.
_AUTOLINK = re.compile(r"(?<=[A-Za-z]):(?=//)|(?<=www)\.|@", re.IGNORECASE)


def _escaped(text: str) -> str:
    """Escaped so that labels, statements, domains and corpus text (all untrusted: an LLM's label
    may be `[x](javascript:...)` or `![i](http://host/track.png)`) render as the text they are: no
    HTML, no link, image or autolink, no formatting, no broken table."""
    text = _MD_SYNTAX.sub(r"\\\1", html.escape(text, quote=False))
    return _AUTOLINK.sub(lambda m: "\\" + m.group(0), text)


def _md(text) -> str:
    """One table cell or heading: on one line, escaped."""
    return _escaped(" ".join(str(text or "").split()))


def _md_code(text) -> str:
    """A code span of `text` (which may hold backticks): nothing in it renders as Markdown or HTML."""
    text = " ".join(str(text).split())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_feature_row(f: dict) -> str:
    ci = f"[{fmt(f['ci_low'], '+.2f')}, {fmt(f['ci_high'], '+.2f')}]"
    return (
        f"| {f['latent']} | {_md(f['label'] or '')} | {fmt(f['median_dlogp'], '+.2f')} {ci} | {fmt(f['q_value'], '.1e')} "
        f"| {fmt(f['consistency'], '.2f')} | {fmt(f['holdout_median_dlogp'], '+.2f')} | {_md(f['top_words'])} |"
    )


def _md_pair(a: str, b: str, features: list[dict], limit: int) -> list[str]:
    rows = [f for f in features if (f["model_a"], f["model_b"]) == (a, b)]
    kept = [f for f in display_order(rows) if f["kept"]]
    lines = [f"## {_md(a)} vs {_md(b)}", "", f"{len(rows)} feature rows, {len(kept)} kept.", ""]
    for winner in (a, b):
        wins = [f for f in kept if f["better_model"] == winner]
        lines += [f"### {_md(winner)} better ({len(wins)} kept)", ""]
        if not wins:
            lines += ["_No kept features._", ""]
            continue
        lines += [
            "| latent | label | median Δlog p [95% CI] | q | consistency | holdout Δ | top words |",
            "|---:|---|---|---:|---:|---:|---|",
            *(_md_feature_row(f) for f in wins[:limit]),
            "",
        ]
    return lines


def _md_inline(text) -> str:
    """Context text inside a list item: one line (line breaks shown as ⏎), escaped."""
    return _escaped(one_line(text))


def _md_finding(f: dict, min_words: int) -> list[str]:
    delta = f"{fmt(f['holdout_median_dlogp'], '+.2f')} [{fmt(f['holdout_ci_low'], '+.2f')}, {fmt(f['holdout_ci_high'], '+.2f')}]"
    rule_fit = (
        f" · rule F1 {fmt(f['rule_f1'], '.2f')} (precision {fmt(f['rule_precision'], '.2f')}, recall {fmt(f['rule_recall'], '.2f')})"
        if f.get("rule_f1") is not None
        else ""
    )
    lines = [
        f"### Finding {f['finding']}: {_md(f.get('statement') or f.get('rule') or '-')}",
        "",
        f"**{_md(f['better_model'])} better** ({_md(f['model_a'])} vs {_md(f['model_b'])}) · {_md(f.get('kind') or 'rule')}, said by "
        f"{_md(f.get('statement_source') or '-')} · held-out Δlog p {delta} · n = {fmt(f['holdout_n'], ',')} · q = {fmt(f['q_value'], '.1e')} "
        f"· detection {fmt(f.get('detection'), '.2f')} (against its own forms elsewhere {fmt(f.get('detection_same_forms'), '.2f')}){rule_fit}",
        "",
        f"{_md(f['tested'])[:1].upper()}{_md(f['tested'])[1:]}.",
        "",
    ]
    if f["contexts"]:
        lines += [f"{len(f['contexts'])} of its {fmt(f['holdout_n'], ',')} held-out words (log p {_md(f['model_a'])} / {_md(f['model_b'])}):", ""]
        lines += [
            f"{i}. {_md_inline(c['left'])}<mark>{_md_inline(c['word'])}</mark>{_md_inline(c['right'])} ({fmt(c['logprob_a'], '.2f')} / {fmt(c['logprob_b'], '.2f')})"
            for i, c in enumerate(f["contexts"], 1)
        ]
        lines.append("")
    lines += _md_finding_domains(f, min_words)
    members = ", ".join(f"{m['latent']}{' (kept)' if m['kept'] else ''}" for m in f["members"])
    return lines + [f"Latents: {members}", ""]


def _md_finding_domains(f: dict, min_words: int) -> list[str]:
    d = f.get("by_domain")
    if d is None:
        return []
    lines = [_md(domain_note(d, min_words)), ""]
    if d.shown:
        lines += ["| domain | held-out words | median Δlog p | share of its summed Δ | holds |", "|---|---:|---:|---:|---|"]
        lines += [f"| {_md(r.domain)} | {r.words:,} | {r.median_dlogp:+.2f} | {pct(r.share)} | {'yes' if r.holds else 'no'} |" for r in d.shown]
        lines.append("")
    return lines


def _md_gap(accounts: list[GapAccount], findings: list[dict], chart: Path | None) -> list[str]:
    """The gap account first: how far apart the models are on held-out words, how much of it the
    findings carry, and where the rest lives."""
    statements = {f["finding"]: f.get("statement") or f.get("rule") or "" for f in findings}
    lines = []
    for acc in accounts:
        lines += [f"## The gap: {_md(acc.pair)}" if len(accounts) > 1 else "## The gap", ""]
        lines += [f"- {_md(line)}" for line in headline(acc)] + [""]
        if acc.findings:
            lines += ["| finding | better | statement | held-out words | share of its winner's advantage |", "|---:|---|---|---:|---:|"]
            lines += [f"| {s.finding} | {_md(s.better_model)} | {_md(statements.get(s.finding))} | {s.words:,} | {pct(s.share)} |" for s in acc.findings]
            lines += ["", _md(SHARE_NOTE), ""]
        if acc.slices:
            lines += ["### Where the gap lives", ""]
            if chart is not None:
                lines += [f"![mean Δlog p and 95% CI by word frequency, kind of word, place and domain]({chart.name})", ""]
            lines += [_md(SLICE_NOTE), "", "| by | slice | words | documents | mean Δlog p [95% CI] | share of the gap |", "|---|---|---:|---:|---|---:|"]
            lines += [
                f"| {_md(axis)} | {_md(s.name)} | {s.words:,} | {s.documents:,} | {s.mean_dlogp:+.3f} [{fmt(s.ci_low, '+.3f')}, {fmt(s.ci_high, '+.3f')}] | {pct(s.gap_share)} |"
                for axis, s in slice_rows(acc)
            ]
            lines.append("")
        carried = carried_lines(acc, statements)
        if acc.finding_domains:
            lines += [_md(f"Findings carried by one domain: {len(carried)} of {len(acc.finding_domains)}."), ""]
            lines += [f"- {_md(line)}" for line in carried]
            lines += [""] if carried else []
    return lines


def _md_findings(findings: list[dict], how: str, forest: Path | None, min_words: int) -> list[str]:
    """Findings first: one section per difference, however many latents express it."""
    lines = ["## Findings", "", f"{len(findings)} finding(s).", "", how, ""]
    if forest is not None:
        lines += [f"![forest plot: held-out median Δlog p and 95% CI per finding]({forest.name})", ""]
    if findings:
        lines += [
            "| finding | pair | better | statement | kind | held-out Δlog p [95% CI] | n | q | detection | rule F1 | latents |",
            "|---:|---|---|---|---|---|---:|---:|---:|---:|---|",
        ]
        for f in findings:
            delta = f"{fmt(f['holdout_median_dlogp'], '+.2f')} [{fmt(f['holdout_ci_low'], '+.2f')}, {fmt(f['holdout_ci_high'], '+.2f')}]"
            kind = f"{f.get('kind') or 'rule'} ({f.get('statement_source') or '-'})"
            lines.append(
                f"| {f['finding']} | {_md(f['model_a'])} vs {_md(f['model_b'])} | {_md(f['better_model'])} | {_md(f.get('statement') or f['rule'] or '-')} "
                f"| {kind} | {delta} | {fmt(f['holdout_n'], ',')} | {fmt(f['q_value'], '.1e')} | {fmt(f.get('detection'), '.2f')} | {fmt(f.get('rule_f1'), '.2f')} | {_md(f['latents'])} |"
            )
        lines.append("")
    for f in findings:
        lines += _md_finding(f, min_words)
    return lines


def _md_domains(stats: dict, chart: Path | None) -> list[str]:
    domains = stats.get("domains") or {}
    if not domains:
        return []
    models = list(stats.get("models", {}))
    pairs = [f"{a} vs {b}" for a, b in stats.get("pairs", [])]
    lines = [
        "## Per domain",
        "",
        *([f"![perplexity of each model and mean Δlog p per domain]({chart.name})", ""] if chart else []),
        "| domain | documents | words | " + " | ".join([*(f"perplexity {_md(m)}" for m in models), *(f"mean Δlog p {_md(p)}" for p in pairs)]) + " |",
        "|---|---:|---:|" + "---:|" * (len(models) + len(pairs)),
    ]
    for name, s in domains.items():
        ppl = [fmt(num((s.get("models", {}).get(m) or {}).get("perplexity")), ".2f") for m in models]
        delta = [fmt(num((s.get("pair_stats", {}).get(p) or {}).get("mean_dlogp")), "+.3f") for p in pairs]
        lines.append(f"| {_md(name)} | {fmt(s.get('documents'), ',')} | {fmt(s.get('words'), ',')} | " + " | ".join(ppl + delta) + " |")
    return lines + [""]


def build_markdown(cfg: Config, inputs: ReportInputs, charts: Charts) -> str:
    stats = inputs.stats
    findings = finding_views(inputs, inputs.settings)
    lines = [
        f"# BehaviorBox report: {_md(cfg.out.name)}",
        "",
        f"Models: {', '.join(_md(m) for m in inputs.models)} · {fmt(stats.get('documents'), ',')} documents · {fmt(stats.get('words'), ',')} words",
        "",
        *_md_gap(inputs.gap, findings, charts.gap),
        "## Corpus level",
        "",
        "| model | mean log p | perplexity | words |",
        "|---|---:|---:|---:|",
        *(
            f"| {_md(m)} | {fmt(num(s.get('mean_logprob')), '.4f')} | {fmt(num(s.get('perplexity')), '.3f')} | {fmt(s.get('words'), ',')} |"
            for m, s in stats.get("models", {}).items()
        ),
        "",
    ]
    lines += _md_findings(findings, how_to_read(inputs.settings, inputs.candidate_family, inputs.against_search), charts.forest, cfg.report.domain_min_words)
    lines += _md_domains(stats, charts.domains)
    pairs = stats.get("pairs") or sorted({(f["model_a"], f["model_b"]) for f in inputs.features})
    for a, b in pairs:
        lines += _md_pair(a, b, inputs.features, cfg.report.markdown_features)
    if inputs.sae_runs:
        lines += [
            "## SAE runs",
            "",
            *(f"- {_md_code(run)}: {_md_code(inputs.paths.sae_run(run).metrics.relative_to(inputs.paths.root))}" for run in inputs.sae_runs),
            "",
        ]
    return "\n".join(lines)
