"""report.md: the findings, the corpus-level numbers and each pair's kept features as Markdown tables."""

from __future__ import annotations

import html

from bbox_sae.config import Config
from bbox_sae.report.inputs import ReportInputs
from bbox_sae.report.markup import fmt, num
from bbox_sae.report.views import display_order


def _md(text) -> str:
    """One table cell: escaped so corpus text cannot break the table or inject HTML."""
    return html.escape(" ".join(str(text or "").split()), quote=False).replace("|", "\\|")


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


def _md_findings(findings: list[dict]) -> list[str]:
    """Findings first: one row per difference, however many latents express it."""
    lines = [
        "## Findings",
        "",
        f"{len(findings)} finding(s). Δ is the median over every held-out word the finding covers (its rule's words, or its "
        "latent group's word forms), with a bootstrap 95% CI; detection is how well the statement alone tells those words "
        "from near misses, held out.",
        "",
    ]
    if findings:
        lines += [
            "| finding | pair | better | statement | kind | detection | held-out Δlog p [95% CI] | held-out words | latents | top words |",
            "|---:|---|---|---|---|---:|---|---:|---|---|",
        ]
        for f in findings:
            delta = f"{fmt(f['holdout_median_dlogp'], '+.2f')} [{fmt(f['holdout_ci_low'], '+.2f')}, {fmt(f['holdout_ci_high'], '+.2f')}]"
            kind = f"{f.get('kind') or 'rule'} ({f.get('statement_source') or '-'})"
            lines.append(
                f"| {f['finding']} | {_md(f['model_a'])} vs {_md(f['model_b'])} | {_md(f['better_model'])} | {_md(f.get('statement') or f['rule'] or '-')} "
                f"| {kind} | {fmt(f.get('detection'), '.2f')} | {delta} | {fmt(f['holdout_n'], ',')} | {_md(f['latents'])} | {_md(f['top_words'])} |"
            )
        lines.append("")
    return lines


def _md_domains(stats: dict) -> list[str]:
    domains = stats.get("domains") or {}
    if not domains:
        return []
    models = list(stats.get("models", {}))
    pairs = [f"{a} vs {b}" for a, b in stats.get("pairs", [])]
    lines = [
        "## Per domain",
        "",
        "| domain | documents | words | " + " | ".join([*(f"perplexity {_md(m)}" for m in models), *(f"mean Δlog p {_md(p)}" for p in pairs)]) + " |",
        "|---|---:|---:|" + "---:|" * (len(models) + len(pairs)),
    ]
    for name, s in domains.items():
        ppl = [fmt(num((s.get("models", {}).get(m) or {}).get("perplexity")), ".2f") for m in models]
        delta = [fmt(num((s.get("pair_stats", {}).get(p) or {}).get("mean_dlogp")), "+.3f") for p in pairs]
        lines.append(f"| {_md(name)} | {fmt(s.get('documents'), ',')} | {fmt(s.get('words'), ',')} | " + " | ".join(ppl + delta) + " |")
    return lines + [""]


def build_markdown(cfg: Config, inputs: ReportInputs) -> str:
    stats = inputs.stats
    lines = [
        f"# BehaviorBox report: {_md(cfg.out.name)}",
        "",
        f"Models: {', '.join(_md(m) for m in inputs.models)} · {fmt(stats.get('documents'), ',')} documents · {fmt(stats.get('words'), ',')} words",
        "",
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
    lines += _md_domains(stats)
    pairs = stats.get("pairs") or sorted({(f["model_a"], f["model_b"]) for f in inputs.features})
    lines += _md_findings(inputs.findings)
    for a, b in pairs:
        lines += _md_pair(a, b, inputs.features, cfg.report.markdown_features)
    if inputs.sae_runs:
        lines += [
            "## SAE runs",
            "",
            *(f"- `{_md(run)}`: `{_md(inputs.paths.sae_run(run).metrics.relative_to(inputs.paths.root))}`" for run in inputs.sae_runs),
            "",
        ]
    return "\n".join(lines)
