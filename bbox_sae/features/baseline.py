"""The rule-search baseline: what the grammar alone confirms, without any SAE, and which of it the
findings cover.

Every rule the search proposes on train (`rule_search`) is tested exactly as the tool tests its
candidates, in a BH family of its own; passed rules whose held-out words nest are one distinct
difference (`findings.nested_groups`), said by its head (`group_head`) and made of the head's words. A difference is covered when a
finding of the same pair and winner holds at least half of its held-out words. Recorded in every
run (`rule_search.parquet`), so a reader sees by how much the findings beat the search a sceptical
reviewer would run first, and what the SAE added: findings no single rule states.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from bbox_sae.config import FeaturesConfig
from bbox_sae.features.candidates import Tested, candidate_stats, one_family
from bbox_sae.features.findings import rule_units, shared_count, states
from bbox_sae.features.rule_search import search_rules
from bbox_sae.features.rules import WordAttributes

BASELINE_SCHEMA = pa.schema(
    [
        ("difference", pa.int32()), ("model_a", pa.string()), ("model_b", pa.string()), ("better_model", pa.string()),
        ("statement", pa.string()), ("rules", pa.int32()), ("holdout_n", pa.int32()), ("holdout_median_dlogp", pa.float64()),
        ("q_value", pa.float64()), ("covered_by", pa.int32()),
    ]
)  # fmt: skip


def searched_candidates(tested: Sequence[Tested], attrs: WordAttributes, rows_by_split, lp_by_row, pairs, fcfg: FeaturesConfig) -> list[Tested]:
    """The rule search's candidates: those the run tested (`features.rule_search`), else searched here."""
    if fcfg.rule_search:
        return [t for t in tested if t.searched]
    out = []
    train, holdout = rows_by_split["train"], rows_by_split["holdout"]
    for a, b in pairs:
        for f in search_rules(attrs, train, holdout, lp_by_row[a], lp_by_row[b], fcfg.min_activations, fcfg.min_abs_median_dlogp, fcfg.min_abs_median_dp):
            t = Tested("rule", (a, b), f.sign, [], f.train_rows, f.holdout_rows, rule=f.rule, searched=True)
            t.stats = candidate_stats(t.train_rows, t.holdout_rows, lp_by_row[a], lp_by_row[b])
            out.append(t)
    return out


def baseline_differences(searched: Sequence[Tested], lp_by_row, fcfg: FeaturesConfig, seed: int, doc_by_row: np.ndarray | None = None) -> list[dict]:
    """The distinct differences the search confirms in its own BH family, each with its held-out
    words (`rows`), largest first."""
    outcome = one_family(searched, lp_by_row, fcfg, seed, doc_by_row)
    passed = [t for t, (_, ok) in zip(searched, outcome) if ok]
    q_of = {id(t): q for t, (q, _) in zip(searched, outcome)}
    out = []
    for g, h in rule_units(passed, lp_by_row, fcfg.finding_overlap):
        t, head = passed[g[0]], passed[h]
        # The head's words, as a finding's unit: a broader rule of the group ("'you'", where only
        # 'you' after a conjunction differs, its median carried by them) adds words where nothing differs.
        rows = head.holdout_rows
        a, b = t.pair
        out.append(
            {
                "model_a": a, "model_b": b, "better_model": a if t.sign > 0 else b, "statement": head.rule.describe(), "rules": len(g),
                "holdout_n": len(rows), "holdout_median_dlogp": float(np.median(lp_by_row[a][rows] - lp_by_row[b][rows])),
                "q_value": max(q_of[id(passed[i])] for i in g), "rows": rows,
            }
        )  # fmt: skip
    return sorted(out, key=lambda d: -d["holdout_n"])


def covering_finding(difference: dict, findings: Sequence[dict], holdout_words: dict[int, np.ndarray]) -> int | None:
    """The finding (same pair and winner) holding the most of the difference's held-out words, when
    it holds at least half of them."""
    best, best_shared = None, 0
    for f in findings:
        if (f["model_a"], f["model_b"], f["better_model"]) != (difference["model_a"], difference["model_b"], difference["better_model"]):
            continue
        shared = shared_count(difference["rows"], holdout_words[f["finding"]])
        if shared > best_shared:
            best, best_shared = f["finding"], shared
    return best if best_shared >= 0.5 * len(difference["rows"]) else None


def baseline_table(differences: list[dict], findings: Sequence[dict], holdout_words: dict[int, np.ndarray]) -> pa.Table:
    rows = [
        {**{k: v for k, v in d.items() if k != "rows"}, "difference": i, "covered_by": covering_finding(d, findings, holdout_words)}
        for i, d in enumerate(differences)
    ]
    return pa.Table.from_pylist(rows, schema=BASELINE_SCHEMA) if rows else BASELINE_SCHEMA.empty_table()


def single_rule_states(finding: dict, differences: list[dict], holdout_words: dict[int, np.ndarray]) -> bool:
    """Whether one distinct difference of the search says the finding: its words and the finding's
    mostly the same (`findings.states`). A finding no single rule states is what the SAE added."""
    words = holdout_words[finding["finding"]]
    return any(
        (d["model_a"], d["model_b"], d["better_model"]) == (finding["model_a"], finding["model_b"], finding["better_model"]) and states(d["rows"], words)
        for d in differences
    )
