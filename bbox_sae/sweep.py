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
    configs = []
    for values in itertools.product(*axes.values()) if axes else [()]:
        run = {**raw, "sae": {**(raw.get("sae") or {}), **dict(zip(axes, values))}}
        if axes and "run_name" not in (raw.get("sae") or {}):
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


def summary_rows(results: list[tuple[Config, dict]]) -> list[dict]:
    rows = []
    for cfg, m in results:
        h = m.get("holdout", {})
        rows.append(
            {
                "run_name": cfg.sae.resolved_run_name(),
                "architecture": cfg.sae.architecture,
                "d_sae": cfg.sae.d_sae,
                "k": cfg.sae.k,
                "explained_variance": h.get("explained_variance"),
                "mse": h.get("mse"),
                "mean_l0": h.get("mean_l0"),
                "dead_fraction": h.get("dead_fraction"),
                "rows_per_s": m.get("rows_per_s"),
            }
        )
    return rows


def run_sweep(path: str | Path, overrides: list[str], output_dir: str | None, wandb_sweep_yaml: str | None = None) -> list[dict]:
    from rich.console import Console
    from rich.table import Table

    from bbox_sae.config import save_resolved
    from bbox_sae.sae import run_train

    configs = expand_sweep(path, overrides, output_dir)
    if wandb_sweep_yaml:
        axes = sweep_axes(apply_overrides(load_raw(path), overrides))
        atomic_write_text(wandb_sweep_yaml, yaml.safe_dump(wandb_sweep_spec(path, axes), sort_keys=False))
    group = f"sweep-{Path(path).stem}"
    results = []
    for cfg in configs:
        save_resolved(cfg)
        results.append((cfg, run_train(cfg, wandb_group=group)))
    rows = summary_rows(results)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    out = configs[0].out / "sae" / "sweep_summary.csv"
    atomic_write_text(out, buf.getvalue())
    table = Table(title=f"Sweep {Path(path).name}: held-out metrics ({out})")
    for col in rows[0]:
        table.add_column(col)
    for r in rows:
        table.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()])
    Console().print(table)
    return rows
