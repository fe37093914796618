"""Dictionary-size sweeps: one SAE per combination of a sweep's `sae.*` values, on the run's build.

`bbox sweep -c configs/sweep-dict-size.yaml` (the sweep file, `sweep_config.py`) trains each SAE
into `<output_dir>/sae/<run_name>/` (its weights, metrics and resolved config.yaml), all in one
W&B group, and writes a summary of held-out metrics; with `features: true` each SAE's findings go
to `sae/<run_name>/features/` and the summary says how many findings and kept latents each size
gives. The run itself is left as it was: its config.yaml, manifest and tables are not touched.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import yaml

from bbox_sae.artifacts import atomic_write_text, read_table
from bbox_sae.bookkeeping import require_current_inputs, run_aside, run_lock
from bbox_sae.config import Config
from bbox_sae.errors import ArtifactError, ConfigError
from bbox_sae.manifest import Manifest
from bbox_sae.stages import TRAIN
from bbox_sae.train.sweep_config import Sweep, read_sweep, wandb_sweep_spec

# A run is flagged when its held-out reconstruction is poor or its inference model does not fire
# about k latents per row: either way its features are not worth reading.
MIN_EV = 0.5
MAX_L0_OFF_K = 0.25


def run_flags(m: dict, k: int) -> list[str]:
    h = m.get("holdout", {})
    ev, l0 = h.get("explained_variance"), h.get("mean_l0")
    flags = []
    if ev is None or not ev >= MIN_EV:
        flags.append(f"EV<{MIN_EV}")
    if l0 is None or not abs(l0 / k - 1) <= MAX_L0_OFF_K:
        flags.append(f"L0 off k by >{MAX_L0_OFF_K:.0%}")
    if m.get("warnings"):
        flags.append("short run")
    return flags


@dataclass(frozen=True)
class SweepRun:
    cfg: Config
    metrics: dict
    # Counted in the run's own features tables (`features: true`), else None.
    findings: int | None = None
    kept_latents: int | None = None


def summary_rows(results: list[SweepRun]) -> list[dict]:
    rows = []
    for r in results:
        cfg, m = r.cfg, r.metrics
        h, t = m.get("holdout", {}), m.get("train_sample", {})
        l0 = h.get("mean_l0")
        rows.append(
            {
                "run_name": cfg.sae.resolved_run_name(),
                "architecture": cfg.sae.architecture,
                "d_sae": cfg.sae.d_sae,
                "k": cfg.sae.k,
                "steps": m.get("steps"),
                "rows_trained": m.get("rows_trained"),
                "ev_train": t.get("explained_variance"),
                "ev_holdout": h.get("explained_variance"),
                "ev_holdout_training_mode": m.get("training_mode", {}).get("holdout", {}).get("explained_variance"),
                "mean_l0": l0,
                "l0_over_k": l0 / cfg.sae.k if l0 is not None else None,
                "dead_fraction": h.get("dead_fraction"),
                "mse": h.get("mse"),
                "rows_per_s": m.get("rows_per_s"),
                "findings": r.findings,
                "kept_latents": r.kept_latents,
                "flags": "; ".join(run_flags(m, cfg.sae.k)),
            }
        )
    return rows


# (column, panel title) of the sweep plot; the last two only when the sweep ran the features stage.
PANELS = [
    ("ev_holdout", "held-out explained variance"),
    ("dead_fraction", "dead fraction (never fires on holdout)"),
    ("findings", "findings"),
    ("kept_latents", "kept latents"),
]


def plot_summary(rows: list[dict], path: Path) -> Path:
    """Held-out EV, dead fraction and (with features) findings and kept latents against d_sae, one
    line per k: where a bigger dictionary stops paying, in reconstruction and in what it finds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = PANELS[:2] + [p for p in PANELS[2:] if any(r[p[0]] is not None for r in rows)]
    from matplotlib.ticker import MaxNLocator

    rows_of_panels = len(panels) // 2
    fig, axes = plt.subplots(rows_of_panels, 2, figsize=(10, 4 * rows_of_panels), constrained_layout=True, squeeze=False)
    by_column = dict(zip((c for c, _ in panels), axes.flat))
    sizes = sorted({r["d_sae"] for r in rows})
    for k in sorted({r["k"] for r in rows}):
        sel = sorted((r for r in rows if r["k"] == k), key=lambda r: r["d_sae"])
        for column, ax in by_column.items():
            ax.plot([r["d_sae"] for r in sel], [r[column] for r in sel], marker="o", label=f"k={k}")
        flagged = [r for r in sel if r["flags"]]
        by_column["ev_holdout"].scatter([r["d_sae"] for r in flagged], [r["ev_holdout"] for r in flagged], s=150, facecolors="none", edgecolors="red", zorder=3)
    by_column["ev_holdout"].axhline(MIN_EV, color="red", lw=0.8, ls="--", label=f"flag: EV<{MIN_EV}")
    for (_, title), ax in zip(panels, axes.flat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, labels=[str(d) for d in sizes])
        ax.minorticks_off()
        ax.set_xlabel("d_sae")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    by_column["dead_fraction"].set_ylim(0, 1)
    for column in ("findings", "kept_latents"):
        if column in by_column:
            by_column[column].set_ylim(bottom=0)
            by_column[column].yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _write_csv(rows: list[dict], path: Path) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _print_table(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    shown = ["run_name", "d_sae", "k", "steps", "ev_train", "ev_holdout", "mean_l0", "l0_over_k", "dead_fraction"]
    if any(r["findings"] is not None for r in rows):
        shown += ["findings", "kept_latents"]
    shown.append("flags")
    table = Table(title=title)
    for col in shown:
        table.add_column(col, no_wrap=col != "flags")
    for r in rows:
        cells = [f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in shown]
        table.add_row(*cells, style="red" if r["flags"] else None)
    console = Console()
    console.print(table)
    flagged = [r["run_name"] for r in rows if r["flags"]]
    if flagged:
        console.print(
            f"[red]{len(flagged)} run(s) flagged ({', '.join(flagged)}): held-out EV < {MIN_EV}, mean L0 off k by more than "
            f"{MAX_L0_OFF_K:.0%}, or too short for its dead-latent statistics (see each run's metrics.json warnings)[/red]"
        )


def _recorded_sae_dirs(cfg: Config, manifest: Manifest) -> set[Path]:
    """The run's own SAE, as its manifest records it: a sweep must not train over it."""
    record = manifest.get(TRAIN.name)
    return {(cfg.out / rel).parent.resolve() for rel in (record.outputs if record else {})}


def require_sweepable(sweep: Sweep, manifest: Manifest) -> None:
    """Read-only: a refused sweep leaves the run exactly as it was (no config, no empty SAE dirs)."""
    cfg = sweep.configs[0]
    try:
        require_current_inputs(TRAIN, cfg, manifest)
    except ArtifactError as err:
        raise ArtifactError(f"sweep {sweep.path}: {err}, with the sweep's base config {sweep.base}") from None
    own = _recorded_sae_dirs(cfg, manifest)
    for c in sweep.configs:
        if c.sae_paths.root.resolve() in own:
            raise ConfigError(
                f"{sweep.path}: sweep run '{c.sae.resolved_run_name()}' would train over {c.sae_paths.root}, the run's own SAE "
                "(manifest.json); sweep a list of values (runs are named by them) or set another sae.run_name"
            )


def _find(cfg: Config, metrics: dict) -> SweepRun:
    """The features stage on this SAE, into its own `sae/<run_name>/features/`: what this size finds."""
    from bbox_sae.features import run_features

    tables = cfg.sae_paths.features
    result = run_features(cfg, into=tables)
    features = read_table(tables.features, columns=["latent", "kept"])
    kept = {latent for latent, is_kept in zip(features["latent"].to_pylist(), features["kept"].to_pylist()) if is_kept}
    return SweepRun(cfg, metrics, findings=result["findings"], kept_latents=len(kept))


def run_sweep(path: str | Path, overrides: list[str], output_dir: str | None, wandb_sweep_yaml: str | None = None, features: bool = False) -> list[dict]:
    """Train every combination on the run's current build; with features (`--features` or the sweep
    file's `features: true`) also find what each SAE finds."""
    from bbox_sae.feasibility import check_memory
    from bbox_sae.tracking import wandb_run

    sweep = read_sweep(path, overrides, output_dir)
    features = features or sweep.features
    for cfg in sweep.configs:
        check_memory(cfg, trains=True, extracts=features)
    require_sweepable(sweep, Manifest.read(sweep.configs[0].out))
    if wandb_sweep_yaml:
        atomic_write_text(wandb_sweep_yaml, yaml.safe_dump(wandb_sweep_spec(sweep), sort_keys=False))
    group = f"sweep-{sweep.path.stem}"
    paths = sweep.configs[0].paths
    results = []
    with run_lock(sweep.configs[0].out):
        manifest = Manifest.read(sweep.configs[0].out)
        require_sweepable(sweep, manifest)  # again, now that no other command can change the build
        for cfg in sweep.configs:
            in_group = cfg.model_copy(update={"wandb": cfg.wandb.model_copy(update={"group": group})})
            # The train stage's code and key (a killed sweep resumes each run from its checkpoints),
            # but not recorded: the manifest holds one train record, the run's own SAE, and a sweep
            # run put there would make the run's features, labels and report out of date.
            metrics = run_aside(TRAIN, in_group, manifest)
            results.append(_find(in_group, metrics) if features else SweepRun(cfg, metrics))
        rows = summary_rows(results)
        _write_csv(rows, paths.sweep_summary_csv)
        png = plot_summary(rows, paths.sweep_summary_png)
    with wandb_run(sweep.configs[0], "sweep-summary", config={"sweep": str(path), "runs": len(rows)}, group=group, name=group) as run:
        if run is not None:
            import wandb

            run.log({"sweep/summary": wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows]), "sweep/plot": wandb.Image(str(png))})
    _print_table(rows, f"Sweep {sweep.path.name}: held-out metrics ({paths.sweep_summary_csv}, plot {png.name})")
    return rows
