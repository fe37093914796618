"""Shared helpers for the benchmark scripts: timing, peak RSS, matmul GFLOP/s, load snapshot, tables, JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DEMO_CONFIG = REPO / "configs" / "demo.yaml"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TQDM_DISABLE", "1")


def base_parser(description: str) -> argparse.ArgumentParser:
    os.chdir(REPO)  # configs name paths relative to the repo root
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="smoke mode: tiny sizes, seconds")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the demo config's `threads`)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--results-dir", default=str(RESULTS), help="where <name>.json goes")
    return p


def demo_threads() -> int:
    import yaml

    return int(yaml.safe_load(DEMO_CONFIG.read_text()).get("threads") or os.cpu_count() or 1)


def setup_torch(threads: int | None) -> int:
    import torch

    n = threads or demo_threads()
    torch.set_num_threads(n)
    return n


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def matmul_gflops(device: str = "cpu", dtype: str = "float32", seconds: float = 1.0, shapes: list[tuple[int, int, int]] | None = None) -> dict:
    """Measured dense matmul throughput with torch at the current thread count (best of `shapes`,
    each (m, k, n)).

    Default shapes: square 1024 (4096 on a GPU) and a decoder-MLP-like (512 x 576) @ (576 x 1536).
    """
    import torch

    dt = getattr(torch, dtype)
    big = 4096 if str(device).startswith("cuda") else 1024
    shapes = shapes or [(big, big, big), (512, 576, 1536)]
    best = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dt)
        b = torch.randn(k, n, device=device, dtype=dt)
        torch.mm(a, b)  # warm-up
        sync(device)
        reps, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            reps += 1
            if reps % 4 == 0:
                sync(device)
                if time.perf_counter() - start > seconds / len(shapes):
                    break
        sync(device)
        elapsed = time.perf_counter() - start
        best[f"{m}x{k}x{n}"] = round(2 * m * k * n * reps / elapsed / 1e9, 2)
    return {"gflops": max(best.values()), "by_shape": best, "dtype": dtype, "device": str(device), "threads": torch.get_num_threads()}


def load_snapshot(sample_s: float = 0.5) -> dict:
    """Load average and the processes (other than this one and its children) using > 20% of a CPU."""
    info: dict = {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    try:
        import psutil
    except ImportError:
        return info
    me = psutil.Process()
    mine = {me.pid, *(c.pid for c in me.children(recursive=True))}
    procs = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            p.cpu_percent(None)
            procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    time.sleep(sample_s)
    busy = []
    for p in procs:
        try:
            pct = p.cpu_percent(None)
            if pct > 20 and p.pid not in mine:
                cmd = " ".join(p.info["cmdline"] or [])[:120]
                busy.append({"pid": p.pid, "cpu_percent": round(pct), "cmd": cmd})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    info["busy_processes"] = sorted(busy, key=lambda d: -d["cpu_percent"])
    return info


def environment(threads: int | None = None, device: str = "cpu") -> dict:
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "device": device,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


def results_path(args, name: str) -> Path:
    folder = Path(args.results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / (f"{name}.quick.json" if getattr(args, "quick", False) else f"{name}.json")


def write_results(args, name: str, payload: dict) -> Path:
    path = results_path(args, name)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return path


def print_table(title: str, columns: list[str], rows: list[list], note: str | None = None) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain fallback
        print(f"\n{title}")
        print(" | ".join(columns))
        for r in rows:
            print(" | ".join(fmt(x) for x in r))
        if note:
            print(note)
        return
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*(fmt(x) for x in r))
    console = Console(width=max(200, Console().width))
    console.print(table)
    if note:
        console.print(note)


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 100:
            return f"{x:.1f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        return f"{x:.3g}"
    return str(x)


def run_child(cmd: list[str], env: dict | None = None, timeout: float | None = None) -> tuple[dict, float, float]:
    """Run a worker command; returns (its last stdout line parsed as JSON, wall seconds, peak RSS MiB).

    Each measurement runs in its own process, so the peak RSS the worker reports (its own
    ru_maxrss, the last thing it does) belongs to that measurement alone.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env={**os.environ, **(env or {})}, cwd=REPO)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    lines = [line for line in out.splitlines() if line.strip()]
    result = json.loads(lines[-1])
    return result, wall, float(result.get("peak_rss_mb", float("nan")))


def python() -> str:
    return sys.executable


def worker_command(script: str, *positional: str, **flags) -> list[str]:
    """A child process running `script --worker` with `--flag value` per keyword (underscores
    become dashes; None is left out)."""
    cmd = [python(), script, "--worker", *positional]
    for flag, value in flags.items():
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    return cmd


def results_header(args, name: str, threads: int | None, device: str) -> dict:
    """What every benchmark's results file starts with."""
    return {"benchmark": name, "quick": args.quick, "environment": environment(threads, device)}


def run_stage(stage: str, config: Path, sets: list[str], threads: int) -> tuple[float, float]:
    """`bbox <stage> -c config` in its own process: wall seconds and that process's peak RSS (MiB).

    The stage is started by GNU time, a small process: Linux carries a forked parent's peak RSS
    into its child's ru_maxrss across exec, so a child forked from this (possibly large) process
    would report at least this process's own peak.
    """
    import tempfile

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "bbox_sae", stage, "-c", str(config), *(a for s in sets for a in ("--set", s))]
    with tempfile.NamedTemporaryFile("r", suffix=".maxrss") as rss:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], cwd=REPO, env=env, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed (exit {done.returncode})")
        kib = int(rss.read().split()[-1])
    return round(wall, 2), round(kib / 1024, 1)
