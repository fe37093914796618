"""SAE training throughput: our sae-lens path (`bbox_sae.train.sae.train_sae`) vs a minimal plain-PyTorch TopK loop.

Both train on the same synthetic matrix, written as `build/matrix.npy` + `index.parquet` (like
tests/helpers/planted.py::planted_run), read batch by batch from the same memory map, with the same
d_in, d_sae, k, batch size, step count, learning rate and device. The plain loop is: encoder
matmul, top-k, ReLU, decoder matmul, summed-square MSE, Adam; no aux loss, no dead-latent
bookkeeping, no per-step host sync. Rows/s count training steps only (ours: sae-lens `fit()`
as `train_sae` reports it; evaluation and saving are reported separately).

    .venv/bin/python benchmarks/bench_sae.py                      # CPU: d_in 386, d_sae 512/k 16 and 3000/k 50
    .venv/bin/python benchmarks/bench_sae.py --device cuda --d-in 770 --sizes 3000:50,10000:50 --autocast
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    base_parser,
    load_snapshot,
    peak_rss_mb,
    print_table,
    results_header,
    setup_torch,
    sync,
    write_results,
)

NAME = "sae"


def write_matrix(out: Path, rows: int, d_in: int, seed: int = 0, n_dirs: int = 256, active: int = 8) -> None:
    """Sparse non-negative combinations of known unit directions + noise + a mean offset, as a built run dir."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(n_dirs, d_in)).astype(np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    from bbox_sae.layout import RunLayout

    paths = RunLayout(out)
    paths.build.mkdir(parents=True, exist_ok=True)
    matrix = np.lib.format.open_memmap(paths.matrix, mode="w+", dtype=np.float32, shape=(rows, d_in))
    for s in range(0, rows, 16384):
        n = min(16384, rows - s)
        codes = np.zeros((n, n_dirs), dtype=np.float32)
        np.put_along_axis(codes, rng.integers(0, n_dirs, size=(n, active)), rng.uniform(0.5, 2.0, (n, active)).astype(np.float32), axis=1)
        matrix[s : s + n] = codes @ directions + 0.01 * rng.normal(size=(n, d_in)).astype(np.float32) + 0.5
    matrix.flush()
    del matrix
    split = np.where(rng.random(rows) < 0.2, "holdout", "train")
    pq.write_table(
        pa.table(
            {"row": np.arange(rows), "doc_id": [f"d{i // 200}" for i in range(rows)], "word_idx": (np.arange(rows) % 200).astype(np.int32), "split": split}
        ),
        paths.index,
    )
    paths.build_info.write_text(json.dumps({"d_in": d_in, "rows": rows, "synthetic": True}))


def config_for(out: Path, args, d_sae: int, k: int, architecture: str):
    from bbox_sae.config import config_from_dict

    return config_from_dict(
        {
            "output_dir": str(out),
            "corpus": {"path": "unused"},
            "models": [{"name": "a", "source": "parquet", "path": "unused"}, {"name": "b", "source": "parquet", "path": "unused"}],
            "sae": {
                "architecture": architecture,
                "d_sae": d_sae,
                "k": k,
                "lr": args.lr,
                "batch_size": args.batch_size,
                "total_rows": args.steps * args.batch_size,
                "dead_feature_window": 200,  # the demo's
                "checkpoint_every": args.steps + 1,  # no checkpoint inside the timed loop
                "dtype": args.dtype,
                "device": args.device,
                "seed": 0,
            },
            "wandb": {"mode": args.wandb},
        }
    )


def run_ours(cfg, autocast: bool) -> dict:
    from dataclasses import dataclass

    import sae_lens.config as sl_config

    from bbox_sae.train.sae import run_dir_for, train_sae

    original = sl_config.SAETrainerConfig
    if autocast:
        # train_sae imports SAETrainerConfig at call time: swap in one whose autocast defaults on.
        @dataclass
        class AutocastTrainerConfig(original):
            autocast: bool = True

        sl_config.SAETrainerConfig = AutocastTrainerConfig
    run_dir = run_dir_for(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        metrics = train_sae(cfg, run_dir)
        total = time.perf_counter() - start
    finally:
        sl_config.SAETrainerConfig = original
    return {
        "rows_trained": metrics["rows_trained"],
        "steps": metrics["steps"],
        "train_s": metrics["seconds"],
        "rows_per_s": metrics["rows_per_s"],
        "train_sae_total_s": round(total, 3),
        "explained_variance": metrics["train_sample"].get("explained_variance"),
        "mean_l0": metrics["train_sample"].get("mean_l0"),
        "dead_fraction": metrics["train_sample"].get("dead_fraction"),
    }


def run_plain(matrix, train_rows, d_sae: int, k: int, args) -> dict:
    """The minimal TopK SAE loop, batches read from the memory map like RowBatches does."""
    import numpy as np
    import torch

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    d_in = matrix.shape[1]
    w_dec = torch.randn(d_sae, d_in)
    w_dec = 0.1 * w_dec / w_dec.norm(dim=1, keepdim=True)
    pick = np.sort(np.random.default_rng(0).choice(train_rows, size=min(65536, len(train_rows)), replace=False))
    mean = torch.from_numpy(np.asarray(matrix[pick], dtype=np.float64).mean(0)).float()
    params = {"W_enc": w_dec.T.clone(), "b_enc": torch.zeros(d_sae), "W_dec": w_dec, "b_dec": mean}
    params = {n: p.to(device=device, dtype=dtype).requires_grad_(True) for n, p in params.items()}
    opt = torch.optim.Adam(params.values(), lr=args.lr)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast)
    batch = min(args.batch_size, len(train_rows))
    per_epoch = len(train_rows) // batch

    def forward(x):
        pre = (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
        vals, idx = pre.topk(k, dim=-1)
        acts = torch.zeros_like(pre).scatter_(-1, idx, torch.relu(vals))
        return acts, acts @ params["W_dec"] + params["b_dec"]

    sync(device)
    start = time.perf_counter()
    order = None
    for step in range(args.steps):
        epoch, i = divmod(step, per_epoch)
        if i == 0:
            order = np.random.default_rng([0, epoch]).permutation(len(train_rows))
        rows = np.sort(train_rows[order[i * batch : (i + 1) * batch]])
        x = torch.from_numpy(np.ascontiguousarray(matrix[rows], dtype=np.float32)).to(device=device, dtype=dtype)
        with autocast:
            _, recon = forward(x)
            loss = (recon.float() - x.float()).pow(2).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(device)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        sample = np.sort(np.random.default_rng(0).choice(train_rows, size=min(20000, len(train_rows)), replace=False))
        x = torch.from_numpy(np.asarray(matrix[sample], dtype=np.float32)).to(device=device, dtype=dtype)
        acts, recon = forward(x)
        x, recon = x.float(), recon.float()
        ev = 1 - float((recon - x).pow(2).sum()) / float((x - x.mean(0)).pow(2).sum())
        l0 = float((acts > 0).sum(-1).float().mean())
        dead = float((~(acts > 0).any(0)).float().mean())
    return {
        "rows_trained": args.steps * batch,
        "steps": args.steps,
        "train_s": round(seconds, 3),
        "rows_per_s": round(args.steps * batch / seconds, 1),
        "explained_variance": ev,
        "mean_l0": l0,
        "dead_fraction": dead,
    }


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--d-in", type=int, default=386, help="386 = MiniLM 384 + 2 models; 770 = Longformer 768 + 2")
    p.add_argument("--sizes", default="512:16,3000:50", help="comma-separated d_sae:k")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rows", type=int, default=65536, help="rows of the synthetic matrix (80%% train)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--architectures", default="topk,batchtopk", help="ours, comma-separated (topk, batchtopk: the demo's); the plain loop is TopK")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="parameter dtype (both)")
    p.add_argument("--autocast", action="store_true", help="bf16 autocast in both (sae-lens SAETrainerConfig.autocast)")
    p.add_argument("--wandb", choices=["disabled", "offline"], default="disabled", help="ours: W&B logging as the demo does (offline)")
    p.add_argument("--order", choices=["ours-first", "plain-first"], default="ours-first")
    args = p.parse_args(argv)
    if args.quick:
        args.d_in, args.sizes, args.steps, args.rows, args.batch_size = min(args.d_in, 34), "64:4", 8, 4096, min(args.batch_size, 256)
    threads = setup_torch(args.threads)
    sizes = [tuple(int(v) for v in s.split(":")) for s in args.sizes.split(",")]
    archs = args.architectures.split(",")
    if not set(archs) <= {"topk", "batchtopk"}:
        p.error(f"--architectures: unknown {sorted(set(archs) - {'topk', 'batchtopk'})}")

    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from bbox_sae.layout import RunLayout

    if args.device.startswith("cuda"):
        torch.ones(1, device=args.device).sum().item()  # CUDA context before either timed loop
    before = load_snapshot()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        data = RunLayout(out / "data")
        write_matrix(data.root, args.rows, args.d_in)
        for a in archs:  # each architecture gets its own output dir over the same matrix files
            (out / a).mkdir()
            RunLayout(out / a).build.symlink_to(data.build)
        setup_s = time.perf_counter() - start
        matrix = np.load(data.matrix, mmap_mode="r")
        index = pq.read_table(data.index)
        train_rows = index["row"].to_numpy()[index["split"].to_numpy(zero_copy_only=False) == "train"]
        for d_sae, k in sizes:
            print(f"[sae] d_in {args.d_in}, d_sae {d_sae}, k {k} ...", file=sys.stderr, flush=True)
            order = ["plain", *archs] if args.order == "plain-first" else [*archs, "plain"]
            res = {}
            for which in order:
                if which == "plain":
                    res[which] = run_plain(matrix, train_rows, d_sae, k, args)
                else:
                    res[which] = run_ours(config_for(out / which, args, d_sae, k, which), args.autocast)
            entry = {"d_in": args.d_in, "d_sae": d_sae, "k": k, "batch_size": args.batch_size, "steps": args.steps, "plain": res["plain"]}
            for a in archs:
                entry[f"ours_{a}"] = res[a]
                entry[f"ratio_ours_{a}_over_plain"] = round(res[a]["rows_per_s"] / res["plain"]["rows_per_s"], 3)
            results.append(entry)
    after = load_snapshot()

    precision = f"{args.dtype}{' + bf16 autocast' if args.autocast else ''}"
    rows = []
    for r in results:
        for which in ["plain", *(f"ours_{a}" for a in archs)]:
            m = r[which]
            label = "plain PyTorch TopK" if which == "plain" else f"ours (sae-lens {which[5:]})"
            ratio = 1.0 if which == "plain" else r[f"ratio_{which}_over_plain"]
            rows.append([f"{r['d_sae']} / k {r['k']}", label, m["steps"], m["train_s"], m["rows_per_s"], ratio, m["explained_variance"], m["mean_l0"]])
    print_table(
        f"SAE training: d_in {args.d_in}, batch {args.batch_size}, {args.rows} rows, {args.device} ({threads} threads), {precision}",
        ["d_sae / k", "method", "steps", "train s", "rows/s", "× plain", "EV (train sample)", "L0"],
        rows,
        note="× plain = our rows/s ÷ the plain loop's, same run. EV after this short run is a sanity check, not a quality comparison.",
    )
    write_results(
        args,
        NAME,
        {
            **results_header(args, NAME, threads, args.device),
            "settings": {k: v for k, v in vars(args).items() if k not in ("results_dir",)},
            "synthetic_setup_s": round(setup_s, 2),
            "results": results,
            "ratios": {f"{r['d_sae']}:{r['k']}:{a}": r[f"ratio_ours_{a}_over_plain"] for r in results for a in archs},
            "peak_rss_mb": peak_rss_mb(),
            "load_before": before,
            "load_after": after,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
