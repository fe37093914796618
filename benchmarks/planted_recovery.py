"""Planted-difference recovery and the ablation table (same as `bbox eval planted`).

    .venv/bin/python benchmarks/planted_recovery.py [--config configs/planted-shakespeare.yaml] [--rules configs/planted-rules-shakespeare.yaml]

Needs the demo corpus (`make demo` prepares it). Prints the per-rule recovery table and the
ablations (full method, w=0, untrained SAE, k-means) and copies the numbers to
benchmarks/results/planted.json.
"""

import argparse
import shutil
import sys
from pathlib import Path

from bbox_sae.config import load_config, save_resolved
from bbox_sae.errors import BBoxError
from bbox_sae.evaluation import run_planted

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "planted-shakespeare.yaml"))
    parser.add_argument("--rules", default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        save_resolved(cfg)
        run_planted(cfg, rules_path=args.rules)
    except BBoxError as err:
        print(f"planted_recovery: error: {err}", file=sys.stderr)
        return 2
    (REPO / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    shutil.copy(cfg.paths.planted_results, REPO / "benchmarks" / "results" / "planted.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
