"""How a latent's held-out word set is best chosen, measured against planted truth (docs/findings.md).

    .venv/bin/python benchmarks/latent_set_methods.py runs/planted-shakespeare   # after `bbox eval planted`

For every latent whose train top words show a difference, and every planted rule the latent's
carrying words (fires, winner ahead by more than 1 nat) are mostly made of, the precision and
recall against that rule on held-out words of three ways to choose the held-out set without any
held-out Δ: a logistic probe of the carrying words on context embeddings (`probe`), the same per
context group of the carrying words (`group probe`), and the word forms of each context group
(`group forms`, what `features.latent_sets` does). Prints one table and writes it as JSON next to
the run (`latent_set_methods.json`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _probe(context: np.ndarray, positives: np.ndarray, train: np.ndarray, seed: int) -> np.ndarray:
    """(rows,) bool: rows a logistic probe of `positives` against the other train words selects, cut
    where it best reproduces them on train."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    negatives = np.setdiff1d(train, positives, assume_unique=True)
    negatives = rng.choice(negatives, size=min(len(negatives), 20000), replace=False)
    rows = np.sort(np.concatenate([positives, negatives]))
    model = LogisticRegression(C=1.0, class_weight="balanced", max_iter=500).fit(np.asarray(context[rows], dtype=np.float32), np.isin(rows, positives))
    scores = np.concatenate([model.decision_function(np.asarray(context[s : s + 65536], dtype=np.float32)) for s in range(0, len(context), 65536)])
    order = np.argsort(-scores[train])
    hits = np.cumsum(np.isin(train[order], positives))
    f1 = 2 * hits / (np.arange(1, len(order) + 1) + len(positives))
    return scores > scores[train][order][int(np.argmax(f1))] - 1e-9


def measure(run: Path) -> list[dict]:
    from bbox_sae.artifacts import read_table
    from bbox_sae.config import load_config
    from bbox_sae.evaluation import load_rules, rows_to_words, rule_masks
    from bbox_sae.features import firing, make_encoder, open_rows, top_activations, top_words, word_attributes_by_position, words_by_row
    from bbox_sae.features.latent_sets import carrying_rows, context_groups, form_wins, group_forms
    from bbox_sae.features.word_sets import describe_word_set, shared_left
    from bbox_sae.layout import logprob_column

    cfg = load_config(run / "config.yaml", output_dir=str(run))
    rules, _, _ = load_rules(cfg.planted_rules)
    m = open_rows(cfg)
    words = read_table(cfg.paths.words)
    at = rows_to_words(words, cfg.out)
    truth = {name: mask[at] for name, mask in rule_masks(words, rules).items()}
    encode, d_sae = make_encoder(cfg, "sae", m.values, m.rows_by_split["train"], m.info)
    top = top_activations(encode, m.values, m.rows_by_split, d_sae, cfg.features.top_n, cfg.features.chunk_rows)
    train, holdout = m.rows_by_split["train"], m.rows_by_split["holdout"]
    a, b = cfg.compare[0]
    dlogp = m.index[logprob_column(a)].to_numpy() - m.index[logprob_column(b)].to_numpy()
    _, position = words_by_row(cfg, m.index)
    attrs = word_attributes_by_position(cfg).take(position)
    context = m.values[:, : m.info["d_embedding"]]
    is_holdout = np.zeros(len(dlogp), dtype=bool)
    is_holdout[holdout] = True
    proposals = [
        (latent, sign)
        for latent in range(d_sae)
        for sign in (1, -1)
        if len(t := top_words(top, "train", latent)) >= cfg.features.min_activations and np.median(sign * dlogp[t]) > 1.0
    ]
    fires = firing(encode, m.values, [latent for latent, _ in proposals], cfg.features.chunk_rows)
    rows = []

    def score(method: str, latent: int, chosen: np.ndarray) -> None:
        held = chosen & is_holdout
        if not held.any():
            return
        name = max(truth, key=lambda n: truth[n][held].mean())
        rows.append(
            {
                "method": method,
                "latent": latent,
                "rule": name,
                "precision": float(truth[name][held].mean()),
                "recall": float((held & truth[name]).sum() / max((truth[name] & is_holdout).sum(), 1)),
                "held_out_words": int(held.sum()),
            }
        )

    for j, (latent, sign) in enumerate(proposals):
        carrying = carrying_rows(fires[:, j], train, dlogp, sign, 1.0)
        if len(carrying) < 10:
            continue
        score("probe", latent, _probe(context, carrying, train, latent))
        groups = context_groups(context, carrying, latent)
        for g in np.unique(groups):
            members = carrying[groups == g]
            if len(members) < 10:
                continue
            score("group probe", latent, _probe(context, members, train, latent))
            left = shared_left(attrs, members)
            scope = train if left is None else train[left.mask(attrs, train)]
            kept = group_forms(attrs, members, *form_wins(attrs, scope, dlogp, sign, 1.0))
            if len(kept) >= cfg.features.min_activations:
                score("group forms", latent, describe_word_set(attrs, kept).mask(attrs, np.arange(len(dlogp))))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a `bbox eval planted` output dir")
    parser.add_argument("--min-precision", type=float, default=0.5, help="list sets at least this much one planted rule")
    args = parser.parse_args(argv)
    rows = measure(args.run)
    (args.run / "latent_set_methods.json").write_text(json.dumps(rows, indent=1))
    print("| planted rule | method | sets | precision (range) | recall (range) |\n|---|---|---|---|---|")
    for name in sorted({r["rule"] for r in rows}):
        for method in ("probe", "group probe", "group forms"):
            mine = [r for r in rows if r["rule"] == name and r["method"] == method and r["precision"] >= args.min_precision]
            if mine:
                p, r = [x["precision"] for x in mine], [x["recall"] for x in mine]
                print(f"| {name} | {method} | {len(mine)} | {min(p):.2f}-{max(p):.2f} | {min(r):.2f}-{max(r):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
