"""GPU-box entry point: `bbox train` (same options, same code path, recorded in the run's manifest).

    python train/train_sae.py --config configs/paper-olmo2-7b-vs-13b.yaml [--set sae.d_sae=10000] [--resume]

Extra `key=value` words (as `wandb agent` passes them, `--key=value` too) are treated as --set overrides.
"""

import sys

from bbox_sae.cli import build_parser
from bbox_sae.cli import main as bbox


def main(argv=None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    _, unknown = build_parser().parse_known_args(["train", *words])
    for word in unknown:
        if "=" in word:
            words.remove(word)
            words += ["--set", word.lstrip("-")]
    return bbox(["train", *words])


if __name__ == "__main__":
    raise SystemExit(main())
