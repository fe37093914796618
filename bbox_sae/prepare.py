"""`python -m bbox_sae.prepare CONFIG`: convert the GGUF models a config names into its model cache.

A GGUF is dequantized into a plain Hugging Face model once, on first use (`models.convert_gguf`);
`make setup` runs this on configs/demo.yaml so that a user's first `make demo` starts scoring at
once. The models convert side by side, one process per core: a conversion is mostly one thread
(parsing the GGUF, building the tokenizer), so one at a time left a core idle (the demo's two:
80 s in turn when each parsed its GGUF three times, 31 s side by side now; RESULTS.md, issue 58).
Models of other sources need nothing prepared and are skipped.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bbox_sae.config import load_config
from bbox_sae.errors import BBoxError
from bbox_sae.models import causal_lm_location


def _convert(source: str, path: str | None, package: str | None, file: str | None, cache: Path, threads: int) -> str:
    import torch

    # Two conversions each on every core would slow both (torch threads oversubscribe).
    torch.set_num_threads(threads)
    return causal_lm_location(source, path, package, file, cache)


def prepare_models(config_path: str, workers: int | None = None) -> list[str]:
    """The converted model dirs, one per GGUF model of the config, in its order; `workers`
    processes (default: one per model, at most one per core)."""
    cfg = load_config(config_path)
    ggufs = [m for m in cfg.models if m.source == "gguf"]
    workers = max(1, min(len(ggufs), workers or os.cpu_count() or 1))
    if workers == 1:
        return [causal_lm_location(m.source, m.path, m.package, m.file, cfg.cache) for m in ggufs]
    threads = max(1, (os.cpu_count() or 1) // workers)
    # spawn: a forked child inherits the parent's torch thread pools, which can deadlock.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_convert, m.source, m.path, m.package, m.file, cfg.cache, threads) for m in ggufs]
        return [f.result() for f in futures]


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
