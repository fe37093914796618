"""Evidence: planted-difference recovery and ablations.

Planted recovery builds a ground truth the paper lacks. Model A is a real LM; model B's
per-word log-probs are A's plus small noise everywhere, plus a planted Δ on the words that a
set of rules matches (`configs/planted-rules.yaml`). Since A and B differ only there, a kept
feature should be made of one rule's words, with the right winner; any other kept feature is
a false discovery.

- A rule is **recovered** when some kept feature's top words are >= 80% that rule's words and
  its better model is the one the planted Δ favours. Per rule we also report the best
  precision (share of a kept feature's top words from the rule) and that feature's recall (share
  of the rule's words, in all documents, on which its latent fires).
- **FDR**: share of kept features whose top words are < 50% planted (any rule).

Ablations run the same extraction on the same rows: the full method, `output_feature_weight=0`
(no performance signal; its own build and SAE in `ablation-w0/`), an untrained SAE, and k-means.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import regex
import torch
import yaml

from bbox_sae.artifacts import atomic_write_json, read_table
from bbox_sae.config import Config
from bbox_sae.errors import ConfigError

log = logging.getLogger(__name__)

RECOVERED_SHARE = 0.8
SPURIOUS_SHARE = 0.5


@dataclass(frozen=True)
class PlantedRule:
    """A word matches when every given regex matches: `word` on the stripped word, `prev` / `next`
    on the raw neighbouring word ("" at a document edge), `left` on the previous `left_words` words joined."""

    name: str
    delta: float
    word: str | None = None
    prev: str | None = None
    next: str | None = None
    left: str | None = None
    left_words: int = 3

    def matches(self, words: list[str]) -> np.ndarray:
        n = len(words)
        hit = np.ones(n, dtype=bool)
        checks = [(self.word, lambda i: words[i].strip()), (self.prev, lambda i: words[i - 1] if i else ""), (self.next, lambda i: words[i + 1] if i + 1 < n else "")]
        checks.append((self.left, lambda i: "".join(words[max(0, i - self.left_words) : i])))
        for pattern, text_of in checks:
            if pattern is None:
                continue
            compiled = regex.compile(pattern)
            hit &= np.array([bool(compiled.search(text_of(i))) for i in range(n)], dtype=bool)
        return hit


def load_rules(path: str | Path) -> tuple[list[PlantedRule], float, int]:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read planted rules: {err}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("rules"), list):
        raise ConfigError(f"{path}: expected a mapping with a `rules` list")
    rules = []
    for i, r in enumerate(raw["rules"]):
        try:
            rule = PlantedRule(**r)
            for pattern in (rule.word, rule.prev, rule.next, rule.left):
                if pattern is not None:
                    regex.compile(pattern)
        except (TypeError, regex.error) as err:
            raise ConfigError(f"{path}: rules[{i}]: {err}") from None
        rules.append(rule)
    return rules, float(raw.get("noise_std", 0.1)), int(raw.get("seed", 0))


def rule_masks(words: pa.Table, rules: list[PlantedRule]) -> dict[str, np.ndarray]:
    """Per rule, which rows of `words` (ordered by doc then word) it matches."""
    doc_ids = words["doc_id"].to_numpy(zero_copy_only=False)
    word_list = words["word"].to_pylist()
    bounds = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1], True])
    masks = {r.name: np.zeros(len(word_list), dtype=bool) for r in rules}
    for s, e in zip(bounds[:-1], bounds[1:]):
        for r in rules:
            masks[r.name][s:e] = r.matches(word_list[s:e])
    return masks


def planted_logprobs(lp_a: np.ndarray, masks: dict[str, np.ndarray], rules: list[PlantedRule], noise_std: float, seed: int) -> np.ndarray:
    """Model B = A + N(0, noise) + the planted Δ of each matching rule, kept a valid log-prob (<= 0)."""
    rng = np.random.default_rng(seed)
    lp_b = lp_a + rng.normal(0.0, noise_std, size=len(lp_a))
    for r in rules:
        lp_b = lp_b + r.delta * masks[r.name]
    return np.minimum(lp_b, 0.0)


def _encode_latents(cfg: Config, out: Path, latents: list[int], source: str) -> np.ndarray:
    """(rows, len(latents)) activation > 0 for the given latents over every row."""
    from bbox_sae.dataset import open_matrix
    from bbox_sae.features import kmeans_encoder, random_sae_encoder, sae_encoder
    from bbox_sae.sae import load_sae, run_dir_for, sample_mean

    sub = cfg.model_copy(update={"output_dir": str(out)})
    matrix, index, _ = open_matrix(sub)
    rows = index["row"].to_numpy()
    train = rows[index["split"].to_numpy(zero_copy_only=False) == "train"]
    if source == "random":
        encode = random_sae_encoder(sub, matrix.shape[1], sample_mean(matrix, train, sub.sae.seed))
    elif source == "kmeans":
        encode = kmeans_encoder(sub, matrix, train)
    else:
        encode = sae_encoder(load_sae(run_dir_for(sub)))
    fires = np.zeros((len(rows), len(latents)), dtype=bool)
    for s in range(0, len(rows), 8192):
        acts = encode(torch.from_numpy(np.asarray(matrix[s : s + 8192], dtype=np.float32)))
        fires[s : s + 8192] = (acts[:, latents] > 0).numpy()
    return fires


def score_recovery(cfg: Config, out: Path, features_dir: Path, rules: list[PlantedRule], masks_by_row: dict[str, np.ndarray], source: str) -> dict:
    """Recovery per rule and FDR for the features in `features_dir` (rows aligned to `out`'s build index)."""
    features = read_table(features_dir / "features.parquet")
    kept = features.filter(pc.field("kept")).to_pylist() if features.num_rows else []
    top = read_table(features_dir / "top_activations.parquet").filter(pc.field("split") == "train")
    any_rule = np.zeros(len(next(iter(masks_by_row.values()))), dtype=bool)
    for m in masks_by_row.values():
        any_rule |= m
    shares: dict[int, dict[str, float]] = {}
    for f in kept:
        rows = top.filter(pc.field("latent") == f["latent"])["row"].to_numpy()[: f["n_top"]]
        shares[f["latent"]] = {r.name: float(masks_by_row[r.name][rows].mean()) for r in rules}
        shares[f["latent"]]["_planted"] = float(any_rule[rows].mean())
    fires = _encode_latents(cfg, out, [f["latent"] for f in kept], source) if kept else np.zeros((0, 0), bool)
    per_rule = {}
    for r in rules:
        winner = "B" if r.delta > 0 else "A"
        best = {"recovered": False, "precision": 0.0, "recall": 0.0, "latent": None, "occurrences": int(masks_by_row[r.name].sum())}
        for j, f in enumerate(kept):
            share = shares[f["latent"]][r.name]
            right_sign = f["better_model"] == cfg.compare[0][0 if winner == "A" else 1]
            if right_sign and share > best["precision"]:
                recall = float(fires[masks_by_row[r.name], j].mean()) if masks_by_row[r.name].any() else 0.0
                best.update(precision=share, recall=recall, latent=f["latent"], recovered=share >= RECOVERED_SHARE)
        per_rule[r.name] = best
    spurious = sum(1 for f in kept if shares[f["latent"]]["_planted"] < SPURIOUS_SHARE)
    label_scores = [f.get("label_score") for f in kept if f.get("label_score") is not None]
    return {
        "kept": len(kept),
        "rules_recovered": sum(v["recovered"] for v in per_rule.values()),
        "rules": len(rules),
        "fdr": spurious / len(kept) if kept else 0.0,
        "spurious": spurious,
        "mean_label_score": float(np.mean(label_scores)) if label_scores else None,
        "per_rule": per_rule,
    }


def _link_inputs(src: Path, dst: Path) -> None:
    """An ablation dir shares the scored and embedded words of its parent run."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("documents.parquet", "ingest.json", "words", "logprobs", "embeddings"):
        target = dst / name
        if not target.exists():
            os.symlink((src / name).resolve(), target)


def ablation_variants(cfg: Config) -> dict[str, tuple[Path, Path, str]]:
    """Run the variants; returns name -> (run dir with the build, features dir, source)."""
    from bbox_sae.dataset import run_build
    from bbox_sae.features import run_features
    from bbox_sae.labeling import run_label
    from bbox_sae.sae import run_train

    variants: dict[str, tuple[Path, Path, str]] = {"full": (cfg.out, cfg.out, "sae")}
    w0 = cfg.model_copy(update={"output_dir": str(cfg.out / "ablation-w0"), "build": cfg.build.model_copy(update={"output_feature_weight": 0.0})})
    _link_inputs(cfg.out, w0.out)
    run_build(w0)
    run_train(w0)
    run_features(w0)
    run_label(w0)
    variants["no-performance (w=0)"] = (w0.out, w0.out, "sae")
    for baseline in ("random", "kmeans"):
        run_features(cfg, baseline=baseline)
        dest = cfg.out / "baselines" / baseline
        run_label(cfg.model_copy(update={"output_dir": str(dest)}))
        variants[f"{baseline} baseline"] = (cfg.out, dest, baseline)
    return variants


def run_planted(cfg: Config, rules_path: str | None = None) -> dict:
    """`bbox eval planted`: score A, plant B, run the pipeline, measure recovery, FDR and ablations."""
    from bbox_sae.dataset import run_build
    from bbox_sae.embedding import run_embed
    from bbox_sae.features import run_features
    from bbox_sae.labeling import run_label
    from bbox_sae.sae import run_train
    from bbox_sae.scoring.stage import ingest, run_score

    rules, noise_std, seed = load_rules(rules_path or Path(__file__).resolve().parents[1] / "configs" / "planted-rules.yaml")
    a_name, b_name = cfg.compare[0]
    b_model = cfg.model(b_name)
    if b_model.source != "parquet":
        raise ConfigError(f"eval planted: model '{b_name}' must be `source: parquet` (its log-probs are planted)")
    ingest(cfg)
    run_score(cfg, models=[a_name])
    words = read_table(cfg.out / "words")
    lp_a = read_table(cfg.out / "logprobs" / a_name)["logprob"].to_numpy(zero_copy_only=False)
    masks = rule_masks(words, rules)
    lp_b = planted_logprobs(np.nan_to_num(lp_a, nan=-30.0), masks, rules, noise_std, seed)
    b_path = Path(b_model.path).expanduser()
    b_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp_b}), b_path)
    run_score(cfg, models=[b_name])
    run_embed(cfg)
    run_build(cfg)
    run_train(cfg)
    run_features(cfg)
    run_label(cfg)

    results = {"rules": {r.name: {"delta": r.delta, "occurrences": int(masks[r.name].sum())} for r in rules}, "noise_std": noise_std, "variants": {}}
    for name, (run_dir, feat_dir, source) in ablation_variants(cfg).items():
        index = read_table(run_dir / "build" / "index.parquet", columns=["row", "doc_id", "word_idx"])
        position = {k: i for i, k in enumerate(zip(words["doc_id"].to_pylist(), words["word_idx"].to_pylist()))}
        at = np.array([position[k] for k in zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist())])
        masks_by_row = {r: m[at] for r, m in masks.items()}
        sub_cfg = cfg.model_copy(update={"output_dir": str(run_dir)})
        results["variants"][name] = score_recovery(sub_cfg, run_dir, feat_dir, rules, masks_by_row, source)
    atomic_write_json(cfg.out / "planted_results.json", results)
    print_planted(results)
    return results


def run_ablation(cfg: Config) -> dict:
    """`bbox eval ablation`: the ablation table on an existing run (no ground truth: kept counts and label scores)."""
    results = {}
    for name, (_, feat_dir, _) in ablation_variants(cfg).items():
        features = read_table(feat_dir / "features.parquet")
        kept = features.filter(pc.field("kept")).to_pylist() if features.num_rows else []
        scores = [f.get("label_score") for f in kept if f.get("label_score") is not None]
        results[name] = {
            "live_latent_rows": features.num_rows,
            "kept": len(kept),
            "mean_label_score": float(np.mean(scores)) if scores else None,
            "mean_abs_median_dlogp_kept": float(np.mean([abs(f["median_dlogp"]) for f in kept])) if kept else None,
        }
    atomic_write_json(cfg.out / "ablation_results.json", results)
    _print_table("Ablations", ["variant", "kept", "mean label score", "mean |median Δ| (kept)"],
                 [[n, r["kept"], _fmt(r["mean_label_score"]), _fmt(r["mean_abs_median_dlogp_kept"])] for n, r in results.items()])
    return results


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def _print_table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[str(x) for x in r])
    Console().print(table)


def print_planted(results: dict) -> None:
    full = results["variants"]["full"]
    _print_table(
        "Planted-difference recovery (full method)",
        ["rule", "planted Δ (B − A)", "occurrences", "recovered", "best precision", "recall", "latent"],
        [[n, results["rules"][n]["delta"], v["occurrences"], "yes" if v["recovered"] else "no", f"{v['precision']:.2f}", f"{v['recall']:.2f}", v["latent"]]
         for n, v in full["per_rule"].items()],
    )
    _print_table(
        "Ablations (same planted setup)",
        ["variant", "rules recovered", "FDR", "kept", "mean label score"],
        [[n, f"{v['rules_recovered']}/{v['rules']}", f"{v['fdr']:.2f}", v["kept"], _fmt(v["mean_label_score"])] for n, v in results["variants"].items()],
    )


def load_results(path: Path) -> dict:
    return json.loads(path.read_text())
