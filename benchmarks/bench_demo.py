"""The demo, stage by stage: wall time (and, with --run, peak RSS) per stage.

Default: report from `runs/demo/manifest.json`, which `bbox run` writes (per-stage seconds
and each stage's result). With `--run`, run every stage through the CLI
(`bbox score -c configs/demo.yaml -o <dir>`, then embed, build, ...) under `/usr/bin/time -v`
into a fresh output dir (default runs/bench-demo; runs/demo is left alone) and report each
stage's wall time, CPU use and peak RSS. `--run` refuses while another `bbox run` is going,
since two demos on 2 cores would time each other.

    .venv/bin/python benchmarks/bench_demo.py              # from the manifest
    .venv/bin/python benchmarks/bench_demo.py --run        # ~ the demo's duration
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DEMO_CONFIG, REPO, base_parser, load_snapshot, print_table, write_results  # noqa: E402

from bbox_sae.layout import RunLayout  # noqa: E402
from bbox_sae.stages import STAGE_NAMES  # noqa: E402

NAME = "demo"


def stage_rates(name: str, result) -> str:
    """A short throughput note from a stage's recorded result."""
    if not isinstance(result, dict):
        return ""
    if name == "score":
        return ", ".join(
            f"{m}: {r.get('tokens', 0)} tok, {r.get('tokens_per_s', 0):.0f} tok/s" for m, r in result.items() if isinstance(r, dict) and r.get("tokens")
        )
    if name == "embed" and result.get("words"):
        return f"{result['words']} words, {result.get('words_per_s', 0):.0f} words/s"
    if name == "build" and result.get("rows"):
        return f"{result['rows']} rows × {result.get('d_in')}"
    if name == "train" and result.get("rows_per_s"):
        return f"{result.get('steps')} steps, {result['rows_per_s']:.0f} rows/s ({result.get('device')})"
    if name == "features" and "kept" in result:
        return f"{result['kept']} kept of {result.get('feature_rows')} rows"
    return ""


def from_manifest(path: Path) -> dict:
    if not path.exists():
        return {"available": False, "manifest": str(path)}
    manifest = json.loads(path.read_text())
    stages = []
    for name in STAGE_NAMES:
        entry = manifest.get("stages", {}).get(name)
        if entry is None:
            stages.append({"stage": name, "seconds": None})
            continue
        stages.append({"stage": name, "seconds": entry.get("seconds"), "finished": entry.get("finished"), "rates": stage_rates(name, entry.get("result"))})
    return {"available": True, "manifest": str(path), "stages": stages, "total_s": round(sum(s["seconds"] or 0 for s in stages), 2)}


def other_demo_running() -> list[str]:
    try:
        out = subprocess.run(["pgrep", "-af", "bbox run"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    me = {str(os.getpid()), str(os.getppid())}
    return [line for line in out.splitlines() if line.split(" ", 1)[0] not in me and "bench_demo" not in line]


def _elapsed(text: str) -> float:
    parts = [float(p) for p in text.strip().split(":")]
    seconds = 0.0
    for p in parts:
        seconds = seconds * 60 + p
    return seconds


def timed_stage(cmd: list[str], log) -> dict:
    """Run one stage; wall seconds, peak RSS and CPU% from /usr/bin/time -v (or wait4 where it is missing)."""
    gnu_time = "/usr/bin/time" if Path("/usr/bin/time").exists() else None
    if gnu_time:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "time.txt"
            start = time.perf_counter()
            rc = subprocess.call([gnu_time, "-v", "-o", str(report), *cmd], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            wall = time.perf_counter() - start
            text = report.read_text() if report.exists() else ""
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        cpu = re.search(r"Percent of CPU this job got: (\d+)%", text)
        elapsed = re.search(r"Elapsed \(wall clock\) time.*: ([\d:.]+)", text)
        return {
            "rc": rc,
            "wall_s": round(_elapsed(elapsed.group(1)) if elapsed else wall, 2),
            "peak_rss_mb": round(int(rss.group(1)) / 1024, 1) if rss else None,
            "cpu_percent": int(cpu.group(1)) if cpu else None,
        }
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return {
        "rc": os.waitstatus_to_exitcode(status),
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "cpu_percent": round(100 * (usage.ru_utime + usage.ru_stime) / wall) if wall else None,
    }


def run_stages(config: str, output_dir: Path, overrides: list[str]) -> dict:
    bbox = str(Path(sys.executable).parent / "bbox")
    if output_dir.exists():
        shutil.rmtree(output_dir)
    output_dir.mkdir(parents=True)
    stages = []
    with open(output_dir.parent / f"{output_dir.name}.log", "w") as log:
        for name in STAGE_NAMES:
            cmd = [bbox, name, "-c", config, "-o", str(output_dir), *[a for o in overrides for a in ("--set", o)]]
            print(f"[demo] {name} ...", file=sys.stderr, flush=True)
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            res = timed_stage(cmd, log)
            stages.append({"stage": name, **res})
            if res["rc"] != 0:
                print(f"[demo] {name} failed (exit {res['rc']}); see {log.name}", file=sys.stderr)
                break
    return {
        "output_dir": str(output_dir),
        "stages": stages,
        "total_s": round(sum(s["wall_s"] for s in stages), 2),
        "max_peak_rss_mb": max((s["peak_rss_mb"] or 0) for s in stages),
    }


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--manifest", default=str(RunLayout(Path("runs/demo")).manifest))
    p.add_argument("--config", default=str(DEMO_CONFIG.relative_to(REPO)))
    p.add_argument("--run", action="store_true", help="run every stage under /usr/bin/time -v")
    p.add_argument("--output-dir", default="runs/bench-demo", help="--run: a fresh output dir (deleted first)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="--run: config overrides")
    args = p.parse_args(argv)
    payload: dict = {"benchmark": NAME, "quick": args.quick}
    manifest = from_manifest(Path(args.manifest))
    payload["manifest"] = manifest
    if manifest["available"]:
        print_table(
            f"Demo stages from {args.manifest} (bbox run)",
            ["stage", "seconds", "share", "finished", "throughput"],
            [
                [s["stage"], s["seconds"], f"{100 * (s['seconds'] or 0) / max(manifest['total_s'], 1e-9):.0f}%", s.get("finished"), s.get("rates", "")]
                for s in manifest["stages"]
            ]
            + [["total", manifest["total_s"], "100%", "", ""]],
            note="seconds as `bbox run` timed them (last run of each stage; a stage skipped as up to date keeps its old time).",
        )
    else:
        print(f"{args.manifest}: not found (run `make demo` first); nothing to report from the manifest")
    if args.run:
        busy = other_demo_running()
        if busy:
            print("another `bbox run` is running; not starting a timed run:\n  " + "\n  ".join(busy), file=sys.stderr)
            return 2
        payload["load_before"] = load_snapshot()
        run = run_stages(args.config, Path(args.output_dir), args.overrides)
        payload["load_after"] = load_snapshot()
        payload["run"] = run
        by_stage = {s["stage"]: s for s in manifest.get("stages", [])}
        print_table(
            f"Demo stages, each under /usr/bin/time -v ({args.config} → {args.output_dir})",
            ["stage", "wall s", "CPU %", "peak RSS MiB", "manifest s"],
            [[s["stage"], s["wall_s"], s["cpu_percent"], s["peak_rss_mb"], by_stage.get(s["stage"], {}).get("seconds")] for s in run["stages"]]
            + [["total", run["total_s"], None, run["max_peak_rss_mb"], manifest.get("total_s")]],
            note="wall s includes each CLI's start-up (imports, config, model load); manifest s is the in-process stage time of `bbox run`.",
        )
        if any(s["rc"] != 0 for s in run["stages"]):
            write_results(args, NAME, payload)
            return 1
    if manifest["available"] or args.run:
        write_results(args, NAME, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
