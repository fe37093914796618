"""Time, memory and disk for a corpus of `--words` with a 7B pair, from bench_scale.py's measured
slopes (CPU, here) and stated GPU throughputs (docs/scaling.md cites where each comes from).

    .venv/bin/python benchmarks/estimate_scale.py                      # 10M words, one H200
    .venv/bin/python benchmarks/estimate_scale.py --gpus 16             # a 16-task Slurm array

Each CPU stage's seconds, peak RSS and disk are fitted as a + b * words over the sizes in
benchmarks/results/scale.json (least squares; the SAE, which sees a fixed number of rows, as its
largest-size value) and evaluated at `--words`. Disk and the build's time scale with the vector
width (`--d-embed` over the benchmark's MiniLM 384); the log-probs' disk is the measured import's. Scoring and embedding on the GPU are
positions / throughput: positions = words * tokens per word * window / stride.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
CPU_STAGES = ["ingest", "build", "features", "label", "report"]
BENCH_D_EMBED = 384


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares a + b * x (b >= 0): the fixed cost and the cost per word."""
    n = len(xs)
    if n == 1:
        return 0.0, ys[0] / xs[0]
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    b = max(b, 0.0)
    return my - b * mx, b


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--words", type=float, default=10e6)
    p.add_argument("--gpus", type=int, default=1, help="GPUs scoring and embedding in parallel (array tasks)")
    p.add_argument("--tokens-per-word", type=float, default=1.3, help="Llama-2 / OLMo-2 tokenizers on English prose")
    p.add_argument("--window-over-stride", type=float, default=2.0, help="the paper configs: window 4096, stride 2048")
    p.add_argument("--score-tokens-per-s", type=float, default=10_000, help="prompt log-prob positions/s of one 7B model on one GPU (vLLM)")
    p.add_argument("--server-start-s", type=float, default=180, help="per model per task: vLLM start and weight load")
    p.add_argument("--embed-tokens-per-s", type=float, default=50_000, help="Longformer-base positions/s on one GPU")
    p.add_argument("--d-embed", type=int, default=768, help="Longformer-base")
    p.add_argument("--sae-rows", type=float, default=None, help="rows the SAE sees (default: 10 epochs of the training rows, the paper configs)")
    p.add_argument("--holdout", type=float, default=0.2, help="the paper configs' holdout_fraction")
    p.add_argument("--sae-rows-per-s", type=float, default=300_000, help="SAE rows/s on one GPU at d_in 770, N 3000, k 50, batch 4096")
    args = p.parse_args()
    sizes = json.loads(Path(args.results).read_text())["sizes"]
    words = [s["words"] for s in sizes.values()]
    width = (args.d_embed + 2) / (BENCH_D_EMBED + 2)
    rows = []
    for stage in CPU_STAGES:
        secs = [s["stages"][stage]["seconds"] for s in sizes.values()]
        rss = [s["stages"][stage]["peak_rss_mb"] for s in sizes.values()]
        disk = [s["stages"][stage]["disk_mb"] for s in sizes.values()]
        scale = width if stage == "build" else 1.0
        (a, b), (ra, rb), (da, db) = fit(words, secs), fit(words, rss), fit(words, disk)
        rows.append((stage + " (CPU, 1 thread)", scale * (a + b * args.words), ra + rb * args.words, scale * (da + db * args.words)))

    def measured_disk(stage: str) -> float:
        a, b = fit(words, [s["stages"][stage]["disk_mb"] for s in sizes.values()])
        return a + b * args.words

    positions = args.words * args.tokens_per_word * args.window_over_stride
    score_s = 2 * (positions / args.score_tokens_per_s / args.gpus + args.server_start_s)
    embed_s = positions / args.embed_tokens_per_s / args.gpus
    embed_disk = measured_disk("embed") * args.d_embed / BENCH_D_EMBED
    sae_rows = args.sae_rows or 10 * args.words * (1 - args.holdout)
    rows.insert(0, ("score, 2 x 7B (GPU, vLLM)", score_s, None, measured_disk("score")))
    rows.insert(1, ("embed (GPU)", embed_s, None, embed_disk))
    rows.insert(4, ("train (GPU)", sae_rows / args.sae_rows_per_s, None, 50))
    total = sum(r[1] for r in rows)
    print(f"{args.words / 1e6:g}M words, {args.gpus} GPU(s); positions per model {positions / 1e6:.0f}M; SAE rows {sae_rows / 1e6:.0f}M")
    print("| stage | time | peak RSS | disk |")
    print("|---|---|---|---|")
    for name, secs, rss, disk in rows:
        print(f"| {name} | {secs / 3600:.2f} h | {'-' if rss is None else f'{rss / 1024:.1f} GiB'} | {disk / 1024:.1f} GiB |")
    print(f"| **total** | **{total / 3600:.1f} h** | | **{sum(r[3] for r in rows) / 1024:.0f} GiB** |")


if __name__ == "__main__":
    main()
