"""Whether each finding's statement is true of the held-out words it covers, for finished runs.

    python benchmarks/statement_truth.py runs/demo runs/demo/sae/seed1/features runs/planted/...

Reads each run's `findings.parquet` and `finding_words.parquet` and the corpus's `words/`, and
applies each statement's own definition with `bbox_sae.evaluation.statement_truth` (code of its
own, not the features stage's). Prints one row per finding and, per run, how many findings are
true of at least 95% of their words; `--json PATH` writes the same.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bbox_sae.evaluation.statement_truth import statement_truth

BOUND = 0.95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run output folders (or a sweep run's features/ folder)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    results = {}
    for run in args.runs:
        rows = statement_truth(run)
        results[run] = [dict(r.__dict__, share=r.share) for r in rows]
        print(f"\n{run}: {sum(r.share >= BOUND for r in rows)} of {len(rows)} statements true of >= {BOUND:.0%} of their held-out words")
        print(f"{'finding':>7} {'n':>5} {'true':>6}  statement")
        for r in rows:
            print(f"{r.finding:>7} {r.holdout_n:>5} {r.share:>6.2f}  {r.statement[:110]}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
