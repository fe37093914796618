"""GPU-box entry point: one SAE per combination of list-valued `sae.*` fields (same as `bbox sweep`).

    python train/sweep.py --config configs/sweep-dict-size.yaml [--wandb-sweep-yaml sweep.yaml]
"""

import argparse
import sys

from bbox_sae.errors import BBoxError
from bbox_sae.train.sweep import run_sweep


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", "-c", required=True)
    parser.add_argument("--output-dir", "-o")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--wandb-sweep-yaml", help="also write an equivalent W&B sweep spec here")
    args = parser.parse_args(argv)
    try:
        run_sweep(args.config, args.overrides, args.output_dir, wandb_sweep_yaml=args.wandb_sweep_yaml)
    except BBoxError as err:
        print(f"sweep: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
