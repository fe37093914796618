"""Scoring throughput: our HFScorer vs a naive baseline, on the demo's real models and documents.

- ours: what `bbox run` scores with (`scoring.stage.make_scorer`, the model's config with `dtype` set
  to --dtype: `auto` is the demo's): the converted-model cache (`cache_dir`; a first-time
  conversion is timed apart as cache_convert_s), batched padded windows, log-softmax over the
  scored positions only, in chunks (the demo's batch_size / logprob_chunk). Its best pass is
  split into the decoder body, the head with its log-softmax, the rest of `score` (tokenizing,
  windows, padding) and the alignment onto words.
- naive: one document at a time, batch 1, `model(ids).logits`, log-softmax over the full
  vocabulary at every position; the model is loaded straight from the GGUF each time (no
  conversion cache), so its "load s" includes the dequantization.
- floor: the seconds the model's matmuls take at the matmul FLOP/s this worker measures at the
  model's own shapes (its MLP, at the batch's rows, and its head, at logprob_chunk rows), same
  thread count, before and after it scores (the better counts): 2 x (parameters - embedding) x
  tokens at the MLP's rate plus 2 x head parameters x tokens at the head's, in the dtype the
  matmuls run in (bf16 for `mixed`) and, for comparison, in fp32. "of floor" = floor s / score s.
- each worker scores the documents --repeats times (default 2) and the best pass counts, so a
  process that starts next to it on a shared machine skews one pass rather than the result.

Every (model, method) runs in its own process so that its peak RSS is its own. tokens/s exclude
load time. The two methods' per-token log-probs are compared (max |diff|) as a correctness check.

    .venv/bin/python benchmarks/bench_scoring.py            # both demo models, 20 documents
    .venv/bin/python benchmarks/bench_scoring.py --device cuda --dtype bfloat16
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    DEMO_CONFIG,
    base_parser,
    demo_threads,
    load_snapshot,
    matmul_gflops,
    peak_rss_mb,
    print_table,
    results_header,
    run_child,
    setup_torch,
    worker_command,
    write_results,
)

NAME = "scoring"


def demo_documents(cfg, n: int) -> list[tuple[str, str]]:
    """n documents spread evenly over the ones the demo scores."""
    from bbox_sae.corpus.documents import load_documents

    docs = load_documents(cfg.corpus, seed=cfg.seed)
    step = max(1, len(docs) // n)
    return [(d.id, d.text) for d in docs[::step][:n]]


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


class _Timed:
    """Wraps a callable and adds the seconds it runs to `seconds`."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *a, **k):
        start = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.seconds += time.perf_counter() - start


def model_floor(model, tokens: int, rows: int, head_rows: int, device: str, dtypes: list[str], seconds: float) -> dict:
    """Seconds the model's matmuls take at measured FLOP/s of its own shapes, per dtype."""
    c = model.config
    hidden, inner, vocab = c.hidden_size, c.intermediate_size, c.vocab_size
    head_params = vocab * hidden
    body_params = n_params(model) - head_params  # tied head: the embedding is the head
    out = {}
    for dt in dtypes:
        mlp = matmul_gflops(device, dt, seconds / 2, shapes=[(rows, hidden, inner)])["gflops"]
        head = matmul_gflops(device, dt, seconds / 2, shapes=[(head_rows, hidden, 8192)])["gflops"]
        out[dt] = {"mlp_gflops": mlp, "head_gflops": head, "body_s": 2 * body_params * tokens / (mlp * 1e9), "head_s": 2 * head_params * tokens / (head * 1e9)}
        out[dt]["floor_s"] = out[dt]["body_s"] + out[dt]["head_s"]
    return out


def worker(args) -> dict:
    import numpy as np
    import torch

    from bbox_sae.config import load_config
    from bbox_sae.corpus.words import word_spans
    from bbox_sae.models import causal_lm_location, resolve_device, resolve_dtype, resolve_gguf
    from bbox_sae.scoring.align import align_logprobs
    from bbox_sae.scoring.base import plan_windows
    from bbox_sae.scoring.hf import start_token_id, tokenize_with_offsets
    from bbox_sae.scoring.stage import make_scorer

    threads = setup_torch(args.threads)
    cfg = load_config(args.config)
    mcfg = cfg.model(args.model)
    device = resolve_device(args.device)
    docs = demo_documents(cfg, args.docs)

    convert_s = 0.0
    if args.worker == "ours":
        mcfg = mcfg.model_copy(
            update={
                "dtype": args.dtype,
                "device": args.device,
                **({"batch_size": args.batch_size} if args.batch_size else {}),
                **({"head": args.head} if args.head else {}),
            }
        )
        # The one-time GGUF conversion into cache_dir (a no-op once cached) is not part of "load s".
        start = time.perf_counter()
        causal_lm_location(mcfg.source, mcfg.path, mcfg.package, mcfg.file, cfg.cache)
        convert_s = time.perf_counter() - start
        start = time.perf_counter()
        scorer = make_scorer(mcfg, cfg)  # its constructor runs one small forward (the head check): the warm-up
        load_s = time.perf_counter() - start
        model, precision = scorer.model, scorer.precision
        body, head = _Timed(scorer._body), _Timed(scorer._target_logprobs)
        scorer._body, scorer._target_logprobs = body, head
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = resolve_dtype(args.dtype, device)
        # Locating the GGUF (Gemma's package assembles it from chunk packages once) is not loading.
        gguf = resolve_gguf(mcfg.path, mcfg.package, mcfg.file, cfg.cache)
        start = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.to(device=device, dtype=dtype).eval()
        load_s = time.perf_counter() - start
        precision = str(dtype).removeprefix("torch.")
        start_id = start_token_id(tokenizer, mcfg.start_token)
        max_pos = getattr(model.config, "max_position_embeddings", None)
        window = min(mcfg.window, max_pos) if max_pos else mcfg.window
        stride = min(mcfg.stride, window - 1)
        with torch.inference_mode():  # warm-up, as the scorer's head check
            model(torch.tensor([[start_id, 5, 6, 7, 8]], device=device))

    def score_all() -> list:
        if args.worker == "ours":
            return [(s.offsets, s.logprobs) for s in scorer.score(docs)]
        per_doc = []
        with torch.inference_mode():
            for _, text in docs:
                ids, offsets = tokenize_with_offsets(tokenizer, text)
                seq = [start_id, *ids.tolist()]
                out = []
                for w in plan_windows(len(ids), window, stride):
                    x = torch.tensor([seq[w.begin : w.end]], device=device)
                    logprobs = torch.log_softmax(model(x).logits[0].float(), dim=-1)  # every position, every token
                    pos = torch.arange(w.first_target, w.end, device=device)
                    out.append(logprobs[pos - 1 - w.begin, x[0, pos - w.begin]].double().cpu().numpy())
                per_doc.append((offsets, np.concatenate(out)))
        return per_doc

    passes, splits = [], []
    for _ in range(args.repeats):  # best of `repeats`: a process that starts next to us mid-pass skews one pass, not all
        if args.worker == "ours":
            body.seconds = head.seconds = 0.0
        start = time.perf_counter()
        per_doc = score_all()
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        passes.append(time.perf_counter() - start)
        start = time.perf_counter()
        for (_, text), (offsets, lp) in zip(docs, per_doc):
            align_logprobs(offsets, lp, word_spans(text))
        align_s = time.perf_counter() - start
        if args.worker == "ours":
            splits.append({"body_s": body.seconds, "head_s": head.seconds, "rest_s": passes[-1] - body.seconds - head.seconds, "align_s": align_s})
        else:
            splits.append({"align_s": align_s})
    best = int(np.argmin(passes))
    seconds = passes[best]
    tokens = sum(len(lp) for _, lp in per_doc)
    if args.save_logprobs:
        np.save(args.save_logprobs, np.concatenate([lp for _, lp in per_doc]))
    mixed = "bf16 matmuls" in precision or "bfloat16" in precision
    dtypes = ["bfloat16", "float32"] if mixed else ["float32"]
    window_rows = (args.batch_size or mcfg.batch_size) * mcfg.window if args.worker == "ours" else mcfg.window
    floors = model_floor(model, tokens, window_rows, mcfg.logprob_chunk, str(device), dtypes, args.gemm_seconds)
    floor = floors[dtypes[0]]
    return {
        "model": args.model,
        "method": args.worker,
        "device": str(device),
        "precision": precision,
        "threads": threads,
        "documents": len(docs),
        "tokens": tokens,
        "params": n_params(model),
        "load_s": round(load_s, 2),
        "cache_convert_s": round(convert_s, 2),
        "score_s": round(seconds, 3),
        "score_s_all_passes": [round(t, 3) for t in passes],
        "split": {k: round(v, 3) for k, v in splits[best].items()},
        "tokens_per_s": round(tokens / seconds, 1),
        "floors": {dt: {k: round(v, 3) for k, v in f.items()} for dt, f in floors.items()},
        "floor_dtype": dtypes[0],
        "floor_s": round(floor["floor_s"], 3),
        "fraction_of_floor": round(floor["floor_s"] / seconds, 4),
        "batch_size": (args.batch_size or mcfg.batch_size) if args.worker == "ours" else 1,
        "peak_rss_mb": peak_rss_mb(),
    }


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--config", default=str(DEMO_CONFIG))
    p.add_argument("--models", default=None, help="comma-separated model names from the config (default: all)")
    p.add_argument("--docs", type=int, default=12)
    p.add_argument("--repeats", type=int, default=2, help="scoring passes per worker; the best counts")
    p.add_argument("--dtype", default="auto", help="the scored models' dtype: auto (the demo's), float32, bfloat16, mixed")
    p.add_argument("--batch-size", type=int, default=None, help="ours: override the config's batch_size")
    p.add_argument("--head", default=None, help="ours: override the config's head (auto, model, float32, refined)")
    p.add_argument("--methods", default="naive,ours")
    p.add_argument("--gemm-seconds", type=float, default=1.0)
    p.add_argument("--worker", choices=["ours", "naive"], help=argparse_hidden())
    p.add_argument("--model", help=argparse_hidden())
    p.add_argument("--save-logprobs", help=argparse_hidden())
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
        args.gemm_seconds = 0.3
    methods = args.methods.split(",")
    threads = args.threads or demo_threads()
    before = load_snapshot()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            saved = {}
            for method in methods:
                saved[method] = Path(tmp) / f"{name}-{method}.npy"
                cmd = worker_command(
                    __file__, method, model=name, config=args.config, docs=args.docs, threads=threads, device=args.device, dtype=args.dtype,
                    gemm_seconds=args.gemm_seconds, repeats=args.repeats, save_logprobs=saved[method],
                )  # fmt: skip
                if args.batch_size:
                    cmd += ["--batch-size", str(args.batch_size)]
                if args.head:
                    cmd += ["--head", args.head]
                print(f"[scoring] {name} / {method} ...", file=sys.stderr, flush=True)
                res, wall, _ = run_child(cmd)
                res["process_wall_s"] = round(wall, 2)
                results.append(res)
            if {"ours", "naive"} <= set(saved):
                import numpy as np

                a, b = np.load(saved["ours"]), np.load(saved["naive"])
                diff = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
                for r in results:
                    if r["model"] == name:
                        r["max_abs_logprob_diff_vs_other"] = diff
    after = load_snapshot()

    rows = []
    ratios = {}
    for name in models:
        by = {r["method"]: r for r in results if r["model"] == name}
        base = by.get("naive")
        for method in methods:
            r = by[method]
            speedup = r["tokens_per_s"] / base["tokens_per_s"] if base else None
            r["speedup_vs_naive"] = round(speedup, 2) if speedup else None
            rows.append(
                [
                    name,
                    method,
                    r["batch_size"],
                    r["tokens"],
                    r["load_s"],
                    r["score_s"],
                    r["tokens_per_s"],
                    r["speedup_vs_naive"],
                    r["precision"].split(";")[0],
                    r["split"].get("body_s", "-"),
                    r["split"].get("head_s", "-"),
                    r["split"].get("rest_s", "-"),
                    r["split"]["align_s"],
                    r["floor_s"],
                    f"{100 * r['fraction_of_floor']:.1f}%",
                    r["peak_rss_mb"],
                ]
            )
        if base and "ours" in by:
            ratios[name] = {
                "tokens_per_s_ours_over_naive": by["ours"]["speedup_vs_naive"],
                "load_s_naive_over_ours": round(base["load_s"] / max(by["ours"]["load_s"], 1e-9), 2),
                "end_to_end_naive_over_ours": round((base["load_s"] + base["score_s"]) / (by["ours"]["load_s"] + by["ours"]["score_s"]), 2),
                "max_abs_logprob_diff": by["ours"].get("max_abs_logprob_diff_vs_other"),
            }
    print_table(
        f"Scoring ({args.docs} demo documents, best of {args.repeats} passes, {threads} threads, {args.device}, {args.dtype}{', head ' + args.head if args.head else ''})",
        [
            "model",
            "method",
            "batch",
            "tokens",
            "load s",
            "score s",
            "tokens/s",
            "× naive",
            "precision",
            "body s",
            "head s",
            "rest s",
            "align s",
            "floor s",
            "of floor",
            "peak RSS MiB",
        ],
        rows,
        note="load s: naive converts the GGUF on every load; ours reads the converted cache. tokens/s exclude load. "
        "floor = the model's matmuls at the FLOP/s measured at its own shapes in the dtype they run in (bf16 for mixed).",
    )
    floor_rows = []
    for r in results:
        for dt, f in r["floors"].items():
            floor_rows.append(
                [
                    r["model"],
                    r["method"],
                    dt,
                    f["mlp_gflops"],
                    f["head_gflops"],
                    f["body_s"],
                    f["head_s"],
                    f["floor_s"],
                    f"{100 * f['floor_s'] / r['score_s']:.1f}%",
                ]
            )
    print_table(
        "Matmul floors at each model's shapes (MLP at batch x window rows, head at logprob_chunk rows)",
        ["model", "method", "dtype", "MLP GFLOP/s", "head GFLOP/s", "body floor s", "head floor s", "floor s", "of floor"],
        floor_rows,
    )
    for name, r in ratios.items():
        print(
            f"{name}: ours/naive tokens/s = {r['tokens_per_s_ours_over_naive']}×, load naive/ours = {r['load_s_naive_over_ours']}×, "
            f"end-to-end naive/ours = {r['end_to_end_naive_over_ours']}×, max |Δlog p| = {r['max_abs_logprob_diff']:.2e}"
        )
    write_results(
        args,
        NAME,
        {
            **results_header(args, NAME, threads, args.device),
            "settings": {"config": str(args.config), "docs": args.docs, "repeats": args.repeats, "dtype": args.dtype, "models": models, "methods": methods},
            "results": results,
            "ratios": ratios,
            "load_before": before,
            "load_after": after,
        },
    )
    return 0


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
