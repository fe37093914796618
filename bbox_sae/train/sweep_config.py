"""A sweep file: a base config plus the `sae.*` fields to sweep, one SAE per combination.

    base: configs/demo.yaml      # everything but the SAE comes from here: corpus, models, build, output_dir
    features: true               # also run the features stage on each SAE (sae/<run_name>/features/)
    sae:
      d_sae: [256, 512, 1024]    # list-valued fields are the axes: 3 x 2 runs
      k: [8, 16]
      dead_feature_window: 25    # a single value applies to every run of the sweep

`base` is a path like every path in a config: relative to the working directory. A plain config
is a sweep of itself: its list-valued `sae.*` fields (or `--set "sae.k=[8,16]"`) are the axes.
Each run is named by its axis values and the fixed settings that differ from the base and change
the SAE (`d_sae256-k8-dead_feature_window25`), never by the base's `sae.run_name`, which names the
run's own SAE.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bbox_sae.config import Config, SAEConfig, apply_overrides, config_from_dict, load_raw
from bbox_sae.config.keys import field_policy
from bbox_sae.errors import ConfigError

SWEEP_KEYS = ("base", "sae", "features")


@dataclass(frozen=True)
class Sweep:
    path: Path
    # The config the sweep's runs share everything but their SAE settings with (the sweep file itself
    # when it names no base): the build they train on is this config's.
    base: Path
    configs: list[Config]
    axes: dict[str, list]
    # The sweep's own single-valued settings (`sae.*` fields differing from the base's, output_dir):
    # an equivalent W&B sweep passes them to every run.
    fixed: dict[str, Any]
    features: bool


def sweep_axes(raw: dict) -> dict[str, list]:
    sae = raw.get("sae") or {}
    if not isinstance(sae, dict):
        raise ConfigError("'sae' must be a mapping")
    return {k: v for k, v in sae.items() if isinstance(v, list)}


def _from_sweep_file(path: Path, raw: dict) -> tuple[Path, dict, dict, bool]:
    """(base path, the base's raw config, the sweep's raw config, features) of a file naming a base."""
    unknown = [k for k in raw if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(
            f"{path}: unknown key '{unknown[0]}' in a sweep file (it holds {', '.join(SWEEP_KEYS)}); "
            f"everything else comes from its base config, or --set {unknown[0]}.<field>=..."
        )
    base = raw["base"]
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: 'base' must name a config file, e.g. base: configs/demo.yaml")
    features = raw.get("features", False)
    if not isinstance(features, bool):
        raise ConfigError(f"{path}: 'features' is true or false (run the features stage on each SAE); features settings come from the base config")
    sae = raw.get("sae") or {}
    if not isinstance(sae, dict):
        raise ConfigError(f"{path}: 'sae' must be a mapping of sae fields, e.g. sae: {{d_sae: [256, 512]}}")
    try:
        base_raw = load_raw(base)
    except ConfigError as err:
        raise ConfigError(f"{path}: base {err} (a relative base resolves against the working directory)") from None
    if not isinstance(base_raw, dict):
        raise ConfigError(f"{path}: base {base}: a config must be a YAML mapping, got {type(base_raw).__name__}")
    if "base" in base_raw:
        raise ConfigError(f"{path}: base {base} is a sweep file itself; name a plain config")
    base_sae = base_raw.get("sae") or {}
    if isinstance(base_sae, dict):
        base_sae = {k: v for k, v in base_sae.items() if k != "run_name"}
    return Path(base), base_raw, {**base_raw, "sae": {**base_sae, **sae}}, features


def _fixed_settings(base_raw: dict, raw: dict, output_dir: str | None) -> dict[str, Any]:
    base_sae, sae = base_raw.get("sae") or {}, raw.get("sae") or {}
    fixed = {f"sae.{k}": v for k, v in sae.items() if not isinstance(v, list) and base_sae.get(k) != v}
    if output_dir is not None:
        fixed["output_dir"] = output_dir
    return fixed


def _fixed_key_settings(base_raw: dict, raw: dict) -> dict[str, Any]:
    """The sweep's sae settings that are not axes, differ from its base and change the trained SAE."""
    base_sae, sae = base_raw.get("sae") or {}, raw.get("sae") or {}
    fields = SAEConfig.model_fields
    return {
        k: v
        for k, v in sorted(sae.items())
        if not isinstance(v, list) and k in fields and k != "run_name" and base_sae.get(k) != v and getattr(field_policy(fields[k]), "kind", None) == "key"
    }


def read_sweep(path: str | Path, overrides: list[str], output_dir: str | None) -> Sweep:
    path = Path(path)
    raw = load_raw(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config must be a YAML mapping, got {type(raw).__name__}")
    if "base" in raw:
        base, base_raw, raw, features = _from_sweep_file(path, raw)
    else:
        base, base_raw, features = path, raw, False
    raw = apply_overrides(raw, overrides, source=f"{path} (--set)")
    if output_dir is not None:
        if not output_dir.strip():
            raise ConfigError("--output-dir: is empty (an unset shell variable?); name the output folder")
        raw["output_dir"] = output_dir
    axes = sweep_axes(raw)
    empty = [k for k, v in axes.items() if not v]
    if empty:
        raise ConfigError(f"{path}: 'sae.{empty[0]}': an empty list gives no runs; give at least one value")
    for key, values in axes.items():
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            raise ConfigError(f"{path}: 'sae.{key}': {repeated[0]!r} is listed twice; each value is one run, list it once")
    # The sweep's own fixed settings are in its runs' names too: a second sweep of the same axes with
    # another lr retrained `sae/d_sae16-k2` over the first one's run.
    fixed = _fixed_key_settings(base_raw, raw)
    configs = []
    for values in itertools.product(*axes.values()) if axes else [()]:
        run = {**raw, "sae": {**(raw.get("sae") or {}), **dict(zip(axes, values))}}
        if axes and (raw.get("sae") or {}).get("run_name") is None:
            run["sae"]["run_name"] = "-".join(f"{k}{v}" for k, v in [*zip(axes, values), *fixed.items()])
        configs.append(config_from_dict(run, source=str(path)))
    names = [c.sae.resolved_run_name() for c in configs]
    shared = sorted({n for n in names if names.count(n) > 1})
    if shared:
        fix = "drop sae.run_name so each run gets its own" if (raw.get("sae") or {}).get("run_name") is not None else "give the axes values that differ"
        raise ConfigError(f"{path}: sweep runs share a run_name ({shared[0]}); {fix}")
    return Sweep(path, base, configs, axes, _fixed_settings(base_raw, raw, output_dir), features)


def wandb_sweep_spec(sweep: Sweep) -> dict:
    """An equivalent W&B grid sweep for `wandb agent` users (each agent run is `bbox train` on the
    base config, which saves its settings as the run's config.yaml, as `bbox train` does)."""
    parameters = {f"sae.{k}": {"values": v} for k, v in sweep.axes.items()}
    parameters.update({k: {"value": v} for k, v in sweep.fixed.items()})
    return {
        "program": "train/train_sae.py",
        "method": "grid",
        "metric": {"name": "eval/holdout_explained_variance", "goal": "maximize"},
        "parameters": parameters,
        "command": ["${env}", "python", "${program}", "--config", str(sweep.base), "${args_no_hyphens}"],
    }
