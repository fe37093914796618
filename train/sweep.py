"""GPU-box entry point: `bbox sweep`, one SAE per combination of a sweep file's `sae.*` values.

python train/sweep.py --config configs/sweep-paper-dict-size.yaml [-o RUN_DIR] [--features] [--wandb-sweep-yaml sweep.yaml]

The sweep file names its base config (`base: configs/paper-olmo2-7b-vs-13b.yaml`), whose build must
be current; the run's config.yaml and tables are left as they are (bbox_sae/train/sweep_config.py).
"""

import sys

from bbox_sae.cli import main as bbox


def main(argv=None) -> int:
    return bbox(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
