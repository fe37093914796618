"""Scoring precision on CPU: tokens/s and per-word accuracy of each variant against fp32, in one process.

For each demo model, one worker process loads the converted model in fp32 and builds every variant
from it (its own copy each), then scores the same demo documents with all of them, interleaved,
--repeats times; tokens/s is the median pass, "× fp32" the ratio to the fp32 scorer's median in
the same process (so a machine shared with other jobs skews both alike). Accuracy is per canonical
word (token log-probs summed into words as the score stage does) against the fp32 scorer's words
on the same documents: median and 99th-percentile |Δ log p| in nats. The bound a default must
meet on both models (issue 18): median <= 0.02, p99 <= 0.1.

Variants:
- fp32: today's path before issue 18 (fp32 body and head, batched padded windows).
- fp32-batch1: one window per forward, no padding at all (what length-sorted packing could save).
- bf16: weights and activations bf16, log-softmax in fp32 (`dtype: bfloat16, head: model`).
- bf16-head32: bf16 body, fp32 output layer (`head: float32`).
- bf16-refined: bf16 body and output layer, top-32 and target logits recomputed in fp32 (`head: refined`).
- mixed-refined: the CPU default (`dtype: mixed`, `head: refined`): bf16 matmuls in the linear layers of
  all decoder layers but the first and last, fp32 residual stream, norms and attention.
- mixed-refined-unstreamed: the same with the refined head as it was before streaming: one matmul over
  the whole vocabulary into full fp32 logits, a top-k over them, one log-sum-exp.
- mixed-all-refined: the same with every decoder layer's linear layers in bf16 (why the first and last stay fp32).
- int8-head32: torchao int8 dynamic quantization of the body's linear layers, fp32 head (needs torchao).
- bf16-refined-1thread: the refined variant with torch at 1 thread (thread settings).

    .venv/bin/python benchmarks/bench_precision.py                 # both demo models, 24 documents
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DEMO_CONFIG,
    base_parser,
    demo_threads,
    environment,
    load_snapshot,
    peak_rss_mb,
    print_table,
    run_child,
    setup_torch,
    worker_command,
    write_results,
)
from bench_scoring import demo_documents  # noqa: E402

NAME = "precision"
VARIANTS = [
    "fp32",
    "fp32-batch1",
    "bf16",
    "bf16-head32",
    "bf16-refined",
    "mixed-refined",
    "mixed-refined-unstreamed",
    "mixed-all-refined",
    "int8-head32",
    "bf16-refined-1thread",
]
BOUND = {"median": 0.02, "p99": 0.1}


def unstreamed_refined_logprobs(scorer, hidden, targets):
    """The refined head over the whole vocabulary at once: the baseline of the streamed head, and the
    reference its test (tests/test_scoring.py) compares it with."""
    import torch

    weight = scorer._head.weight
    logits = torch.nn.functional.linear(hidden.to(weight.dtype), weight).float()
    rows = torch.cat([logits.topk(scorer.refine_top, dim=-1).indices, targets[:, None]], dim=1)
    logits = scorer._cap(logits.scatter_(1, rows, torch.einsum("nd,nkd->nk", hidden.float(), scorer._head_weight[rows])))
    return logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def build(variant: str, model, tokenizer, mcfg):
    import torch

    from bbox_sae.scoring.hf import HFScorer
    from bbox_sae.scoring.precision import use_bf16_matmuls

    kw = dict(start_token=mcfg.start_token, window=mcfg.window, stride=mcfg.stride, batch_size=mcfg.batch_size, logprob_chunk=mcfg.logprob_chunk)
    if variant == "fp32":
        return HFScorer(mcfg.name, model, tokenizer, **kw)
    if variant == "fp32-batch1":
        return HFScorer(mcfg.name, model, tokenizer, **{**kw, "batch_size": 1})
    mine = copy.deepcopy(model)
    if variant.startswith("mixed-"):
        scorer = HFScorer(mcfg.name, mine, tokenizer, bf16_matmuls=True, head="refined", **kw)
        if variant == "mixed-all-refined":
            use_bf16_matmuls(mine, keep_fp32=0)  # the first and last layer too
        if variant == "mixed-refined-unstreamed":
            # This baseline keeps no alternatives (HFScorer's default).
            none = lambda targets: torch.zeros((len(targets), 0))  # noqa: E731
            scorer._streamed_logprobs = lambda hidden, targets: (unstreamed_refined_logprobs(scorer, hidden, targets), none(targets), none(targets))
        return scorer
    if variant == "int8-head32":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        scorer = HFScorer(mcfg.name, mine, tokenizer, head="float32", **kw)
        quantize_(mine.base_model, Int8DynamicActivationInt8WeightConfig())
        return scorer
    head = {"bf16": "model", "bf16-head32": "float32"}.get(variant, "refined")
    if head == "model":
        mine.to(torch.bfloat16)  # loaded in bf16, as make_scorer does for this head
        return HFScorer(mcfg.name, mine, tokenizer, **kw)
    return HFScorer(mcfg.name, mine, tokenizer, dtype=torch.bfloat16, head=head, **kw)


def worker(args) -> dict:
    import numpy as np
    import torch

    from bbox_sae.config import load_config
    from bbox_sae.models import causal_lm_location, load_causal_lm
    from bbox_sae.scoring.stage import word_logprob_rows

    threads = setup_torch(args.threads)
    cfg = load_config(args.config, [f"cache_dir={args.cache_dir}"] if args.cache_dir else [])
    mcfg = cfg.model(args.model)
    docs = demo_documents(cfg, args.docs)
    location = causal_lm_location(mcfg.source, mcfg.path, mcfg.package, mcfg.file, cfg.cache)
    model, tokenizer = load_causal_lm(location, torch.device("cpu"), torch.float32)
    scorers, skipped = {}, {}
    for v in args.variants.split(","):
        try:
            scorers[v] = build(v, model, tokenizer, mcfg)
        except ImportError as err:
            skipped[v] = f"not measured: {err}"
    passes = {v: [] for v in scorers}
    words = {}
    tokens = 0
    for r in range(args.repeats):
        for v, scorer in scorers.items():  # interleaved: each repeat runs every variant once
            torch.set_num_threads(1 if v.endswith("-1thread") else threads)
            start = time.perf_counter()
            per_doc = list(scorer.score(docs))
            passes[v].append(time.perf_counter() - start)
            if r == 0:
                words[v] = np.concatenate([word_logprob_rows(d, text, s.offsets, s.logprobs)[2] for (d, text), s in zip(docs, per_doc)])
                tokens = sum(len(s.logprobs) for s in per_doc)
    torch.set_num_threads(threads)
    base = statistics.median(passes["fp32"])
    rows = []
    for v in scorers:
        diff = np.abs(words[v] - words["fp32"])
        diff = diff[np.isfinite(diff)]
        med = statistics.median(passes[v])
        rows.append(
            {
                "variant": v,
                "tokens_per_s": round(tokens / med, 1),
                "x_fp32": round(base / med, 2),
                "score_s_passes": [round(t, 2) for t in passes[v]],
                "median_abs_dlogp": float(np.median(diff)),
                "p99_abs_dlogp": float(np.quantile(diff, 0.99)),
                "max_abs_dlogp": float(diff.max()),
                "within_bound": bool(np.median(diff) <= BOUND["median"] and np.quantile(diff, 0.99) <= BOUND["p99"]),
            }
        )
    return {
        "model": args.model,
        "threads": threads,
        "documents": len(docs),
        "tokens": tokens,
        "words": int(len(words["fp32"])),
        "rows": rows,
        "skipped": skipped,
        "peak_rss_mb": peak_rss_mb(),
    }


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--config", default=str(DEMO_CONFIG))
    p.add_argument("--cache-dir", default=None, help="the converted-model cache (default: the config's cache_dir)")
    p.add_argument("--models", default=None, help="comma-separated model names from the config (default: all)")
    p.add_argument("--docs", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes per variant; the median counts")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--machine-note", default="", help="recorded in the results, e.g. that other jobs shared the machine")
    p.add_argument("--worker", action="store_true", help=argparse_hidden())
    p.add_argument("--model", help=argparse_hidden())
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    from bbox_sae.config import load_config

    cfg = load_config(args.config)
    models = args.models.split(",") if args.models else [m.name for m in cfg.models]
    if args.quick:
        args.docs, args.repeats = min(args.docs, 2), 1
        models = models[:1]
    threads = args.threads or demo_threads()
    before = load_snapshot()
    results = []
    for name in models:
        cmd = worker_command(__file__, model=name, config=args.config, docs=args.docs, threads=threads, repeats=args.repeats, variants=args.variants)
        if args.cache_dir:
            cmd += ["--cache-dir", args.cache_dir]
        print(f"[precision] {name} ...", file=sys.stderr, flush=True)
        res, wall, _ = run_child(cmd)
        res["process_wall_s"] = round(wall, 1)
        results.append(res)
    after = load_snapshot()
    write_results(
        args,
        NAME,
        {
            "benchmark": NAME,
            "quick": args.quick,
            "environment": environment(threads, "cpu"),
            "settings": {
                "config": str(args.config),
                "docs": args.docs,
                "repeats": args.repeats,
                "variants": args.variants.split(","),
                "bound": BOUND,
                "machine_note": args.machine_note,
            },
            "results": results,
            "load_before": before,
            "load_after": after,
        },
    )
    table = [
        [
            r["model"],
            row["variant"],
            row["tokens_per_s"],
            row["x_fp32"],
            f"{row['median_abs_dlogp']:.4f}",
            f"{row['p99_abs_dlogp']:.4f}",
            f"{row['max_abs_dlogp']:.3f}",
            "yes" if row["within_bound"] else "no",
        ]
        for r in results
        for row in r["rows"]
    ]
    print_table(
        f"Scoring precision on CPU ({args.docs} demo documents, median of {args.repeats} interleaved passes, {threads} threads)",
        ["model", "variant", "tokens/s", "× fp32", "median |Δ| nats", "p99 |Δ| nats", "max |Δ|", "within bound"],
        table,
        note=f"|Δ| per word against the fp32 scorer on the same documents; bound: median <= {BOUND['median']}, p99 <= {BOUND['p99']}.",
    )
    for r in results:
        for v, why in r["skipped"].items():
            print(f"{r['model']} / {v}: {why}")
    return 0


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
