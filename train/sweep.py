"""GPU-box entry point: `bbox sweep`, one SAE per combination of list-valued `sae.*` fields.

python train/sweep.py --config configs/sweep-dict-size.yaml [--wandb-sweep-yaml sweep.yaml]
"""

import sys

from bbox_sae.cli import main as bbox


def main(argv=None) -> int:
    return bbox(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
