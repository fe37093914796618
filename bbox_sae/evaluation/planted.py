"""`bbox eval planted`: recovery of planted differences, and the null pair.

Model A is a real LM; model B's per-word log-probs are A's plus small noise everywhere, plus a
planted Δ on the words that a set of rules matches (`planting`). A and B differ only there, so a
kept finding should be made of one rule's words, with the right winner; any other kept finding is
a false discovery (`recovery`). The **null pair**: B = A + N(0, noise) with nothing planted,
several SAE seeds; every kept finding is false, so the count should be 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from bbox_sae.artifacts import atomic_write_json, read_table
from bbox_sae.config import Config, load_config, save_resolved
from bbox_sae.errors import BBoxError, ConfigError
from bbox_sae.evaluation.ablation import ablation_variants
from bbox_sae.evaluation.planting import load_rules, planted_logprobs, planted_rules_path, rule_masks
from bbox_sae.evaluation.printing import print_planted
from bbox_sae.evaluation.recovery import rows_to_words, score_recovery
from bbox_sae.evaluation.runs import models_but_b, plant, reading_b_from, score_model_a
from bbox_sae.manifest import Manifest
from bbox_sae.stages import EMBED, INGEST
from bbox_sae.variants import extract, share_outputs


def _evaluated_here(cfg: Config) -> bool:
    """The run in `cfg.out` is an evaluation's own: its saved config reads model B from the planted file."""
    try:
        saved = load_config(cfg.paths.config).model(cfg.compare[0][1])
    except BBoxError:
        return False
    return saved.path is not None and Path(saved.path).resolve() == cfg.paths.planted_logprobs.resolve()


def check_planted_config(cfg: Config) -> None:
    """Before the evaluation writes anything: it replaces model B's log-probs and every result in
    its output dir, so that dir must not hold a run of the user's own."""
    b_name = cfg.compare[0][1]
    if cfg.model(b_name).source != "parquet":
        raise ConfigError(f"eval: model '{b_name}' must be `source: parquet` (its log-probs are planted)")
    if Manifest.read(cfg.out).stages and not _evaluated_here(cfg):
        raise ConfigError(
            f"output_dir {cfg.out}: holds a `bbox run` (manifest.json records its stages), whose log-probs of model '{b_name}' and "
            "findings `bbox eval planted` would replace with planted ones; give the evaluation an output dir of its own (-o)"
        )


def null_run(cfg: Config, words: pa.Table, lp_a: np.ndarray, noise_std: float, seed: int) -> dict:
    """B = A + N(0, noise_std) with nothing planted, SAE seed `seed`; every kept finding is false."""
    out = cfg.paths.null_seed(seed).root
    sub = reading_b_from(cfg, cfg.paths.null_logprobs(seed)).model_copy(update={"output_dir": str(out), "sae": cfg.sae.model_copy(update={"seed": seed})})
    manifest = share_outputs(cfg, sub, (INGEST, EMBED), logprobs_of=models_but_b(cfg))
    rng = np.random.default_rng(1000 + seed)
    plant(sub, manifest, np.minimum(lp_a + rng.normal(0.0, noise_std, size=len(lp_a)), 0.0), words)
    extract(sub, manifest)
    findings = read_table(sub.paths.findings).to_pylist()
    return {
        "seed": seed,
        "kept_findings": len(findings),
        "findings": [{"statement": f["statement"], "kind": f["kind"], "top_words": f["top_words"], "median_dlogp": f["median_dlogp"]} for f in findings],
    }


def run_planted(cfg: Config, rules_path: str | None = None, null_seeds: tuple[int, ...] = (0, 1, 2), ablations: bool = False) -> dict:
    """`bbox eval planted`: score A, plant B, run the pipeline, measure recovery and FDR; then the
    null pair for each seed in `null_seeds`, and (optionally) the ablations."""
    check_planted_config(cfg)
    rules, noise_std, seed = load_rules(planted_rules_path(cfg, rules_path))
    # B's configured `path` may be the user's own file: the planted log-probs go to one of ours,
    # and the saved config says so (a later `bbox run` on this dir reads what was evaluated).
    cfg = reading_b_from(cfg, cfg.paths.planted_logprobs)
    save_resolved(cfg)
    manifest = Manifest.read(cfg.out)
    words, lp_a = score_model_a(cfg, manifest)
    masks = rule_masks(words, rules)
    plant(cfg, manifest, planted_logprobs(lp_a, masks, rules, noise_std, seed), words)
    extract(cfg, manifest)

    results = {
        "rules": {r.name: {"kind": r.kind, "delta": r.delta, "occurrences": int(masks[r.name].sum()), "frequency": float(masks[r.name].mean())} for r in rules},
        "noise_std": noise_std,
        "words": words.num_rows,
        "variants": {},
    }
    variants = ablation_variants(cfg) if ablations else {"full": (cfg.out, cfg.out, "sae")}
    for name, (run_dir, feat_dir, source) in variants.items():
        at = rows_to_words(words, run_dir)
        masks_by_row = {r: m[at] for r, m in masks.items()}
        results["variants"][name] = score_recovery(cfg.model_copy(update={"output_dir": str(run_dir)}), feat_dir, rules, masks_by_row, source)
    results["null"] = [null_run(cfg, words, lp_a, noise_std, s) for s in null_seeds]
    atomic_write_json(cfg.paths.planted_results, results)
    print_planted(results)
    return results
