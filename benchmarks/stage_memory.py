"""Where one stage's memory goes: heap versus mapped files over time, and its largest allocations.

    .venv/bin/python benchmarks/stage_memory.py features -c runs/bench-scale/3M/config.yaml

`bbox <stage>` runs in its own process under `strace -e trace=mmap,munmap,mremap` (system calls
only, so the stage runs at close to full speed) while /proc/<pid>/status is sampled every 0.2 s.

- RssAnon is the process's own memory (heap, arrays); RssFile is pages of memory-mapped files
  (the matrix), which the kernel drops under pressure and re-reads. ru_maxrss, what bench_scale
  reports, is the peak of their sum.
- glibc serves every allocation above 32 MiB (its largest mmap threshold) with a mapping of its
  own, so the largest anonymous mappings traced are the largest single allocations (NumPy,
  PyTorch and Arrow buffers alike, Arrow set to allocate through malloc for this run), to within
  a page. Reserved address space (PROT_NONE or MAP_NORESERVE: malloc arenas, allocator
  reservations) is not memory and is left out.
- Each allocation is tagged with the progress bar or message the stage last printed, which says
  which step made it.

Writes benchmarks/results/stage_memory.json (one entry per config and stage, kept until measured
again) and stage_memory-<stage>.png (RssAnon and RssFile over time, the steps marked).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, base_parser, results_path, write_results  # noqa: E402

NAME = "stage_memory"
LARGE = 32 * 2**20  # glibc's largest mmap threshold: allocations above it always get their own mapping
MMAP = re.compile(r"^(\d+)\s+([\d.]+) mmap\((\w+), (\d+), ([\w|]+), ([\w|]+), (-?\d+), \w+\) = (0x[0-9a-f]+)")
MUNMAP = re.compile(r"^(\d+)\s+([\d.]+) munmap\((0x[0-9a-f]+), (\d+)\) = 0")
MREMAP = re.compile(r"^(\d+)\s+([\d.]+) mremap\((0x[0-9a-f]+), (\d+), (\d+),.*\) = (0x[0-9a-f]+)")
STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile")
PROGRESS_BAR = re.compile(r"^(.*?): +(\d+%\||\d+\w* \[)")  # tqdm: "<desc>: 45%|" or "<desc>: 123it ["


def child_pid(parent: int, timeout: float = 30.0) -> int:
    """The process strace started (strace's only child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except FileNotFoundError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise SystemExit("strace started no process")


def read_status(pid: int) -> dict[str, int] | None:
    """Resident KiB by kind; None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            out[key] = int(value.split()[0])
    return out or None


def follow_steps(stream, steps: list[tuple[float, str]]) -> None:
    """The stage's steps as it announces them: progress-bar descriptions and printed lines."""
    buffer = ""
    while chunk := stream.read(1):
        if chunk not in "\r\n":
            buffer += chunk
            continue
        line, cleared, buffer = buffer.strip(), bool(buffer), ""
        step = m.group(1) if (m := PROGRESS_BAR.match(line)) else line
        if not step and cleared and steps and not steps[-1][1].startswith("after "):
            # A finished bar that does not stay (tqdm's leave=False) is overwritten with spaces.
            step = f"after {steps[-1][1]}"
        if step and (not steps or steps[-1][1] != step):
            steps.append((time.time(), step[:80]))


def step_at(steps: list[tuple[float, str]], t: float) -> str:
    current = "start"
    for when, step in steps:
        if when > t:
            break
        current = step
    return current


def anonymous_allocations(trace: Path) -> list[dict]:
    """Every anonymous read-write mapping of LARGE bytes or more: when, how large, until when."""
    live: dict[int, dict] = {}
    done = []
    for line in trace.read_text().splitlines():
        if m := MMAP.match(line):
            _, t, _, length, prot, flags, _, addr = m.groups()
            if "MAP_ANONYMOUS" in flags and "MAP_NORESERVE" not in flags and prot != "PROT_NONE" and int(length) >= LARGE:
                live[int(addr, 16)] = {"bytes": int(length), "at": float(t)}
        elif m := MUNMAP.match(line):
            _, t, addr, _ = m.groups()
            if (a := live.pop(int(addr, 16), None)) is not None:
                done.append({**a, "until": float(t)})
        elif m := MREMAP.match(line):
            _, t, old, _, new_length, new = m.groups()
            if (a := live.pop(int(old, 16), None)) is not None:
                done.append({**a, "until": float(t)})
                live[int(new, 16)] = {"bytes": int(new_length), "at": float(t)}
    return done + [{**a, "until": None} for a in live.values()]


def plot(samples: list[tuple[float, dict]], steps: list[tuple[float, str]], title: str, dest: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = samples[0][0]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for key, colour in (("RssAnon", "tab:red"), ("RssFile", "tab:blue")):
        ax.plot([t - t0 for t, _ in samples], [s.get(key, 0) / 2**20 for _, s in samples], label=key, color=colour)
    for when, step in steps:
        if step.removeprefix("after ").startswith(("features:", "label:", "build:", "train:", "embed:", "report:")):
            ax.axvline(when - t0, color="grey", lw=0.5)
            ax.text(when - t0, ax.get_ylim()[1] * 0.98, step[:40], rotation=90, va="top", fontsize=7)
    ax.set_xlabel("seconds")
    ax.set_ylabel("GiB resident")
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("stage")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between samples of /proc/<pid>/status")
    p.add_argument("--top", type=int, default=10, help="how many of the largest allocations to keep")
    args = p.parse_args()
    if shutil.which("strace") is None:
        raise SystemExit("stage_memory.py needs strace (Debian: apt install strace)")
    threads = args.threads or 1
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONPATH": str(REPO),
        "TQDM_DISABLE": "0",
        "ARROW_DEFAULT_MEMORY_POOL": "system",
    }
    cmd = [sys.executable, "-m", "bbox_sae", args.stage, "-c", args.config, *(a for s in args.set for a in ("--set", s))]
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        strace = ["strace", "-f", "-ttt", "-e", "trace=mmap,munmap,mremap", "-o", str(trace)]
        start = time.time()
        proc = subprocess.Popen([*strace, *cmd], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        pid = child_pid(proc.pid)
        steps: list[tuple[float, str]] = []
        reader = threading.Thread(target=follow_steps, args=(proc.stderr, steps), daemon=True)
        reader.start()
        samples = []
        while proc.poll() is None:
            if (status := read_status(pid)) is not None:
                samples.append((time.time(), status))
            time.sleep(args.interval)
        reader.join(timeout=5)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}); its last step: {steps[-1][1] if steps else '-'}")
        allocations = anonymous_allocations(trace)
    wall = time.time() - start
    peak_t, peak = max(samples, key=lambda s: s[1].get("RssAnon", 0))
    live_at_peak = [a for a in allocations if a["at"] <= peak_t and (a["until"] is None or a["until"] > peak_t)]
    largest = sorted(allocations, key=lambda a: -a["bytes"])[: args.top]

    def described(a: dict) -> dict:
        return {
            "MiB": round(a["bytes"] / 2**20, 1),
            "at_s": round(a["at"] - start, 1),
            "held_s": round((a["until"] or time.time()) - a["at"], 1),
            "step": step_at(steps, a["at"]),
        }

    entry = {
        "config": args.config,
        "stage": args.stage,
        "sets": args.set,
        "threads": threads,
        "wall_s": round(wall, 1),
        "peak_MiB": {k: round(max(s.get(k, 0) for _, s in samples) / 1024, 1) for k in STATUS_FIELDS},
        "at_anon_peak": {"at_s": round(peak_t - start, 1), "step": step_at(steps, peak_t), **{k: round(v / 1024, 1) for k, v in peak.items()}},
        "large_allocations_live_at_anon_peak": {"count": len(live_at_peak), "MiB": round(sum(a["bytes"] for a in live_at_peak) / 2**20, 1)},
        "largest_allocations": [described(a) for a in largest],
        "steps": [{"at_s": round(t - start, 1), "step": s} for t, s in steps if ":" in s][:200],
    }
    path = results_path(args, NAME)
    previous = json.loads(path.read_text()) if path.exists() else {}
    runs = {k: v for k, v in previous.get("runs", {}).items() if k != f"{args.config} {args.stage}"}
    runs[f"{args.config} {args.stage}"] = entry
    write_results(args, NAME, {"runs": runs})
    plot(samples, steps, f"bbox {args.stage}: {args.config}", path.with_name(f"{NAME}-{args.stage}.png"))
    print(json.dumps(entry, indent=1)[:4000])


if __name__ == "__main__":
    main()
