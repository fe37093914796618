"""Experiments behind the feature-extraction defaults: one variant of build / SAE / features settings
on the planted corpora (recovery, FDR, null pair) or on the demo pair (coherence, no ground truth).

    .venv/bin/python benchmarks/coherence_experiments.py planted-handbook  VARIANT [--set key=value ...] [--null-seeds 3]
    .venv/bin/python benchmarks/coherence_experiments.py planted-shakespeare VARIANT [--set ...]
    .venv/bin/python benchmarks/coherence_experiments.py demo VARIANT [--set ...]
    .venv/bin/python benchmarks/coherence_experiments.py table      # benchmarks/results/coherence.md from all results

Each variant runs in `runs/exp/<setup>/<variant>/`, sharing the setup's scored and embedded words
(`runs/planted-*/` or `runs/demo/`: run `bbox eval planted` / `make demo` once first), so only
build → train → features → label are redone. Results go to `benchmarks/results/coherence/`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "coherence"
SETUPS = {
    "planted-handbook": ("configs/planted-handbook.yaml", "configs/planted-rules-handbook.yaml"),
    "planted-shakespeare": ("configs/planted-shakespeare.yaml", "configs/planted-rules-shakespeare.yaml"),
    "demo": ("configs/demo.yaml", None),
}


def rescore(setup: str, variant: str) -> dict:
    """Re-run features → label and the evaluation on a finished variant's trained SAEs (its main run,
    null-pair and seed runs): for changes that touch only feature extraction."""
    from bbox_sae.artifacts import read_table
    from bbox_sae.config import load_config
    from bbox_sae.evaluation import coherence_summary, load_rules, rows_to_words, rule_masks, score_recovery, stability
    from bbox_sae.features import run_features
    from bbox_sae.labeling import labeled_features, run_label
    from bbox_sae.layout import RunLayout

    path = RESULTS / f"{setup}__{variant}.json"
    row = json.loads(path.read_text())
    out = REPO / "runs" / "exp" / setup / variant
    paths = RunLayout(out)
    null_runs = sorted(out.glob(paths.null_seed("*").root.name))
    runs = [out, *null_runs, *sorted(out.glob("seed[0-9]*"))]
    # The variant's own settings win over the saved config, whose defaults may have changed since.
    settings = [o for o in row["overrides"] if not o.startswith("models.")]
    for run in runs:
        saved = RunLayout(run).config if RunLayout(run).config.exists() else paths.config
        cfg = load_config(saved, settings, output_dir=str(run))
        run_features(cfg)
        run_label(cfg)
    cfg = load_config(paths.config, settings)
    _, rules = SETUPS[setup]
    if rules:
        rule_list, _, _ = load_rules(REPO / rules)
        words = read_table(paths.words)
        masks = rule_masks(words, rule_list)
        at = rows_to_words(words, out)
        result = score_recovery(cfg, out, rule_list, {k: v[at] for k, v in masks.items()}, "sae")
        nulls = [read_table(RunLayout(r).findings).num_rows for r in null_runs]
        row = {**row, **result, "null_kept": nulls}
    else:
        findings = read_table(paths.findings).to_pylist()
        row = {**row, **coherence_summary(labeled_features(paths), read_table(paths.findings))}
        row["examples"] = [{k: f[k] for k in ("finding", "better_model", "holdout_median_dlogp", "rule", "rule_f1", "top_words")} for f in findings]
        if row.get("stability"):
            row["stability"] = {**stability([out, *sorted(out.glob("seed[0-9]*"))]), "runs": row["stability"]["runs"]}
    path.write_text(json.dumps(row, indent=1, default=str))
    return row


def run_variant(setup: str, variant: str, overrides: list[str], null_seeds: int, stability_seeds: int = 1) -> dict:
    from bbox_sae.artifacts import read_table
    from bbox_sae.config import load_config
    from bbox_sae.evaluation import coherence_summary, run_planted, stability
    from bbox_sae.labeling import labeled_features
    from bbox_sae.layout import RunLayout
    from bbox_sae.stages import EMBED, INGEST, SCORE
    from bbox_sae.variants import extract, share_outputs

    config, rules = SETUPS[setup]
    base = load_config(REPO / config)
    out = REPO / "runs" / "exp" / setup / variant
    paths = RunLayout(out)
    if rules:
        b_name = base.compare[0][1]
        overrides = [*overrides, f"models.{[m.name for m in base.models].index(b_name)}.path={paths.planted_logprobs}"]
    cfg = load_config(REPO / config, overrides, output_dir=str(out))
    # A planted run shares model A's log-probs only: B's are planted there.
    manifest = share_outputs(base, cfg, (INGEST, EMBED), logprobs_of=[cfg.compare[0][0]]) if rules else share_outputs(base, cfg, (INGEST, SCORE, EMBED))
    if rules:
        results = run_planted(cfg, rules_path=str(REPO / rules), null_seeds=tuple(range(null_seeds)))
        row = {**results["variants"]["full"], "null_kept": [r["kept_findings"] for r in results["null"]]}
    else:
        extract(cfg, manifest)
        row = coherence_summary(labeled_features(paths), read_table(paths.findings))
        if stability_seeds > 1:
            dirs = [out]
            for seed in range(1, stability_seeds):
                seed_cfg = load_config(REPO / config, [*overrides, f"sae.seed={seed}"], output_dir=str(out / f"seed{seed}"))
                extract(seed_cfg, share_outputs(base, seed_cfg, (INGEST, SCORE, EMBED)))
                dirs.append(seed_cfg.out)
            row["stability"] = {**stability(dirs), "runs": stability_seeds}
        findings = read_table(paths.findings).to_pylist()
        row["examples"] = [{k: f[k] for k in ("finding", "better_model", "holdout_median_dlogp", "rule", "rule_f1", "top_words")} for f in findings]
    row.update(setup=setup, variant=variant, overrides=overrides[: len(overrides) - (1 if rules else 0)], null_seeds=null_seeds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{setup}__{variant}.json").write_text(json.dumps(row, indent=1, default=str))
    return row


def command(row: dict) -> str:
    sets = " ".join(f"--set {shlex.quote(o)}" for o in row["overrides"])
    nulls = (
        f" --null-seeds {row['null_seeds']}" if row["setup"] != "demo" else (f" --stability-seeds {row['stability']['runs']}" if row.get("stability") else "")
    )
    return f"`python benchmarks/coherence_experiments.py {row['setup']} {row['variant']} {sets}{nulls}`".replace("  ", " ")


def table() -> str:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    lines = [
        "| setup | variant | rules recovered | mean recall | FDR | findings (latents) | max splits | null kept (per seed) | command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["setup"] == "demo":
            continue
        lines.append(
            f"| {r['setup']} | {r['variant']} | {r['rules_recovered']}/{r['rules']} | {r['mean_recall']:.2f} | {r['fdr']:.2f} | "
            f"{r['kept_findings']} ({r['kept_latents']}) | {r['max_splits']} | {r['null_kept']} | {command(r)} |"
        )
    lines += [
        "",
        "| setup | variant | findings | kept latents | median rule F1 | median label score | label score >= 0.75 | stable in 2 of 3 seeds | command |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["setup"] != "demo":
            continue
        f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(
            f"| demo | {r['variant']} | {r['findings']} | {r['kept_latents']} | {f(r['median_rule_f1'])} | {f(r['median_label_score'])} | "
            f"{f(r['share_label_score_at_least_0.75'])} | {f((r.get('stability') or {}).get('stable_share'))} | {command(r)} |"
        )
    text = "\n".join(lines) + "\n"
    (REPO / "benchmarks" / "results" / "coherence.md").write_text(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("setup", choices=[*SETUPS, "table"])
    parser.add_argument("variant", nargs="?")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--null-seeds", type=int, default=3)
    parser.add_argument("--rescore", action="store_true", help="reuse the variant's trained SAEs: re-run features, label and the evaluation")
    parser.add_argument("--stability-seeds", type=int, default=1, help="demo: also train SAEs with seeds 1..N-1 and measure how many findings reappear")
    args = parser.parse_args(argv)
    if args.setup == "table":
        print(table())
        return 0
    if not args.variant:
        parser.error("name the variant")
    if args.rescore:
        row = rescore(args.setup, args.variant)
    else:
        row = run_variant(args.setup, args.variant, args.overrides, args.null_seeds, args.stability_seeds)
    print(json.dumps({k: v for k, v in row.items() if k not in ("per_rule", "examples", "spurious_findings")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
