"""Evidence: planted-difference recovery, the null pair, and ablations.

Planted recovery builds a ground truth the paper lacks. Model A is a real LM; model B's
per-word log-probs are A's plus small noise everywhere, plus a planted Δ on the words that a
set of rules matches (`configs/planted-rules-*.yaml`). Rules are causal (the word and its left
context only), since a causal LM cannot condition on the next word. A and B differ only there,
so a kept finding should be made of one rule's words, with the right winner; any other kept
finding is a false discovery.

- A rule is **recovered** when some kept finding's top words are >= 80% that rule's words and
  its better model is the one the planted Δ favours. Per rule: the best precision (share of a
  finding's top words from the rule), that finding's recall (share of the rule's *holdout* words
  on which one of its latents fires) and `splits` (right-signed findings whose top words are at
  least half that rule).
- **FDR**: share of kept findings whose top words are < 50% planted (any rule).
- **Null pair**: B = A + N(0, noise) with nothing planted, several seeds; every kept finding
  is false, so the count should be 0.

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
import regex
import yaml

from bbox_sae.artifacts import atomic_write_json, read_table
from bbox_sae.config import Config, save_resolved
from bbox_sae.errors import ConfigError
from bbox_sae.labeling.table import labeled_features
from bbox_sae.layout import RunLayout

log = logging.getLogger(__name__)

RECOVERED_SHARE = 0.8
SPURIOUS_SHARE = 0.5


@dataclass(frozen=True)
class PlantedRule:
    """A word matches when every given regex matches: `word` on the stripped word, `prev` on the raw
    previous word ("" at a document start), `left` on the previous `left_words` words joined.
    Only the word and its left context: a causal LM's prediction cannot depend on what follows."""

    name: str
    delta: float
    kind: str = ""
    word: str | None = None
    prev: str | None = None
    left: str | None = None
    left_words: int = 3

    def matches(self, words: list[str]) -> np.ndarray:
        n = len(words)
        hit = np.ones(n, dtype=bool)
        checks = [(self.word, lambda i: words[i].strip()), (self.prev, lambda i: words[i - 1] if i else "")]
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
        if isinstance(r, dict) and "next" in r:
            raise ConfigError(f"{path}: rules[{i}]: `next` conditions on the following word, which a causal LM cannot see; use `word`, `prev` or `left`")
        try:
            rule = PlantedRule(**r)
            for pattern in (rule.word, rule.prev, rule.left):
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


def _rows_to_words(words: pa.Table, run_dir: Path) -> np.ndarray:
    """Position in `words` of every row of the build index in `run_dir`."""
    index = read_table(RunLayout(run_dir).index, columns=["row", "doc_id", "word_idx"])
    position = {k: i for i, k in enumerate(zip(words["doc_id"].to_pylist(), words["word_idx"].to_pylist()))}
    return np.array([position[k] for k in zip(index["doc_id"].to_pylist(), index["word_idx"].to_pylist())], dtype=np.int64)


def _firing(cfg: Config, latents: list[int], source: str) -> tuple[np.ndarray, np.ndarray]:
    """Where each latent fires (the features stage's ranking encoder) over every row, and the holdout mask."""
    from bbox_sae.features import firing, make_encoder, open_rows

    m = open_rows(cfg)
    encode, _ = make_encoder(cfg, source, m.values, m.rows_by_split["train"], m.info)
    split = m.index["split"].to_numpy(zero_copy_only=False)
    return firing(encode, m.values, latents, cfg.features.chunk_rows), split == "holdout"


def score_recovery(cfg: Config, features_dir: Path, rules: list[PlantedRule], masks_by_row: dict[str, np.ndarray], source: str) -> dict:
    """Recovery per rule and FDR for the findings in `features_dir` (rows aligned to `cfg.out`'s build index)."""
    from bbox_sae.labeling.finding_statements import labeled_findings

    tables = RunLayout(features_dir)
    findings = labeled_findings(tables)
    features = labeled_features(tables)
    n_top = dict(zip(features["latent"].to_pylist(), features["n_top"].to_pylist()))
    detection = {latent: score for latent, score in zip(features["latent"].to_pylist(), features["label_score"].to_pylist()) if score is not None}
    top = read_table(tables.top_activations).filter(pc.field("split") == "train")
    top_rows_of = {}
    for latent, group in _group_rows(top).items():
        top_rows_of[latent] = group[: n_top.get(latent, 0)]
    any_rule = np.zeros(len(next(iter(masks_by_row.values()))), dtype=bool)
    for m in masks_by_row.values():
        any_rule |= m
    members = [[int(x) for x in f["latents"].split(",")] for f in findings]
    latents = sorted({m for ms in members for m in ms})
    fires, holdout = _firing(cfg, latents, source) if latents else (np.zeros((len(any_rule), 0), bool), np.zeros(len(any_rule), bool))
    column = {latent: j for j, latent in enumerate(latents)}
    # A rule-tested finding's words are every held-out word it was tested on (finding_words.parquet).
    by_rule = cfg.features.test == "rule"
    tested_words = read_table(tables.finding_words).filter(pc.field("split") == "holdout") if by_rule else None
    words_of = []
    for f, ms in zip(findings, members):
        if by_rule:
            words_of.append(tested_words.filter(pc.field("finding") == f["finding"])["row"].to_numpy())
        else:
            words_of.append(np.unique(np.concatenate([top_rows_of[m] for m in ms])))
    shares = []
    for rows in words_of:
        share = {r.name: float(masks_by_row[r.name][rows].mean()) for r in rules}
        share["_planted"] = float(any_rule[rows].mean())
        shares.append(share)
    per_rule = {}
    for r in rules:
        winner = cfg.compare[0][1] if r.delta > 0 else cfg.compare[0][0]
        rule_holdout = masks_by_row[r.name] & holdout
        best = {"recovered": False, "precision": 0.0, "recall": 0.0, "finding": None, "splits": 0,
                "occurrences": int(masks_by_row[r.name].sum()), "train_occurrences": int((masks_by_row[r.name] & ~holdout).sum())}
        for f, ms, share in zip(findings, members, shares):
            if f["better_model"] != winner:
                continue
            best["splits"] += share[r.name] >= SPURIOUS_SHARE
            if share[r.name] > best["precision"]:
                if by_rule:
                    recall = float(np.isin(np.flatnonzero(rule_holdout), words_of[findings.index(f)]).mean()) if rule_holdout.any() else 0.0
                else:
                    recall = float(fires[np.ix_(rule_holdout, [column[m] for m in ms])].any(axis=1).mean()) if rule_holdout.any() else 0.0
                scores = [detection[m] for m in ms if m in detection]
                best.update(precision=share[r.name], recall=recall, finding=f["finding"], recovered=share[r.name] >= RECOVERED_SHARE,
                            label=f["statement"], kind=f.get("kind"), statement_source=f.get("statement_source"),
                            # The finding's own statement, judged on its held-out words; `test: top` has
                            # no statement of its own: the median of its latents' label detections.
                            detection=f["detection"] if by_rule else float(np.median(scores)) if scores else None)
        per_rule[r.name] = best
    spurious = [f["finding"] for f, share in zip(findings, shares) if share["_planted"] < SPURIOUS_SHARE]
    recovered = [v for v in per_rule.values() if v["recovered"]]
    return {
        "kept_findings": len(findings),
        "kept_latents": sum(len(ms) for ms in members),
        "rules_recovered": len(recovered),
        "rules": len(rules),
        "mean_recall": float(np.mean([v["recall"] for v in per_rule.values()])),
        "max_splits": max((v["splits"] for v in per_rule.values()), default=0),
        "fdr": len(spurious) / len(findings) if findings else 0.0,
        "spurious": len(spurious),
        "spurious_findings": [{"finding": f["finding"], "statement": f["statement"], "top_words": f["top_words"], "median_dlogp": f["median_dlogp"]}
                              for f in findings if f["finding"] in spurious],
        "per_rule": per_rule,
    }


def _row_attributes(cfg: Config):
    """Rule attributes of every row of `cfg.out`'s build index."""
    from bbox_sae.build.matrix import open_matrix
    from bbox_sae.features import word_attributes_by_position, words_by_row

    _, index, _ = open_matrix(cfg)
    _, position = words_by_row(cfg, index)
    return word_attributes_by_position(cfg).take(position)


def _group_rows(top: pa.Table) -> dict[int, np.ndarray]:
    """latent -> its top rows in rank order."""
    t = top.sort_by([("latent", "ascending"), ("rank", "ascending")])
    latents, rows = t["latent"].to_numpy(), t["row"].to_numpy()
    bounds = np.flatnonzero(np.r_[True, latents[1:] != latents[:-1], True])
    return {int(latents[s]): rows[s:e] for s, e in zip(bounds[:-1], bounds[1:])}


def _link_inputs(src: Path, dst: Path, logprobs: list[str] | None = None) -> None:
    """A variant dir shares the scored and embedded words of its parent run (all models' log-probs,
    or only `logprobs`' when the others are written anew)."""
    dst.mkdir(parents=True, exist_ok=True)

    def shared(paths: RunLayout) -> list[Path]:
        inputs = [paths.documents, paths.ingest_marker, paths.words, paths.embeddings]
        return inputs + ([paths.logprobs_root] if logprobs is None else [paths.logprobs(m) for m in logprobs])

    for source, target in zip(shared(RunLayout(src)), shared(RunLayout(dst))):
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.symlink(source.resolve(), target)


def ablation_variants(cfg: Config) -> dict[str, tuple[Path, Path, str]]:
    """Run the variants; returns name -> (run dir with the build, features dir, source)."""
    from bbox_sae.build.matrix import run_build
    from bbox_sae.features import run_features
    from bbox_sae.labeling import run_label
    from bbox_sae.train.sae import run_train

    variants: dict[str, tuple[Path, Path, str]] = {"full": (cfg.out, cfg.out, "sae")}
    w0 = cfg.model_copy(update={"output_dir": str(cfg.paths.ablation_w0.root), "build": cfg.build.model_copy(update={"output_feature_weight": 0.0})})
    _link_inputs(cfg.out, w0.out)
    run_build(w0)
    run_train(w0)
    run_features(w0)
    run_label(w0)
    variants["no-performance (w=0)"] = (w0.out, w0.out, "sae")
    for baseline in ("random", "kmeans"):
        run_features(cfg, baseline=baseline)
        run_label(cfg, baseline=baseline)
        variants[f"{baseline} baseline"] = (cfg.out, cfg.paths.baseline(baseline).root, baseline)
    return variants


def _reading_b_from(cfg: Config, path: Path) -> Config:
    """`cfg` with model B's log-probs read from `path`, a file of the evaluation's own."""
    b_name = cfg.compare[0][1]
    return cfg.model_copy(update={"models": [m.model_copy(update={"path": str(path)}) if m.name == b_name else m for m in cfg.models]})


def _plant(cfg: Config, lp_b: np.ndarray, words: pa.Table) -> None:
    """Write model B's per-word log-probs and import them (anew: the file is rewritten in place).
    `cfg` reads B from a file inside its output dir (`_reading_b_from`), never from the user's own."""
    import shutil

    from bbox_sae.artifacts import atomic_write_table
    from bbox_sae.scoring.stage import run_score

    b_model = cfg.model(cfg.compare[0][1])
    atomic_write_table(b_model.path, pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": lp_b}))
    shutil.rmtree(cfg.paths.logprobs(b_model.name), ignore_errors=True)
    run_score(cfg, models=[b_model.name])


def check_planted_config(cfg: Config) -> None:
    """Before the evaluation writes anything: it replaces model B's log-probs and every result in
    its output dir, so that dir must not hold a run of the user's own."""
    b_name = cfg.compare[0][1]
    if cfg.model(b_name).source != "parquet":
        raise ConfigError(f"eval: model '{b_name}' must be `source: parquet` (its log-probs are planted)")
    from bbox_sae.stages import read_manifest

    if read_manifest(cfg.out)["stages"]:
        raise ConfigError(
            f"output_dir {cfg.out}: holds a `bbox run` (manifest.json records its stages), whose log-probs of model '{b_name}' and "
            "findings `bbox eval planted` would replace with planted ones; give the evaluation an output dir of its own (-o)"
        )


def _score_a(cfg: Config) -> tuple[pa.Table, np.ndarray]:
    """Words and model A's log-probs (scored once, then cached), embeddings too."""
    from bbox_sae.embedding.stage import run_embed
    from bbox_sae.corpus.ingest import ingest
    from bbox_sae.scoring.stage import run_score

    ingest(cfg)
    run_score(cfg, models=[cfg.compare[0][0]])
    run_embed(cfg)
    words = read_table(cfg.paths.words)
    lp_a = read_table(cfg.paths.logprobs(cfg.compare[0][0]))["logprob"].to_numpy(zero_copy_only=False)
    return words, np.nan_to_num(lp_a, nan=-30.0)


def _extract(cfg: Config) -> None:
    from bbox_sae.build.matrix import run_build
    from bbox_sae.features import run_features
    from bbox_sae.labeling import run_label
    from bbox_sae.train.sae import run_train

    run_build(cfg)
    run_train(cfg)
    run_features(cfg)
    run_label(cfg)


def null_run(cfg: Config, words: pa.Table, lp_a: np.ndarray, noise_std: float, seed: int) -> dict:
    """B = A + N(0, noise_std) with nothing planted, SAE seed `seed`; every kept finding is false."""
    out = cfg.paths.null_seed(seed).root
    sub = _reading_b_from(cfg, cfg.paths.null_logprobs(seed)).model_copy(update={"output_dir": str(out), "sae": cfg.sae.model_copy(update={"seed": seed})})
    _link_inputs(cfg.out, out, logprobs=[cfg.compare[0][0]])
    save_resolved(sub)
    rng = np.random.default_rng(1000 + seed)
    _plant(sub, np.minimum(lp_a + rng.normal(0.0, noise_std, size=len(lp_a)), 0.0), words)
    _extract(sub)
    findings = read_table(sub.paths.findings).to_pylist()
    return {"seed": seed, "kept_findings": len(findings),
            "findings": [{"statement": f["statement"], "kind": f["kind"], "top_words": f["top_words"], "median_dlogp": f["median_dlogp"]} for f in findings]}


def planted_rules_path(cfg: Config, override: str | None) -> Path:
    """--rules, else the config's `planted_rules`, else the Shakespeare rules shipped in configs/."""
    return Path(override or cfg.planted_rules or Path(__file__).resolve().parents[2] / "configs" / "planted-rules-shakespeare.yaml")


def run_planted(cfg: Config, rules_path: str | None = None, null_seeds: tuple[int, ...] = (0, 1, 2), ablations: bool = False) -> dict:
    """`bbox eval planted`: score A, plant B, run the pipeline, measure recovery and FDR; then the
    null pair for each seed in `null_seeds`, and (optionally) the ablations."""
    check_planted_config(cfg)
    rules, noise_std, seed = load_rules(planted_rules_path(cfg, rules_path))
    # B's configured `path` may be the user's own file: the planted log-probs go to one of ours,
    # and the saved config says so (a later `bbox run` on this dir reads what was evaluated).
    cfg = _reading_b_from(cfg, cfg.paths.planted_logprobs)
    save_resolved(cfg)
    words, lp_a = _score_a(cfg)
    masks = rule_masks(words, rules)
    _plant(cfg, planted_logprobs(lp_a, masks, rules, noise_std, seed), words)
    _extract(cfg)

    results = {"rules": {r.name: {"kind": r.kind, "delta": r.delta, "occurrences": int(masks[r.name].sum()),
                                  "frequency": float(masks[r.name].mean())} for r in rules},
               "noise_std": noise_std, "words": words.num_rows, "variants": {}}
    variants = ablation_variants(cfg) if ablations else {"full": (cfg.out, cfg.out, "sae")}
    for name, (run_dir, feat_dir, source) in variants.items():
        at = _rows_to_words(words, run_dir)
        masks_by_row = {r: m[at] for r, m in masks.items()}
        results["variants"][name] = score_recovery(cfg.model_copy(update={"output_dir": str(run_dir)}), feat_dir, rules, masks_by_row, source)
    results["null"] = [null_run(cfg, words, lp_a, noise_std, s) for s in null_seeds]
    atomic_write_json(cfg.paths.planted_results, results)
    print_planted(results)
    return results


def run_ablation(cfg: Config) -> dict:
    """`bbox eval ablation`: the ablation table on an existing run (no ground truth: kept counts and label scores)."""
    results = {}
    for name, (_, feat_dir, _) in ablation_variants(cfg).items():
        features = labeled_features(RunLayout(feat_dir))
        kept = features.filter(pc.field("kept")).to_pylist() if features.num_rows else []
        scores = [f.get("label_score") for f in kept if f.get("label_score") is not None]
        results[name] = {
            "live_latent_rows": features.num_rows,
            "kept": len(kept),
            "mean_label_score": float(np.mean(scores)) if scores else None,
            "mean_abs_median_dlogp_kept": float(np.mean([abs(f["median_dlogp"]) for f in kept])) if kept else None,
        }
    atomic_write_json(cfg.paths.ablation_results, results)
    _print_table("Ablations", ["variant", "kept", "mean label score", "mean |median Δ| (kept)"],
                 [[n, r["kept"], _fmt(r["mean_label_score"]), _fmt(r["mean_abs_median_dlogp_kept"])] for n, r in results.items()])
    return results


def coherence_summary(features: pa.Table, findings: pa.Table) -> dict:
    """Label-free and label-based coherence of a run's kept latents and findings."""
    kept = features.filter(pc.field("kept")).to_pylist() if features.num_rows else []
    rule_f1 = [f["rule_f1"] for f in kept if f.get("rule_f1") is not None]
    scores = [f["label_score"] for f in kept if f.get("label_score") is not None]
    return {
        "kept_latents": len(kept),
        "findings": findings.num_rows,
        "median_rule_f1": float(np.median(rule_f1)) if rule_f1 else None,
        "share_rule_f1_at_least_0.5": float(np.mean(np.array(rule_f1) >= 0.5)) if rule_f1 else None,
        "median_label_score": float(np.median(scores)) if scores else None,
        "share_label_score_at_least_0.75": float(np.mean(np.array(scores) >= 0.75)) if scores else None,
        "mixture_labels": sum(1 for f in kept if (f.get("label") or "").startswith("mixed words")),
        # Latents that also fire on forms outside their findings' rules (said in the label).
        "broader_than_finding": sum(1 for f in kept if f.get("label_source") == "rule" and f.get("label_coherent") is False),
    }


def run_coherence(cfg: Config) -> dict:
    """`bbox eval coherence`: how nameable a finished run's findings are (no ground truth needed)."""
    summary = coherence_summary(labeled_features(cfg.paths), read_table(cfg.paths.findings))
    atomic_write_json(cfg.paths.coherence, summary)
    _print_table("Coherence of kept latents", ["measure", "value"], [[k, _fmt(v)] for k, v in summary.items()])
    return summary


def _finding_rows(run_dir: Path) -> list[tuple[str, str | None, set[tuple[str, int]]]]:
    """Per finding of a run: its winner, its rule, and its train top words as (doc_id, word_idx)."""
    tables = RunLayout(run_dir)
    findings = read_table(tables.findings).to_pylist()
    features = read_table(tables.features)
    n_top = dict(zip(features["latent"].to_pylist(), features["n_top"].to_pylist()))
    top = read_table(tables.top_activations).filter(pc.field("split") == "train")
    keys = list(zip(top["doc_id"].to_pylist(), top["word_idx"].to_pylist()))
    by_latent: dict[int, list] = {}
    for latent, rank, key in zip(top["latent"].to_pylist(), top["rank"].to_pylist(), keys):
        by_latent.setdefault(latent, []).append((rank, key))
    out = []
    for f in findings:
        words = set()
        for m in (int(x) for x in f["latents"].split(",")):
            words |= {k for _, k in sorted(by_latent.get(m, []))[: n_top.get(m, 0)]}
        out.append((f["better_model"], f["statement"], words))
    return out


def stability(run_dirs: list[Path], min_overlap: float = 0.3) -> dict:
    """Share of the first run's findings that reappear in at least half of the other runs (other SAE
    seeds): same winner and the same rule, or top words overlapping (Jaccard) by `min_overlap`."""
    runs = [_finding_rows(d) for d in run_dirs]
    first, others = runs[0], runs[1:]

    def found(f, run) -> bool:
        return any(g[0] == f[0] and ((f[1] and f[1] == g[1]) or len(f[2] & g[2]) / max(len(f[2] | g[2]), 1) >= min_overlap) for g in run)

    stable = [sum(found(f, run) for run in others) >= max(1, len(others) / 2) for f in first]
    return {"findings": len(first), "stable": int(sum(stable)), "stable_share": float(np.mean(stable)) if stable else None,
            "findings_per_seed": [len(r) for r in runs]}


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
        f"Planted-difference recovery ({results['words']} words)",
        ["rule", "kind", "planted Δ (B − A)", "frequency", "train occurrences", "recovered", "precision", "recall", "detection", "splits", "finding", "statement (kind)"],
        [[n, results["rules"][n]["kind"], results["rules"][n]["delta"], f"{100 * results['rules'][n]['frequency']:.2f}%", v["train_occurrences"],
          "yes" if v["recovered"] else "no", f"{v['precision']:.2f}", f"{v['recall']:.2f}", _fmt(v.get("detection")), v["splits"], _fmt(v["finding"]),
          f"{v['label']} ({v.get('kind')})" if v.get("label") else "-"]
         for n, v in full["per_rule"].items()],
    )
    _print_table(
        "Summary",
        ["variant", "rules recovered", "mean recall", "FDR", "kept findings", "kept latents", "max splits"],
        [[n, f"{v['rules_recovered']}/{v['rules']}", f"{v['mean_recall']:.2f}", f"{v['fdr']:.2f}", v["kept_findings"], v["kept_latents"], v["max_splits"]]
         for n, v in results["variants"].items()],
    )
    if results.get("null"):
        _print_table("Null pair (B = A + noise, nothing planted)", ["seed", "kept findings", "what"],
                     [[r["seed"], r["kept_findings"], "; ".join((f["statement"] or f["top_words"] or "")[:40] for f in r["findings"][:3])] for r in results["null"]])


def load_results(path: Path) -> dict:
    return json.loads(path.read_text())
