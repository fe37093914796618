"""Findings against the rule search, and across SAE seeds.

For each feature-table folder (a run's output dir, or a sweep run's `sae/<run_name>/features/`):
how many findings, how many distinct differences the rule search confirms (`rule_search.parquet`),
how many of those a finding covers, and how many findings no single rule states (the SAE's
contribution). For every pair of folders (e.g. the same build with SAE seeds 0, 1, 2): the share
of one's findings that the other has too, with the same winner and held-out words overlapping by
at least half of the smaller set.

    python benchmarks/findings_vs_search.py runs/demo runs/demo/sae/seed1/features runs/demo/sae/seed2/features

Prints a table and writes benchmarks/results/findings_vs_search.json.
"""

from __future__ import annotations

import argparse
import json
from itertools import permutations
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from _common import RESULTS, print_table


def load(folder: Path) -> dict:
    findings = pq.read_table(folder / "findings.parquet").to_pylist()
    words = pq.read_table(folder / "finding_words.parquet").to_pandas()
    held = words[words["split"] == "holdout"]
    rows = {int(f): np.sort(g["row"].to_numpy()) for f, g in held.groupby("finding")}
    search = pq.read_table(folder / "rule_search.parquet").to_pylist()
    return {"findings": findings, "rows": rows, "search": search}


def same_finding(a: dict, rows_a: np.ndarray, b: dict, rows_b: np.ndarray) -> bool:
    if (a["model_a"], a["model_b"], a["better_model"]) != (b["model_a"], b["model_b"], b["better_model"]):
        return False
    shared = len(np.intersect1d(rows_a, rows_b, assume_unique=True))
    return shared >= 0.5 * min(len(rows_a), len(rows_b)) and shared > 0


def shared_share(x: dict, y: dict) -> float:
    """Share of x's findings that y has too."""
    if not x["findings"]:
        return 1.0
    hits = sum(any(same_finding(f, x["rows"][f["finding"]], g, y["rows"][g["finding"]]) for g in y["findings"]) for f in x["findings"])
    return hits / len(x["findings"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    runs = {str(f): load(f) for f in args.folders}
    rows, out = [], {"runs": {}, "pairs": {}}
    for name, r in runs.items():
        covered = sum(d["covered_by"] is not None for d in r["search"])
        beyond = sum(1 for f in r["findings"] if f.get("single_rule") is False)
        searched = sum(1 for f in r["findings"] if "rule search" in (f.get("proposer") or ""))
        n = len(r["search"])
        out["runs"][name] = {
            "findings": len(r["findings"]),
            "search_differences": n,
            "covered": covered,
            "beyond_single_rules": beyond,
            "found_by_search": searched,
        }
        rows.append([name, len(r["findings"]), n, covered, f"{covered / n:.0%}" if n else "-", searched, beyond])
    print_table(
        "findings against the rule search",
        ["folder", "findings", "search differences", "covered", "coverage", "search proposed", "no single rule states"],
        rows,
    )
    if len(runs) > 1:
        pair_rows = []
        for x, y in permutations(runs, 2):
            share = shared_share(runs[x], runs[y])
            out["pairs"][f"{x} -> {y}"] = share
            pair_rows.append([x, y, f"{share:.0%}"])
        print_table("findings shared across folders (same winner, held-out words overlapping by half)", ["findings of", "found again in", "share"], pair_rows)
    path = RESULTS / "findings_vs_search.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"\n{path}")


if __name__ == "__main__":
    main()
