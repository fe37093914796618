"""Report stage: W&B tables, a self-contained HTML feature browser and a Markdown summary.

Inputs (under the output dir): `features.parquet`, `contexts.parquet` and `corpus_stats.json`
are required; `documents.parquet` (document domains), `corpus_stats.json`'s `domains`
(perplexity per domain) and `sae/*/metrics.json` (SAE training metrics) are used when present;
label columns of `features.parquet` are optional. With domains, each feature's card tells in
which domains its top words occur and whether its difference holds there, and the feature
list can be filtered by domain.

Corpus text and labels are untrusted: the HTML embeds them only as JSON with `<`, `>` and `&`
escaped and renders them with `textContent`, so a document containing `</script>` shows as text.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bbox_sae.artifacts import atomic_write_text, read_table, require_columns, resolve_files
from bbox_sae.config import Config
from bbox_sae.domains import NO_DOMAIN
from bbox_sae.errors import ArtifactError
from bbox_sae.labeling.table import labeled_features
from bbox_sae.layout import RunLayout
from bbox_sae.tracking import wandb_run

FEATURE_REQUIRED = ["latent", "model_a", "model_b", "kept", "better_model", "median_dlogp", "top_words"]
FEATURE_OPTIONAL = [
    "n_top", "density", "max_activation", "mean_dlogp", "median_dp", "ci_low", "ci_high", "consistency",
    "p_value", "q_value", "coherence", "holdout_n", "holdout_median_dlogp", "holdout_mean_dlogp",
    "holdout_median_dp", "generalizes", "paper_rule", "source", "label", "label_source", "label_reason",
    "label_coherent", "label_score", "label_precision", "label_recall", "finding", "rule", "rule_f1",
    "holdout_ci_low", "holdout_ci_high",
]  # fmt: skip
CONTEXT_REQUIRED = ["latent", "split", "rank", "doc_id", "word_idx", "in_top", "left", "word", "right"]

# Columns of the W&B `features` and `kept_features` tables.
WANDB_COLUMNS = [
    "latent", "model_a", "model_b", "pair", "source", "kept", "better_model", "label", "label_source",
    "label_score", "median_dlogp", "mean_dlogp", "ci_low", "ci_high", "median_dp", "q_value", "consistency",
    "holdout_n", "holdout_median_dlogp", "density", "n_top", "top_words", "finding", "rule", "rule_f1", "top_contexts",
]  # fmt: skip
# Columns of the W&B `findings` table (findings.parquet).
FINDING_COLUMNS = [
    "finding", "model_a", "model_b", "better_model", "rule", "rule_f1", "holdout_median_dlogp", "holdout_ci_low",
    "holdout_ci_high", "median_dlogp", "n_latents", "latents", "top_words",
]  # fmt: skip
HIST_BINS = 20


@dataclass
class ReportInputs:
    features: list[dict]
    contexts: dict[int, dict[str, list[dict]]]  # latent -> split -> rows in rank order
    stats: dict
    domains: dict[str, str]
    sae_runs: dict[str, dict]
    findings: list[dict] = field(default_factory=list)

    @property
    def models(self) -> list[str]:
        return list(self.stats.get("models", {}))


# ---------------------------------------------------------------- inputs


def _num(x) -> float | None:
    """JSON-safe float: NaN and ±inf become None (JSON has no NaN, and W&B tables choke on it)."""
    if x is None or isinstance(x, bool):
        return x
    x = float(x)
    return x if math.isfinite(x) else None


def _feature_record(row: dict) -> dict:
    rec = {k: row.get(k) for k in FEATURE_REQUIRED + FEATURE_OPTIONAL}
    for k, v in rec.items():
        if isinstance(v, float):
            rec[k] = _num(v)
    rec["kept"] = bool(rec["kept"])
    rec["source"] = rec["source"] or "sae"
    rec["key"] = f"{rec['source']}:{rec['latent']}:{rec['model_a']}:{rec['model_b']}"
    return rec


def load_features(paths: RunLayout) -> list[dict]:
    table = labeled_features(paths)
    require_columns(table, FEATURE_REQUIRED, str(paths.features))
    return [_feature_record(r) for r in table.to_pylist()]


def load_contexts(path: Path, models: list[str]) -> dict[int, dict[str, list[dict]]]:
    table = read_table(path)
    require_columns(table, CONTEXT_REQUIRED + [f"logprob__{m}" for m in models], str(path))
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
            out[f"{prefix}{key}"] = _num(value) if isinstance(value, float) else value
    return out


def load_sae_runs(sae_dir: Path) -> dict[str, dict]:
    runs = {}
    for path in sorted(sae_dir.glob("*/metrics.json")):
        try:
            runs[path.parent.name] = flatten_scalars(json.loads(path.read_text()))
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


def load_inputs(cfg: Config) -> ReportInputs:
    out = cfg.out
    stats = load_stats(out / "corpus_stats.json")
    features = load_features(cfg.paths)
    pair_models = sorted({f["model_a"] for f in features} | {f["model_b"] for f in features})
    return ReportInputs(
        features=features,
        contexts=load_contexts(out / "contexts.parquet", pair_models),
        stats=stats,
        domains=load_domains(out / "documents.parquet"),
        sae_runs=load_sae_runs(out / "sae"),
        findings=read_table(out / "findings.parquet").to_pylist() if (out / "findings.parquet").exists() else [],
    )


# ---------------------------------------------------------------- per-feature views


def display_order(features: list[dict]) -> list[dict]:
    """Kept features first, then the largest |median Δlog p|."""
    return sorted(features, key=lambda f: (not f["kept"], -abs(f["median_dlogp"] or 0.0), f["latent"]))


def _delta(ctx: dict, a: str, b: str) -> float | None:
    la, lb = ctx.get(f"logprob__{a}"), ctx.get(f"logprob__{b}")
    return None if la is None or lb is None else _num(la - lb)


def top_deltas(feature: dict, contexts: dict) -> list[float]:
    """Δlog p over the feature's top words: train contexts that survived the percentile rule."""
    train = contexts.get(feature["latent"], {}).get("train", [])
    deltas = (_delta(c, feature["model_a"], feature["model_b"]) for c in train if c["in_top"])
    return [d for d in deltas if d is not None]


def delta_histogram(deltas: list[float]) -> dict | None:
    if not deltas:
        return None
    counts, edges = np.histogram(np.asarray(deltas, dtype=np.float64), bins=HIST_BINS)
    return {"counts": counts.tolist(), "edges": [round(float(e), 4) for e in edges]}


def _prob_text(logprob: float | None) -> str:
    return "n/a" if logprob is None else f"{math.exp(logprob):.3g}"


def context_view(ctx: dict, a: str, b: str, domains: dict[str, str]) -> dict:
    return {
        "left": ctx["left"],
        "word": ctx["word"],
        "right": ctx["right"],
        "doc_id": ctx["doc_id"],
        "word_idx": ctx["word_idx"],
        "rank": ctx["rank"],
        "activation": _num(ctx.get("activation")),
        "in_top": bool(ctx["in_top"]),
        "domain": domains.get(ctx["doc_id"]),
        "logprob": [_num(ctx.get(f"logprob__{a}")), _num(ctx.get(f"logprob__{b}"))],
    }


def feature_view(feature: dict, inputs: ReportInputs, examples: int) -> dict:
    a, b = feature["model_a"], feature["model_b"]
    splits = inputs.contexts.get(feature["latent"], {})
    view = dict(feature)
    view["hist"] = delta_histogram(top_deltas(feature, inputs.contexts))
    view["contexts"] = {s: [context_view(c, a, b, inputs.domains) for c in splits.get(s, [])[:examples]] for s in ("train", "holdout")}
    return view


def domain_rows(feature: dict, contexts: dict, domains: dict[str, str], min_words: int) -> list[dict]:
    """In which domains a feature's top words occur, and whether its difference holds in each.

    Over the top words of both splits (contexts that survived the percentile rule), grouped by
    their document's domain: the count, the median Δlog p, the share of words on which the
    feature's better model wins, and `holds`: the domain's median has the feature's sign (None
    when the domain has fewer than `min_words` of them: too few to say). Most words first.
    """
    if not domains:
        return []
    a, b = feature["model_a"], feature["model_b"]
    sign = np.sign(feature["median_dlogp"] or 0.0)
    groups: dict[str, list[float]] = {}
    for split in ("train", "holdout"):
        for ctx in contexts.get(feature["latent"], {}).get(split, []):
            delta = _delta(ctx, a, b) if ctx["in_top"] else None
            if delta is not None:
                groups.setdefault(domains.get(ctx["doc_id"], NO_DOMAIN), []).append(delta)
    rows = []
    for name, deltas in groups.items():
        d = np.asarray(deltas, dtype=np.float64)
        median = float(np.median(d))
        rows.append(
            {
                "domain": name,
                "n": len(d),
                "median_dlogp": _num(median),
                "wins": _num(float((np.sign(d) == sign).mean())) if sign else None,
                "holds": bool(sign and np.sign(median) == sign) if len(d) >= min_words else None,
            }
        )
    return sorted(rows, key=lambda r: (-r["n"], r["domain"]))


# ---------------------------------------------------------------- Weights & Biases


def contexts_html(feature: dict, contexts: dict, examples: int) -> str:
    """Top train contexts as a small HTML list for a W&B table cell (all text escaped)."""
    a, b = feature["model_a"], feature["model_b"]
    items = []
    for ctx in contexts.get(feature["latent"], {}).get("train", [])[:examples]:
        probs = f"p({a})={_prob_text(ctx.get(f'logprob__{a}'))} · p({b})={_prob_text(ctx.get(f'logprob__{b}'))}"
        items.append(
            f"<li>{html.escape(ctx['left'])}<mark>{html.escape(ctx['word'])}</mark>{html.escape(ctx['right'])}"
            f' <small style="color:#555">{html.escape(probs)}</small></li>'
        )
    return '<ol style="font:13px sans-serif;white-space:pre-wrap">' + "".join(items) + "</ol>"


def _wandb_row(feature: dict, cell) -> list:
    values = dict(feature, pair=f"{feature['model_a']} vs {feature['model_b']}", top_contexts=cell)
    return [values[c] for c in WANDB_COLUMNS]


def _sae_table_rows(sae_runs: dict[str, dict]) -> list[list]:
    return [[run, key, json.dumps(value)] for run, metrics in sae_runs.items() for key, value in metrics.items()]


def _summary(inputs: ReportInputs) -> dict:
    stats = inputs.stats
    summary = {"corpus/documents": stats.get("documents"), "corpus/words": stats.get("words")}
    for model, s in stats.get("models", {}).items():
        for key in ("mean_logprob", "perplexity", "words"):
            summary[f"corpus/{model}/{key}"] = s.get(key)
    for run, metrics in inputs.sae_runs.items():
        for key, value in metrics.items():
            summary[f"sae/{run}/{key}"] = value
    summary["findings"] = len(inputs.findings)
    summary["features/rows"] = len(inputs.features)
    summary["features/kept"] = sum(f["kept"] for f in inputs.features)
    return summary


def log_wandb(cfg: Config, inputs: ReportInputs) -> dict:
    """Log the report to the `report` run; returns its id and directory (None when W&B is disabled)."""
    with wandb_run(cfg, "report") as run:
        if run is None:
            return {"wandb_run": None, "wandb_dir": None}
        import wandb

        examples = cfg.report.examples_per_feature
        rows = [_wandb_row(f, wandb.Html(contexts_html(f, inputs.contexts, examples), inject=False, data_is_not_path=True)) for f in inputs.features]
        payload = {
            "features": wandb.Table(columns=WANDB_COLUMNS, data=rows, allow_mixed_types=True),
            "kept_features": wandb.Table(columns=WANDB_COLUMNS, data=[r for r, f in zip(rows, inputs.features) if f["kept"]], allow_mixed_types=True),
            "corpus": wandb.Table(
                columns=["model", "mean_logprob", "perplexity", "words"],
                data=[[m, s.get("mean_logprob"), s.get("perplexity"), s.get("words")] for m, s in inputs.stats.get("models", {}).items()],
            ),
        }
        payload["findings"] = wandb.Table(columns=FINDING_COLUMNS, data=[[f.get(c) for c in FINDING_COLUMNS] for f in inputs.findings], allow_mixed_types=True)
        if inputs.sae_runs:
            payload["sae_runs"] = wandb.Table(columns=["run", "metric", "value"], data=_sae_table_rows(inputs.sae_runs))
        for f in inputs.features:
            hist = delta_histogram(top_deltas(f, inputs.contexts)) if f["kept"] else None
            if hist is not None:
                key = f"dlogp_hist/{f['source']}_latent_{f['latent']}_{f['model_a']}_vs_{f['model_b']}"
                payload[key] = wandb.Histogram(np_histogram=(hist["counts"], hist["edges"]))
        run.log(payload)
        run.summary.update(_summary(inputs))
        run_id, sync_dir = run.id, Path(run.settings.sync_dir)
    drop_superseded_run_dirs(sync_dir, run_id)
    return {"wandb_run": run_id, "wandb_dir": str(sync_dir)}


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


# ---------------------------------------------------------------- HTML


def _json_for_script(obj) -> str:
    """JSON that cannot end its <script> element: `<`, `>`, `&` become \\u escapes."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def _header_html(cfg: Config, inputs: ReportInputs, shown: int) -> str:
    stats = inputs.stats
    e = html.escape
    pairs = ", ".join(f"{a} vs {b}" for a, b in stats.get("pairs", []))
    rows = "".join(
        f'<tr data-model="{e(m)}"><td>{e(m)}</td><td class="num mean-logprob">{_fmt(_num(s.get("mean_logprob")), ".4f")}</td>'
        f'<td class="num perplexity">{_fmt(_num(s.get("perplexity")), ".3f")}</td><td class="num">{_fmt(s.get("words"), ",")}</td></tr>'
        for m, s in stats.get("models", {}).items()
    )
    kept = sum(f["kept"] for f in inputs.features)
    return (
        f"<h1>BehaviorBox report <small>{e(cfg.out.name)}</small></h1>"
        f'<p id="corpus-summary">Models: <b id="models">{e(", ".join(inputs.models))}</b> · pairs: {e(pairs)} · '
        f'<span id="n-documents">{_fmt(stats.get("documents"), ",")}</span> documents · '
        f'<span id="n-words">{_fmt(stats.get("words"), ",")}</span> words · '
        f"{len(inputs.features)} feature rows, {kept} kept, {shown} shown</p>"
        '<table id="corpus-table"><thead><tr><th>model</th><th>mean log p</th><th>perplexity</th><th>words</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>{_pair_stats_html(stats)}{_domains_html(stats)}{_findings_html(inputs.findings)}{_sae_html(inputs.sae_runs)}"
    )


def _findings_html(findings: list[dict]) -> str:
    """The findings, ranked by held-out |Δ|: what a reader should look at first."""
    e = html.escape
    rows = "".join(
        f'<tr><td class="num">{f["finding"]}</td><td>{e(str(f["better_model"]))}</td><td>{e(f["rule"] or "–")}</td>'
        f'<td class="num">{_fmt(f["rule_f1"], ".2f")}</td>'
        f'<td class="num">{_fmt(f["holdout_median_dlogp"], "+.2f")} [{_fmt(f["holdout_ci_low"], "+.2f")}, {_fmt(f["holdout_ci_high"], "+.2f")}]</td>'
        f'<td>{e(f["latents"])}</td><td>{e(f["top_words"] or "")}</td></tr>'
        for f in findings
    )
    return (
        f'<h2>Findings ({len(findings)})</h2><table id="findings-table"><thead><tr><th>finding</th><th>better</th><th>rule</th>'
        "<th>rule F1</th><th>held-out Δlog p [95% CI]</th><th>latents</th><th>top words</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


# More domains than this and the per-domain table starts folded, so the findings stay in view.
DOMAINS_OPEN_MAX = 12


def _domains_html(stats: dict) -> str:
    """Each model's perplexity per domain (corpus_stats.json `domains`), the lowest in bold."""
    domains = stats.get("domains") or {}
    if not domains:
        return ""
    e = html.escape
    models = list(stats.get("models", {}))
    pairs = [f"{a} vs {b}" for a, b in stats.get("pairs", [])]
    head = "".join(f"<th>perplexity {e(m)}</th>" for m in models) + "".join(f"<th>mean Δlog p {e(p)}</th>" for p in pairs)
    body = []
    for name, s in domains.items():
        ppl = {m: _num((s.get("models", {}).get(m) or {}).get("perplexity")) for m in models}
        best = min((v for v in ppl.values() if v is not None), default=None)
        shown = {m: f"<b>{_fmt(v, '.2f')}</b>" if v is not None and v == best else _fmt(v, ".2f") for m, v in ppl.items()}
        cells = "".join(f'<td class="num perplexity" data-model="{e(m)}">{text}</td>' for m, text in shown.items())
        cells += "".join(f'<td class="num">{_fmt(_num((s.get("pair_stats", {}).get(p) or {}).get("mean_dlogp")), "+.3f")}</td>' for p in pairs)
        body.append(
            f'<tr data-domain="{e(name)}"><td>{e(name)}</td><td class="num">{_fmt(s.get("documents"), ",")}</td>'
            f'<td class="num">{_fmt(s.get("words"), ",")}</td>{cells}</tr>'
        )
    opened = " open" if len(domains) <= DOMAINS_OPEN_MAX else ""
    return (
        f'<details id="domain-stats"{opened}><summary>Perplexity per domain ({len(domains)} domains, same words as above)</summary>'
        f'<table id="domain-table"><thead><tr><th>domain</th><th>documents</th><th>words</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></details>"
    )


def _pair_stats_html(stats: dict) -> str:
    pair_stats = stats.get("pair_stats") or {}
    if not pair_stats:
        return ""
    e = html.escape
    items = "".join(
        f"<li>{e(pair)}: mean Δlog p {_fmt(_num(s.get('mean_dlogp')), '+.4f')}, median {_fmt(_num(s.get('median_dlogp')), '+.4f')}, "
        f"first model better on {_fmt(_num(s.get('share_a_better')), '.1%')} of words</li>"
        for pair, s in pair_stats.items()
    )
    return f'<ul id="pair-stats">{items}</ul>'


def _sae_html(sae_runs: dict[str, dict]) -> str:
    if not sae_runs:
        return ""
    e = html.escape
    parts = []
    for run, metrics in sae_runs.items():
        rows = "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in metrics.items())
        parts.append(f'<details class="sae-run" data-run="{e(run)}"><summary>SAE {e(run)} (sae/{e(run)}/metrics.json)</summary><table>{rows}</table></details>')
    return f'<section id="sae-runs">{"".join(parts)}</section>'


def build_html(cfg: Config, inputs: ReportInputs) -> tuple[str, int]:
    shown = display_order(inputs.features)[: cfg.report.max_features]
    views = [feature_view(f, inputs, cfg.report.examples_per_feature) for f in shown]
    for view in views:
        view["domains"] = domain_rows(view, inputs.contexts, inputs.domains, cfg.report.domain_min_words)
    domains = sorted(set(inputs.stats.get("domains") or {}) | {d["domain"] for v in views for d in v["domains"]})
    data = {"models": inputs.models, "domains": domains, "features": views}
    page = (
        _PAGE.replace("__TITLE__", html.escape(f"BehaviorBox report: {cfg.out.name}"))
        .replace("__CSS__", _CSS)
        .replace("__HEADER__", _header_html(cfg, inputs, len(shown)))
        .replace("__JS__", _JS)
    )
    # The data goes in last so no placeholder text inside it is ever replaced.
    return page.replace("__DATA__", _json_for_script(data)), len(shown)


# ---------------------------------------------------------------- Markdown


def _md(text) -> str:
    """One table cell: escaped so corpus text cannot break the table or inject HTML."""
    return html.escape(" ".join(str(text or "").split()), quote=False).replace("|", "\\|")


def _md_feature_row(f: dict) -> str:
    ci = f"[{_fmt(f['ci_low'], '+.2f')}, {_fmt(f['ci_high'], '+.2f')}]"
    return (
        f"| {f['latent']} | {_md(f['label'] or '')} | {_fmt(f['median_dlogp'], '+.2f')} {ci} | {_fmt(f['q_value'], '.1e')} "
        f"| {_fmt(f['consistency'], '.2f')} | {_fmt(f['holdout_median_dlogp'], '+.2f')} | {_md(f['top_words'])} |"
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
    lines = ["## Findings", "", f"{len(findings)} finding(s); Δ is the median over the held-out top words, with a bootstrap 95% CI.", ""]
    if findings:
        lines += ["| finding | pair | better | rule (held-out F1) | held-out Δlog p [95% CI] | latents | top words |", "|---:|---|---|---|---|---|---|"]
        for f in findings:
            rule = f"{_md(f['rule'])} ({_fmt(f['rule_f1'], '.2f')})" if f["rule"] else "-"
            delta = f"{_fmt(f['holdout_median_dlogp'], '+.2f')} [{_fmt(f['holdout_ci_low'], '+.2f')}, {_fmt(f['holdout_ci_high'], '+.2f')}]"
            lines.append(f"| {f['finding']} | {_md(f['model_a'])} vs {_md(f['model_b'])} | {_md(f['better_model'])} | {rule} | {delta} | {_md(f['latents'])} | {_md(f['top_words'])} |")
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
        ppl = [_fmt(_num((s.get("models", {}).get(m) or {}).get("perplexity")), ".2f") for m in models]
        delta = [_fmt(_num((s.get("pair_stats", {}).get(p) or {}).get("mean_dlogp")), "+.3f") for p in pairs]
        lines.append(f"| {_md(name)} | {_fmt(s.get('documents'), ',')} | {_fmt(s.get('words'), ',')} | " + " | ".join(ppl + delta) + " |")
    return lines + [""]


def build_markdown(cfg: Config, inputs: ReportInputs) -> str:
    stats = inputs.stats
    lines = [
        f"# BehaviorBox report: {_md(cfg.out.name)}",
        "",
        f"Models: {', '.join(_md(m) for m in inputs.models)} · {_fmt(stats.get('documents'), ',')} documents · {_fmt(stats.get('words'), ',')} words",
        "",
        "## Corpus level",
        "",
        "| model | mean log p | perplexity | words |",
        "|---|---:|---:|---:|",
        *(
            f"| {_md(m)} | {_fmt(_num(s.get('mean_logprob')), '.4f')} | {_fmt(_num(s.get('perplexity')), '.3f')} | {_fmt(s.get('words'), ',')} |"
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
        lines += ["## SAE runs", "", *(f"- `{_md(run)}`: `sae/{_md(run)}/metrics.json`" for run in inputs.sae_runs), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- stage


def run_report(cfg: Config) -> dict:
    inputs = load_inputs(cfg)
    page, shown = build_html(cfg, inputs)
    html_path, md_path = cfg.out / "report.html", cfg.out / "report.md"
    atomic_write_text(html_path, page)
    atomic_write_text(md_path, build_markdown(cfg, inputs))
    result = {
        "report_html": str(html_path),
        "report_md": str(md_path),
        "features": len(inputs.features),
        "kept": sum(f["kept"] for f in inputs.features),
        "shown": shown,
        "sae_runs": list(inputs.sae_runs),
    }
    result.update(log_wandb(cfg, inputs))
    return result


# ---------------------------------------------------------------- page template

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__CSS__</style>
</head>
<body>
<header id="summary">__HEADER__</header>
<main>
<section id="browser">
<div id="controls">
<label>Better model <select id="filter-model"><option value="">all models</option></select></label>
<label id="filter-domain-label" hidden>Domain <select id="filter-domain"><option value="">all domains</option></select></label>
<label><input type="checkbox" id="filter-kept"> kept only</label>
<label>Search <input type="search" id="filter-text" placeholder="label or top words"></label>
<span id="row-count"></span>
</div>
<table id="features"><thead></thead><tbody></tbody></table>
</section>
<section id="feature-card" hidden>
<button type="button" id="card-close" aria-label="close">×</button>
<h2 id="card-title"></h2>
<p id="card-label"></p>
<p class="meta"><span id="card-label-source"></span> <span id="card-label-score"></span></p>
<dl id="card-stats"></dl>
<figure><svg id="card-hist" viewBox="0 0 360 140" role="img" aria-label="histogram of delta log p over the top words"></svg>
<figcaption id="card-hist-caption"></figcaption></figure>
<section id="card-domains" hidden>
<h3>Per domain</h3>
<table id="card-domain-table"><thead><tr><th>domain</th><th>top words</th><th>median Δlog p</th><th>better model wins</th><th>holds</th></tr></thead><tbody></tbody></table>
<p id="card-domain-caption"></p>
</section>
<h3>Train contexts</h3>
<ol id="card-train" class="contexts"></ol>
<h3>Holdout contexts</h3>
<ol id="card-holdout" class="contexts"></ol>
</section>
</main>
<script type="application/json" id="report-data">__DATA__</script>
<script>__JS__</script>
</body>
</html>
"""

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
header { padding: 12px 20px; background: #fff; border-bottom: 1px solid #ddd; }
h1 { font-size: 20px; margin: 0 0 6px; } h1 small { color: #777; font-weight: normal; }
main { display: flex; gap: 16px; padding: 12px 20px; align-items: flex-start; }
#browser { flex: 3; min-width: 0; overflow-x: auto; } #feature-card { flex: 2; min-width: 320px; position: sticky; top: 8px;
  max-height: calc(100vh - 16px); overflow: auto; background: #fff; border: 1px solid #ccc; padding: 10px 14px; }
table { border-collapse: collapse; } td, th { padding: 3px 6px; border-bottom: 1px solid #eee; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.pair { white-space: nowrap; } td.label { min-width: 180px; max-width: 320px; }
#corpus-table { margin: 6px 0; } #features { width: 100%; background: #fff; }
#features th { cursor: pointer; user-select: none; position: sticky; top: 0; background: #f0f0f0; }
#features th[aria-sort="ascending"]::after { content: " ▲"; } #features th[aria-sort="descending"]::after { content: " ▼"; }
#features tr.feature-row { cursor: pointer; } #features tr.feature-row:hover { background: #eef4ff; }
#features tr.selected { background: #dde8ff; } #features tr.kept td.kept { color: #080; font-weight: bold; }
#controls { display: flex; gap: 14px; align-items: center; margin-bottom: 8px; flex-wrap: wrap; }
#row-count { color: #666; } .top-words { color: #555; max-width: 260px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
#card-close { float: right; font-size: 18px; border: none; background: none; cursor: pointer; }
#card-label { font-size: 16px; font-weight: 600; } .meta { color: #666; margin-top: -6px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; } dt { color: #666; } dd { margin: 0; }
.contexts { padding-left: 22px; } .context { margin-bottom: 8px; }
.ctx-text { white-space: pre-wrap; margin: 0; } mark.target { background: #ffe066; padding: 0 2px; font-weight: 600; }
.ctx-meta { color: #555; font-size: 12px; margin: 0; } .ctx-meta span { margin-right: 10px; }
.not-top { opacity: 0.6; } .bar-pos { fill: #2b6cb0; } .bar-neg { fill: #c05621; } .zero { stroke: #333; stroke-dasharray: 3 2; }
.axis { font-size: 10px; fill: #555; }
#domain-stats { margin: 6px 0; } #domain-stats summary { cursor: pointer; color: #333; }
#card-domain-table td.holds-yes { color: #080; } #card-domain-table td.holds-no { color: #b00; font-weight: 600; }
#card-domain-table td.holds-few { color: #888; } #card-domain-table tr.filtered { background: #fff6d5; }
#card-domain-caption { color: #666; font-size: 12px; } tr.more-domains td { color: #666; font-style: italic; }
"""

_JS = r"""
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("report-data").textContent);
  var FEATURES = DATA.features;
  var SVG_NS = document.getElementById("card-hist").namespaceURI;
  var state = { sortKey: null, sortDir: 1, model: "", domain: "", keptOnly: false, text: "" };
  var currentKey = null;
  var DOMAIN_ROWS = 8;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function fixed(x, d) { return x === null || x === undefined ? "–" : x.toFixed(d); }
  function signed(x, d) { return x === null || x === undefined ? "–" : (x > 0 ? "+" : "") + x.toFixed(d); }
  function small(x) {
    if (x === null || x === undefined) return "–";
    return x !== 0 && Math.abs(x) < 1e-3 ? x.toExponential(1) : x.toFixed(3);
  }
  function ci(f) { return "[" + signed(f.ci_low, 2) + ", " + signed(f.ci_high, 2) + "]"; }

  var COLUMNS = [
    { key: "latent", title: "latent", num: true, show: function (f) { return f.latent; } },
    { key: "pair", title: "pair", value: function (f) { return f.model_a + " vs " + f.model_b; } },
    { key: "better_model", title: "better", show: function (f) { return f.better_model || "–"; } },
    { key: "kept", title: "kept", show: function (f) { return f.kept ? "✓" : ""; } },
    { key: "label", title: "label", show: function (f) { return f.label || ""; } },
    { key: "median_dlogp", title: "median Δlog p", num: true, show: function (f) { return signed(f.median_dlogp, 2); } },
    { key: "ci_low", title: "95% CI", num: true, show: ci },
    { key: "q_value", title: "q", num: true, show: function (f) { return small(f.q_value); } },
    { key: "consistency", title: "consistency", num: true, show: function (f) { return fixed(f.consistency, 2); } },
    { key: "holdout_median_dlogp", title: "holdout Δ", num: true, show: function (f) { return signed(f.holdout_median_dlogp, 2); } },
    { key: "density", title: "density", num: true, show: function (f) { return small(f.density); } },
    { key: "top_words", title: "top words", cls: "top-words", show: function (f) { return f.top_words || ""; } }
  ];
  function value(col, f) { return col.value ? col.value(f) : f[col.key]; }

  function compare(col) {
    return function (x, y) {
      var a = value(col, x), b = value(col, y);
      var aMissing = a === null || a === undefined, bMissing = b === null || b === undefined;
      if (aMissing || bMissing) return aMissing === bMissing ? 0 : (aMissing ? 1 : -1);
      if (typeof a === "boolean") { a = a ? 1 : 0; b = b ? 1 : 0; }
      var c = typeof a === "number" ? a - b : String(a).localeCompare(String(b));
      return c * state.sortDir;
    };
  }

  function visible(f) {
    if (state.model && f.better_model !== state.model) return false;
    if (state.keptOnly && !f.kept) return false;
    if (state.domain && !f.domains.some(function (d) { return d.domain === state.domain; })) return false;
    if (!state.text) return true;
    var hay = ((f.label || "") + " " + (f.top_words || "") + " " + f.latent).toLowerCase();
    return hay.indexOf(state.text) >= 0;
  }

  function renderHead() {
    var tr = el("tr");
    COLUMNS.forEach(function (col) {
      var th = el("th", col.num ? "num" : "", col.title);
      th.dataset.sort = col.key;
      if (state.sortKey === col.key) th.setAttribute("aria-sort", state.sortDir > 0 ? "ascending" : "descending");
      th.addEventListener("click", function () {
        state.sortDir = state.sortKey === col.key ? -state.sortDir : 1;
        state.sortKey = col.key;
        renderHead();
        renderRows();
      });
      tr.appendChild(th);
    });
    var thead = document.querySelector("#features thead");
    thead.replaceChildren(tr);
  }

  function renderRows() {
    var rows = FEATURES.filter(visible);
    if (state.sortKey) {
      var col = COLUMNS.filter(function (c) { return c.key === state.sortKey; })[0];
      rows = rows.slice().sort(compare(col));
    }
    var tbody = document.querySelector("#features tbody");
    var fragment = document.createDocumentFragment();
    rows.forEach(function (f) {
      var tr = el("tr", "feature-row" + (f.kept ? " kept" : ""));
      tr.dataset.key = f.key;
      tr.dataset.latent = f.latent;
      tr.dataset.better = f.better_model || "";
      tr.dataset.kept = f.kept ? "true" : "false";
      tr.dataset.median = f.median_dlogp === null ? "" : String(f.median_dlogp);
      tr.tabIndex = 0;
      COLUMNS.forEach(function (col) {
        var td = el("td", (col.num ? "num " : "") + (col.cls || "") + " " + col.key, col.show ? col.show(f) : value(col, f));
        td.dataset.col = col.key;
        tr.appendChild(td);
      });
      tr.addEventListener("click", function () { openCard(f); });
      tr.addEventListener("keydown", function (ev) { if (ev.key === "Enter") openCard(f); });
      if (f.key === currentKey) tr.classList.add("selected");
      fragment.appendChild(tr);
    });
    tbody.replaceChildren(fragment);
    document.getElementById("row-count").textContent = rows.length + " of " + FEATURES.length + " features";
  }

  function addStat(dl, name, text) {
    dl.appendChild(el("dt", "", name));
    var dd = el("dd", "", text);
    dd.dataset.stat = name;
    dl.appendChild(dd);
  }

  function renderStats(f) {
    var dl = document.getElementById("card-stats");
    dl.replaceChildren();
    addStat(dl, "better model", f.better_model || "–");
    addStat(dl, "median Δlog p", signed(f.median_dlogp, 3) + " " + ci(f));
    addStat(dl, "mean Δlog p", signed(f.mean_dlogp, 3));
    addStat(dl, "median Δp", signed(f.median_dp, 3));
    addStat(dl, "q-value", small(f.q_value));
    addStat(dl, "p-value", small(f.p_value));
    addStat(dl, "consistency", fixed(f.consistency, 2));
    addStat(dl, "holdout", signed(f.holdout_median_dlogp, 3) + " median Δlog p over " + (f.holdout_n === null ? "–" : f.holdout_n) + " words" + (f.generalizes ? " (generalizes)" : ""));
    addStat(dl, "top words", (f.n_top === null ? "–" : f.n_top) + ": " + (f.top_words || ""));
    addStat(dl, "density", small(f.density));
    addStat(dl, "coherence", fixed(f.coherence, 3));
    addStat(dl, "source", f.source);
  }

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function renderHistogram(f) {
    var root = document.getElementById("card-hist");
    var caption = document.getElementById("card-hist-caption");
    root.replaceChildren();
    if (!f.hist) { caption.textContent = "No top words with both models' log-probs."; return; }
    var W = 360, H = 140, P = 22, edges = f.hist.edges, counts = f.hist.counts;
    var lo = edges[0], hi = edges[edges.length - 1], span = hi - lo || 1, top = Math.max.apply(null, counts) || 1;
    function x(v) { return P + (v - lo) / span * (W - 2 * P); }
    counts.forEach(function (c, i) {
      var h = c / top * (H - 2 * P), centre = (edges[i] + edges[i + 1]) / 2;
      var bar = svg("rect", { x: x(edges[i]), y: H - P - h, width: Math.max(1, x(edges[i + 1]) - x(edges[i]) - 1), height: h,
        "class": centre >= 0 ? "bar-pos" : "bar-neg", "data-count": c });
      bar.appendChild(svg("title", {}, "[" + edges[i].toFixed(2) + ", " + edges[i + 1].toFixed(2) + "): " + c));
      root.appendChild(bar);
    });
    if (lo < 0 && hi > 0) root.appendChild(svg("line", { x1: x(0), x2: x(0), y1: P / 2, y2: H - P, "class": "zero" }));
    root.appendChild(svg("text", { x: P, y: H - 6, "class": "axis", "text-anchor": "start" }, lo.toFixed(2)));
    root.appendChild(svg("text", { x: W - P, y: H - 6, "class": "axis", "text-anchor": "end" }, hi.toFixed(2)));
    root.appendChild(svg("text", { x: W / 2, y: 12, "class": "axis", "text-anchor": "middle" }, "tallest bar: " + top + " words"));
    caption.textContent = "Δlog p = log p(" + f.model_a + ") − log p(" + f.model_b + ") over the top words; right of 0: " + f.model_a + " better.";
  }

  function renderDomains(f) {
    var section = document.getElementById("card-domains");
    section.hidden = !DATA.domains.length;
    var tbody = document.querySelector("#card-domain-table tbody");
    tbody.replaceChildren();
    // Keep the table small: the domains with most words, plus the one filtered on.
    var listed = f.domains.filter(function (d, i) { return i < DOMAIN_ROWS || d.domain === state.domain; });
    listed.forEach(function (d) {
      var tr = el("tr", d.domain === state.domain ? "filtered" : "");
      tr.dataset.domain = d.domain;
      tr.dataset.holds = d.holds === null ? "" : String(d.holds);
      tr.appendChild(el("td", "", d.domain));
      tr.appendChild(el("td", "num", d.n));
      tr.appendChild(el("td", "num", signed(d.median_dlogp, 2)));
      tr.appendChild(el("td", "num", d.wins === null ? "–" : Math.round(d.wins * 100) + "%"));
      tr.appendChild(el("td", d.holds === null ? "holds-few" : d.holds ? "holds-yes" : "holds-no",
        d.holds === null ? "too few" : d.holds ? "yes" : "no"));
      tbody.appendChild(tr);
    });
    var rest = f.domains.filter(function (d) { return listed.indexOf(d) < 0; });
    if (rest.length) {
      var words = rest.reduce(function (sum, d) { return sum + d.n; }, 0);
      var more = el("tr", "more-domains");
      var cell = el("td", "", "… " + rest.length + " more domains (" + words + " words)");
      cell.colSpan = 5;
      more.appendChild(cell);
      tbody.appendChild(more);
    }
    var held = f.domains.filter(function (d) { return d.holds === true; }).length;
    var judged = f.domains.filter(function (d) { return d.holds !== null; }).length;
    document.getElementById("card-domain-caption").textContent = f.domains.length
      ? "Top words of both splits by document domain; holds: the domain's median Δ has the sign of the whole (" + held + " of " + judged + " domains with enough words)."
      : "No top words with both models' log-probs.";
  }

  function probSpan(model, lp) {
    var span = el("span", "prob");
    span.dataset.model = model;
    var p = lp === null ? null : Math.exp(lp);
    if (p !== null) span.dataset.prob = String(p);
    span.appendChild(el("b", "prob-model", model));
    span.appendChild(document.createTextNode(" p="));
    span.appendChild(el("span", "prob-value", p === null ? "n/a" : p.toPrecision(3)));
    return span;
  }

  function renderContexts(listId, f, contexts) {
    var list = document.getElementById(listId);
    list.replaceChildren();
    if (!contexts.length) { list.appendChild(el("li", "empty", "none")); return; }
    contexts.forEach(function (c) {
      var li = el("li", "context" + (c.in_top ? "" : " not-top"));
      li.dataset.docId = c.doc_id;
      li.dataset.wordIdx = c.word_idx;
      li.dataset.inTop = c.in_top ? "true" : "false";
      var text = el("p", "ctx-text");
      text.appendChild(el("span", "left", c.left));
      text.appendChild(el("mark", "target", c.word));
      text.appendChild(el("span", "right", c.right));
      li.appendChild(text);
      var meta = el("p", "ctx-meta");
      meta.appendChild(probSpan(f.model_a, c.logprob[0]));
      meta.appendChild(probSpan(f.model_b, c.logprob[1]));
      var d = c.logprob[0] === null || c.logprob[1] === null ? null : c.logprob[0] - c.logprob[1];
      meta.appendChild(el("span", "delta", "Δlog p " + signed(d, 2)));
      meta.appendChild(el("span", "doc", c.doc_id + (c.domain ? " · " + c.domain : "") + " · act " + fixed(c.activation, 2)));
      li.appendChild(meta);
      list.appendChild(li);
    });
  }

  function openCard(f) {
    currentKey = f.key;
    var card = document.getElementById("feature-card");
    card.dataset.key = f.key;
    card.dataset.latent = f.latent;
    document.getElementById("card-title").textContent = "Latent " + f.latent + " · " + f.model_a + " vs " + f.model_b;
    document.getElementById("card-label").textContent = f.label || "(unlabeled)";
    document.getElementById("card-label-source").textContent = (f.label_source || "unlabeled") + (f.label_reason ? " (" + f.label_reason + ")" : "");
    document.getElementById("card-label-score").textContent = f.label_score === null || f.label_score === undefined ? "" : "detection score " + f.label_score.toFixed(2);
    renderStats(f);
    renderHistogram(f);
    renderDomains(f);
    renderContexts("card-train", f, f.contexts.train);
    renderContexts("card-holdout", f, f.contexts.holdout);
    card.hidden = false;
    document.querySelectorAll("#features tr.feature-row").forEach(function (tr) {
      tr.classList.toggle("selected", tr.dataset.key === f.key);
    });
    history.replaceState(null, "", "#" + encodeURIComponent(f.key));
  }

  function setUpControls() {
    var select = document.getElementById("filter-model");
    DATA.models.forEach(function (m) { var o = el("option", "", m); o.value = m; select.appendChild(o); });
    select.addEventListener("change", function () { state.model = select.value; renderRows(); });
    var domain = document.getElementById("filter-domain");
    DATA.domains.forEach(function (d) { var o = el("option", "", d); o.value = d; domain.appendChild(o); });
    document.getElementById("filter-domain-label").hidden = !DATA.domains.length;
    domain.addEventListener("change", function () {
      state.domain = domain.value;
      renderRows();
      FEATURES.forEach(function (f) { if (f.key === currentKey) renderDomains(f); });
    });
    var kept = document.getElementById("filter-kept");
    kept.addEventListener("change", function () { state.keptOnly = kept.checked; renderRows(); });
    var text = document.getElementById("filter-text");
    text.addEventListener("input", function () { state.text = text.value.trim().toLowerCase(); renderRows(); });
    document.getElementById("card-close").addEventListener("click", function () {
      document.getElementById("feature-card").hidden = true;
    });
  }

  setUpControls();
  renderHead();
  renderRows();
  var linked = decodeURIComponent(location.hash.slice(1));
  FEATURES.forEach(function (f) { if (f.key === linked) openCard(f); });
})();
"""
