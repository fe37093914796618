"""GPU-box entry point: train one SAE from a config (same code path as `bbox train`).

    python train/train_sae.py --config configs/paper-olmo2-7b-vs-13b.yaml [--set sae.d_sae=10000] [--resume]

Extra `key=value` words (as `wandb agent` passes them) are treated as --set overrides.
"""

import argparse
import sys

import torch

from bbox_sae.config import load_config, save_resolved
from bbox_sae.errors import BBoxError
from bbox_sae.train.sae import run_train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", "-c", required=True)
    parser.add_argument("--output-dir", "-o")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--resume", action="store_true")
    args, extra = parser.parse_known_args(argv)
    overrides = args.overrides + [e.lstrip("-") for e in extra if "=" in e]
    try:
        cfg = load_config(args.config, overrides, args.output_dir)
        save_resolved(cfg)
        device = "cuda (" + torch.cuda.get_device_name(0) + ")" if torch.cuda.is_available() else "cpu"
        print(f"device: {device}; threads: {torch.get_num_threads()}")
        metrics = run_train(cfg, resume=args.resume)
    except BBoxError as err:
        print(f"train_sae: error: {err}", file=sys.stderr)
        return 2
    print(f"throughput: {metrics['rows_per_s']} rows/s over {metrics['rows_trained']} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
