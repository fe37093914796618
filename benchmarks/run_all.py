"""Run every benchmark in sequence (scoring, embed + build, SAE, demo stages) and print one summary.

    .venv/bin/python benchmarks/run_all.py            # `make bench`; default sizes, a few minutes each
    .venv/bin/python benchmarks/run_all.py --quick    # smoke sizes
    .venv/bin/python benchmarks/run_all.py --only sae,embed_build

Each benchmark runs as its own process and writes benchmarks/results/<name>.json; this script
then reads those files (all present, so `--only demo` keeps the others' rows) and writes
benchmarks/results/summary.json. A failing benchmark is
reported and the others still run (exit status 1 at the end).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, base_parser, environment, load_snapshot, print_table, results_path, write_results  # noqa: E402

BENCHMARKS = [
    ("scoring", "bench_scoring.py"),
    ("precision", "bench_precision.py"),
    ("embed_build", "bench_embed_build.py"),
    ("sae", "bench_sae.py"),
    ("demo", "bench_demo.py"),
]


def load(args, name: str) -> dict | None:
    path = results_path(args, name)
    return json.loads(path.read_text()) if path.exists() else None


def summary_rows(args) -> list[list]:
    """One row per headline ratio, from every results file present (this run's and earlier ones)."""
    rows = []
    sc = load(args, "scoring")
    if sc:
        by = {}
        for r in sc["results"]:
            by.setdefault(r["model"], {})[r["method"]] = r
        for model, m in by.items():
            ours, naive = m.get("ours"), m.get("naive")
            if ours and naive:
                rows.append(
                    [
                        f"score {model}",
                        "tokens/s",
                        naive["tokens_per_s"],
                        ours["tokens_per_s"],
                        ours["speedup_vs_naive"],
                        f"of floor {100 * ours['fraction_of_floor']:.0f}% (naive {100 * naive['fraction_of_floor']:.0f}%); "
                        f"load {naive['load_s']} → {ours['load_s']} s; RSS {naive['peak_rss_mb']:.0f} → {ours['peak_rss_mb']:.0f} MiB",
                    ]
                )
    pr = load(args, "precision")
    if pr:
        for r in pr["results"]:
            rows_by = {row["variant"]: row for row in r["rows"]}
            fp32, default = rows_by.get("fp32"), rows_by.get("mixed-refined")
            if fp32 and default:
                rows.append(
                    [
                        f"score {r['model']}, CPU default precision",
                        "tokens/s",
                        fp32["tokens_per_s"],
                        default["tokens_per_s"],
                        default["x_fp32"],
                        f"baseline fp32; dtype mixed + refined head: per-word |Δ log p| median {default['median_abs_dlogp']:.3f}, "
                        f"p99 {default['p99_abs_dlogp']:.3f} nats",
                    ]
                )
    eb = load(args, "embed_build")
    if eb:
        e, b = eb["embed"], eb["build"]
        rows.append(
            [
                "embed (MiniLM)",
                "words/s",
                e["baseline"]["words_per_s"],
                e["ours"]["words_per_s"],
                e["speedup"],
                f"baseline: 1 doc, batch 1; ours batch {e['ours']['batch_size']}",
            ]
        )
        rows.append(
            ["build", "rows/s", b["baseline"]["rows_per_s"], b["ours"]["rows_per_s"], b["speedup"], f"{b['rows']} rows; baseline in-memory, ours streamed"]
        )
    sa = load(args, "sae")
    if sa:
        for r in sa["results"]:
            for key in r:
                if key.startswith("ours_"):
                    rows.append(
                        [
                            f"SAE {r['d_sae']}/k{r['k']} {key[5:]}",
                            "rows/s",
                            r["plain"]["rows_per_s"],
                            r[key]["rows_per_s"],
                            r[f"ratio_{key}_over_plain"],
                            f"baseline: plain PyTorch TopK; d_in {r['d_in']}, batch {r['batch_size']}",
                        ]
                    )
    dm = load(args, "demo")
    if dm and dm.get("manifest", {}).get("available"):
        st = [s for s in dm["manifest"]["stages"] if s.get("seconds")]
        slow = max(st, key=lambda s: s["seconds"]) if st else None
        rows.append(["demo (manifest)", "total s", None, dm["manifest"]["total_s"], None, f"slowest: {slow['stage']} {slow['seconds']} s" if slow else ""])
    if dm and dm.get("run"):
        rows.append(["demo (--run)", "total s", None, dm["run"]["total_s"], None, f"max peak RSS {dm['run']['max_peak_rss_mb']} MiB"])
    return rows


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated subset of: " + ", ".join(n for n, _ in BENCHMARKS))
    args = p.parse_args(argv)
    chosen = args.only.split(",") if args.only else [n for n, _ in BENCHMARKS]
    passthrough = ["--results-dir", args.results_dir, "--device", args.device]
    if args.threads:
        passthrough += ["--threads", str(args.threads)]
    if args.quick:
        passthrough.append("--quick")
    before = load_snapshot()
    ran, failed = {}, []
    for name, script in BENCHMARKS:
        if name not in chosen:
            continue
        cmd = [sys.executable, str(REPO / "benchmarks" / script), *passthrough]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call(cmd, cwd=REPO)
        ran[name] = {"exit_code": rc, "seconds": round(time.perf_counter() - start, 1)}
        if rc != 0:
            failed.append(name)
    previous = load(args, "summary") or {}
    seconds = {**previous.get("benchmarks", {}), **ran}  # benchmarks not re-run keep their last entry
    rows = summary_rows(args)
    print_table(
        "Benchmark summary (ratios measured within each benchmark's own run)",
        ["what", "unit", "baseline", "ours", "× baseline", "notes"],
        rows,
        note="; ".join(f"{n}: {r['seconds']} s{' FAILED' if r['exit_code'] else ''}" for n, r in ran.items()),
    )
    write_results(
        args,
        "summary",
        {
            "benchmark": "summary",
            "quick": args.quick,
            "environment": environment(args.threads, args.device),
            "benchmarks": seconds,
            "rows": [dict(zip(["what", "unit", "baseline", "ours", "ratio", "notes"], r)) for r in rows],
            "load_before": before,
            "load_after": load_snapshot(),
        },
    )
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
