"""The report's charts, drawn once with matplotlib and used as PNG everywhere: inlined as a
data URI in report.html, written next to report.md, and logged to W&B as one image each.

Statements and domain names are corpus text; matplotlib draws them as text (never parsed as
mathtext, so a '$' in a word is a dollar sign), so nothing in them reaches HTML.
"""

from __future__ import annotations

import base64
import io
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from bbox_sae.artifacts import atomic_write_bytes
from bbox_sae.report.gap import AXES, GapAccount

PALETTE = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b7791f", "#c53030"]
LABEL_CHARS = 70  # the forest plot's labels wrap at this width; a domain's name is cut there
PLOT_STYLE = {"text.parse_math": False, "font.size": 9}
# The PNG files written next to report.md (and logged to W&B).
from bbox_sae.layout import REPORT_DOMAINS_PNG as DOMAINS_PNG  # noqa: E402
from bbox_sae.layout import REPORT_FOREST_PNG as FOREST_PNG  # noqa: E402
from bbox_sae.layout import REPORT_GAP_PNG as GAP_PNG  # noqa: E402


def _short(text: str) -> str:
    """A domain's name on one line of the per-domain chart."""
    text = " ".join(str(text).split())
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _row_label(finding: dict) -> str:
    """A forest row's label: the finding's number, its whole statement (wrapped, never cut: a cut
    statement says less than the finding) and its held-out n."""
    statement = " ".join(str(finding.get("statement") or finding.get("rule") or "").split())
    n = finding.get("holdout_n")
    return textwrap.fill(f"#{finding['finding']} {statement}" + (f" (n = {n})" if n is not None else ""), LABEL_CHARS)


def model_colors(models: list[str]) -> dict[str, str]:
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(models)}


def forest_figure(findings: list[dict], models: list[str]) -> Figure:
    """One row per finding: its held-out median Δlog p (first model of its pair minus the second)
    and 95% CI, coloured by the better model, sorted by Δ, labelled by number and statement."""
    rows = sorted(findings, key=lambda f: f["holdout_median_dlogp"])
    labels = [_row_label(f) for f in rows]
    lines = max((label.count("\n") + 1 for label in labels), default=1)
    colors = model_colors(models)
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(11, 1.4 + (0.1 + 0.18 * lines) * len(rows)), layout="constrained")
        ax = fig.add_subplot()
        for y, f in enumerate(rows):
            lo, hi = f["holdout_ci_low"], f["holdout_ci_high"]
            if lo is not None and hi is not None:
                ax.plot([lo, hi], [y, y], color=colors.get(f["better_model"], "#555"), linewidth=1.6)
        ax.scatter(
            [f["holdout_median_dlogp"] for f in rows],
            list(range(len(rows))),
            c=[colors.get(f["better_model"], "#555") for f in rows],
            s=28,
            zorder=3,
            gid="findings",
        )
        ax.axvline(0, color="#333", linestyle="--", linewidth=0.8)
        ax.set_yticks(range(len(rows)), labels, fontsize=8)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        pairs = sorted({f"log p({f['model_a']}) − log p({f['model_b']})" for f in rows})
        ax.set_xlabel(f"held-out median Δlog p (nats) and 95% CI\nΔ = {'; '.join(pairs)} (> 0: the first is better)")
        for model in sorted({f["better_model"] for f in rows}):
            ax.scatter([], [], color=colors.get(model, "#555"), label=f"{model} better")
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(axis="x", color="#ddd", linewidth=0.6)
        ax.set_title(f"Findings ({len(rows)}): held-out difference per finding")
    return fig


def domains_figure(stats: dict) -> Figure | None:
    """Per domain: each model's perplexity (left, log scale) and each pair's mean Δlog p (right),
    domains sorted by the first pair's Δ; None when the corpus has no domains."""
    domains = stats.get("domains") or {}
    if not domains:
        return None
    models = list(stats.get("models", {}))
    model_pairs = [tuple(p) for p in stats.get("pairs", [])]
    pairs = [f"{a} vs {b}" for a, b in model_pairs]
    first = pairs[0] if pairs else None

    def first_delta(name: str) -> float:
        value = ((domains[name].get("pair_stats") or {}).get(first) or {}).get("mean_dlogp") if first else None
        return value if value is not None else 0.0

    names = sorted(domains, key=first_delta)
    colors = model_colors(models)
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(10, 1.4 + 0.22 * len(names)), layout="constrained")
        ppl_ax, delta_ax = fig.subplots(1, 2, sharey=True, width_ratios=[3, 2])
        ys = list(range(len(names)))
        for m in models:
            values = [((domains[n].get("models") or {}).get(m) or {}).get("perplexity") for n in names]
            ppl_ax.scatter(
                [v for v in values if v is not None], [y for y, v in zip(ys, values) if v is not None], color=colors[m], s=18, label=m, gid=f"perplexity-{m}"
            )
        ppl_ax.set_xscale("log")
        ppl_ax.set_xlabel("perplexity (lower is better)")
        # A small work's mean rests on few words: each row says how many.
        ppl_ax.set_yticks(ys, [_short(n) + (f" ({domains[n]['words']:,} words)" if domains[n].get("words") else "") for n in names])
        ppl_ax.legend(loc="best", fontsize=8)
        ppl_ax.grid(axis="x", color="#ddd", linewidth=0.6)
        height = 0.8 / max(len(pairs), 1)
        for i, (p, (a, b)) in enumerate(zip(pairs, model_pairs)):
            values = [((domains[n].get("pair_stats") or {}).get(p) or {}).get("mean_dlogp") or 0.0 for n in names]
            bar_colors = [colors.get(a if v > 0 else b, "#555") for v in values]
            delta_ax.barh([y - 0.4 + height * (i + 0.5) for y in ys], values, height=height, color=bar_colors, gid=f"delta-{p}")
        delta_ax.axvline(0, color="#333", linewidth=0.8)
        if len(model_pairs) == 1:
            a, b = model_pairs[0]
            delta_ax.set_xlabel(f"mean Δlog p per word\n({a} − {b})\n> 0: {a} better")
        else:
            delta_ax.set_xlabel("mean Δlog p per word, per pair\n> 0: the pair's first model better")
        delta_ax.grid(axis="x", color="#ddd", linewidth=0.6)
        ppl_ax.set_ylim(-0.7, len(names) - 0.3)
        fig.suptitle(f"Per domain ({len(names)} domains)")
    return fig


def gap_figure(accounts: list[GapAccount]) -> Figure | None:
    """Where the gap lives: one panel per breakdown (frequency, kind, place, domain), each slice's
    mean Δlog p and 95% CI per pair, coloured by the model it favours; None without slices."""
    if not accounts or not accounts[0].slices:
        return None
    axes = [axis for axis in AXES if any(s.axis == axis for s in accounts[0].slices)]
    names = {axis: list(dict.fromkeys(s.name for acc in accounts for s in acc.slices if s.axis == axis)) for axis in axes}
    models = list(dict.fromkeys(m for acc in accounts for m in (acc.model_a, acc.model_b)))
    colors = model_colors(models)
    single = len(accounts) == 1
    with matplotlib.rc_context(PLOT_STYLE):
        rows = sum(len(n) for n in names.values())
        fig = Figure(figsize=(10, 1.2 + 0.24 * rows + 0.5 * len(axes)), layout="constrained")
        panels = fig.subplots(len(axes), 1, height_ratios=[len(names[a]) + 1 for a in axes], squeeze=False)[:, 0]
        offset = 0.6 / max(len(accounts), 1)
        for ax, axis in zip(panels, axes):
            ys = {name: y for y, name in enumerate(names[axis])}
            for i, acc in enumerate(accounts):
                for s in (s for s in acc.slices if s.axis == axis):
                    y = ys[s.name] - 0.3 + offset * (i + 0.5) if not single else ys[s.name]
                    color = colors[acc.model_a if s.mean_dlogp > 0 else acc.model_b]
                    if s.ci_low is not None and s.ci_high is not None:
                        ax.plot([s.ci_low, s.ci_high], [y, y], color=color, linewidth=1.6)
                    ax.scatter([s.mean_dlogp], [y], color=color, s=22, zorder=3, gid=f"gap-{axis}")
            labels = []
            for name in names[axis]:
                first = next(s for s in accounts[0].slices if s.axis == axis and s.name == name) if single else None
                share = f", {first.gap_share:.0%} of the gap" if first is not None and first.gap_share is not None else ""
                words = f" ({first.words:,} words{share})" if first is not None else ""
                labels.append(_short(name) + words)
            ax.set_yticks(range(len(labels)), labels)
            ax.set_ylim(len(labels) - 0.4, -0.6)
            ax.axvline(0, color="#333", linestyle="--", linewidth=0.8)
            ax.grid(axis="x", color="#ddd", linewidth=0.6)
            ax.set_title(f"by {AXES[axis]}", loc="left", fontsize=9)
        pairs = "; ".join(f"log p({acc.model_a}) − log p({acc.model_b})" for acc in accounts)
        panels[-1].set_xlabel(f"mean Δlog p per held-out word (nats) and 95% CI (resampling documents)\nΔ = {pairs} (> 0: the first is better)")
        for model in models:
            panels[0].scatter([], [], color=colors[model], label=f"{model} better")
        panels[0].legend(loc="best", fontsize=8)
        fig.suptitle("Where the gap lives (held-out words)")
    return fig


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    # A script the bundled font lacks (CJK statements) draws as boxes; the HTML and Markdown
    # show every statement as text, so one warning per missing glyph would only be noise.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


@dataclass(frozen=True)
class Charts:
    """The report's charts as PNG files next to report.md; a chart the run has no data for is None."""

    forest: Path | None
    domains: Path | None
    gap: Path | None = None

    @staticmethod
    def _base64(path: Path | None) -> str | None:
        return base64.b64encode(path.read_bytes()).decode("ascii") if path else None

    @property
    def forest_base64(self) -> str | None:
        return self._base64(self.forest)

    @property
    def domains_base64(self) -> str | None:
        return self._base64(self.domains)

    @property
    def gap_base64(self) -> str | None:
        return self._base64(self.gap)


def draw_charts(findings: list[dict], models: list[str], stats: dict, out_dir: Path, gap: list[GapAccount] | None = None) -> Charts:
    """Write the forest plot, the per-domain chart and where the gap lives into `out_dir`; a chart
    without data is not drawn, and an earlier run's file of it is removed so report.md cannot show
    a stale one."""
    figures = {FOREST_PNG: forest_figure(findings, models) if findings else None, DOMAINS_PNG: domains_figure(stats), GAP_PNG: gap_figure(gap or [])}
    paths = {}
    for name, fig in figures.items():
        path = out_dir / name
        if fig is None:
            path.unlink(missing_ok=True)
            paths[name] = None
        else:
            atomic_write_bytes(path, png_bytes(fig))
            paths[name] = path
    return Charts(forest=paths[FOREST_PNG], domains=paths[DOMAINS_PNG], gap=paths[GAP_PNG])
