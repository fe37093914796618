"""Dictionary-size sweeps: list-valued `sae.*` fields expand into one training run per combination.

`sae: {d_sae: [1000, 3000, 10000], k: [25, 50]}` gives six runs, each in its own
`<output_dir>/sae/<run_name>/`, all in one W&B group, and a summary table of held-out metrics.
"""

from __future__ import annotations

import csv
import io
import itertools
from pathlib import Path

import yaml

from bbox_sae.artifacts import atomic_write_text
from bbox_sae.config import Config, apply_overrides, config_from_dict, load_raw
from bbox_sae.errors import ConfigError


def sweep_axes(raw: dict) -> dict[str, list]:
    sae = raw.get("sae") or {}
    if not isinstance(sae, dict):
        raise ConfigError("'sae' must be a mapping")
    return {k: v for k, v in sae.items() if isinstance(v, list)}


def expand_sweep(path: str | Path, overrides: list[str], output_dir: str | None) -> list[Config]:
    raw = apply_overrides(load_raw(path), overrides, source=f"{path} (--set)")
    if output_dir is not None:
        raw["output_dir"] = output_dir
    axes = sweep_axes(raw)
    empty = [k for k, v in axes.items() if not v]
    if empty:
        raise ConfigError(f"{path}: 'sae.{empty[0]}': an empty list gives no runs; give at least one value")
    configs = []
    for values in itertools.product(*axes.values()) if axes else [()]:
        run = {**raw, "sae": {**(raw.get("sae") or {}), **dict(zip(axes, values))}}
        if axes and (raw.get("sae") or {}).get("run_name") is None:
            run["sae"]["run_name"] = "-".join(f"{k}{v}" for k, v in zip(axes, values))
        configs.append(config_from_dict(run, source=str(path)))
    names = [c.sae.resolved_run_name() for c in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: sweep runs share a run_name; drop sae.run_name so each run gets its own")
    return configs


def wandb_sweep_spec(path: str | Path, raw_axes: dict[str, list]) -> dict:
    """An equivalent W&B grid sweep for `wandb agent` users (each agent run calls `bbox train`)."""
    return {
        "program": "train/train_sae.py",
        "method": "grid",
        "metric": {"name": "eval/holdout_explained_variance", "goal": "maximize"},
        "parameters": {f"sae.{k}": {"values": v} for k, v in raw_axes.items()},
        "command": ["${env}", "python", "${program}", "--config", str(path), "${args_no_hyphens}"],
    }


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


def summary_rows(results: list[tuple[Config, dict]]) -> list[dict]:
    rows = []
    for cfg, m in results:
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
                "flags": "; ".join(run_flags(m, cfg.sae.k)),
            }
        )
    return rows


def plot_summary(rows: list[dict], path: Path) -> Path:
    """Held-out EV and dead fraction against d_sae, one line per k: where a bigger dictionary stops paying."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ev, ax_dead) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for k in sorted({r["k"] for r in rows}):
        sel = sorted((r for r in rows if r["k"] == k), key=lambda r: r["d_sae"])
        d = [r["d_sae"] for r in sel]
        ax_ev.plot(d, [r["ev_holdout"] for r in sel], marker="o", label=f"k={k}")
        ax_dead.plot(d, [r["dead_fraction"] for r in sel], marker="o", label=f"k={k}")
        flagged = [r for r in sel if r["flags"]]
        ax_ev.scatter([r["d_sae"] for r in flagged], [r["ev_holdout"] for r in flagged], s=150, facecolors="none", edgecolors="red", zorder=3)
    ax_ev.axhline(MIN_EV, color="red", lw=0.8, ls="--", label=f"flag: EV<{MIN_EV}")
    for ax, title in ((ax_ev, "held-out explained variance"), (ax_dead, "dead fraction (never fires on holdout)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["d_sae"] for r in rows}), labels=[str(d) for d in sorted({r["d_sae"] for r in rows})])
        ax.minorticks_off()
        ax.set_xlabel("d_sae")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    ax_dead.set_ylim(0, 1)
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

    shown = ["run_name", "d_sae", "k", "steps", "ev_train", "ev_holdout", "mean_l0", "l0_over_k", "dead_fraction", "flags"]
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


def run_sweep(path: str | Path, overrides: list[str], output_dir: str | None, wandb_sweep_yaml: str | None = None) -> list[dict]:
    """Train every combination through the stage registry (`bbox train`'s path: on a current build,
    recorded in the manifest, so `bbox run` with a run's settings finds its SAE up to date)."""
    from bbox_sae.config import ensure_output_dir, save_resolved
    from bbox_sae.pipeline import run_lock
    from bbox_sae.stages import run_command
    from bbox_sae.tracking import wandb_run

    configs = expand_sweep(path, overrides, output_dir)
    if wandb_sweep_yaml:
        axes = sweep_axes(apply_overrides(load_raw(path), overrides))
        atomic_write_text(wandb_sweep_yaml, yaml.safe_dump(wandb_sweep_spec(path, axes), sort_keys=False))
    group = f"sweep-{Path(path).stem}"
    results = []
    # Every run writes the one manifest of the shared output dir.
    with run_lock(ensure_output_dir(configs[0])):
        for cfg in configs:
            save_resolved(cfg)
            in_group = cfg.model_copy(update={"wandb": cfg.wandb.model_copy(update={"group": group})})
            results.append((cfg, run_command("train", in_group)))
    rows = summary_rows(results)
    paths = configs[0].paths
    _write_csv(rows, paths.sweep_summary_csv)
    png = plot_summary(rows, paths.sweep_summary_png)
    with wandb_run(configs[0], "sweep-summary", config={"sweep": str(path), "runs": len(rows)}, group=group, name=group) as run:
        if run is not None:
            import wandb

            run.log(
                {"sweep/summary": wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows]), "sweep/ev_dead_vs_d_sae": wandb.Image(str(png))}
            )
    _print_table(rows, f"Sweep {Path(path).name}: held-out metrics ({paths.sweep_summary_csv}, plot {png.name})")
    return rows
