"""`python -m bbox_sae.prepare CONFIG`: convert the GGUF models a config names into its model cache.

A GGUF is dequantized into a plain Hugging Face model once, on first use (`models.convert_gguf`);
for the demo's two models that is about 70 s on two cores (benchmarks/RESULTS.md). `make setup`
runs this on configs/demo.yaml so that a user's first `make demo` starts scoring at once. Models
of other sources need nothing prepared and are skipped.
"""

from __future__ import annotations

import sys

from bbox_sae.config import load_config
from bbox_sae.errors import BBoxError
from bbox_sae.models import causal_lm_location


def prepare_models(config_path: str) -> list[str]:
    """The converted model dirs, one per GGUF model of the config, in its order."""
    cfg = load_config(config_path)
    return [causal_lm_location(m.source, m.path, m.package, m.file, cfg.cache) for m in cfg.models if m.source == "gguf"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bbox_sae.prepare CONFIG", file=sys.stderr)
        return 2
    try:
        for location in prepare_models(args[0]):
            print(f"ready: {location}")
    except BBoxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
