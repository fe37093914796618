"""Shared helpers for the hardening tests: a tiny project, an uninterrupted reference run, and
"kill a stage at a random point, re-run it, compare" (tests/killpoint.py stops the real CLI).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from bbox_sae.stages import BY_NAME, STAGE_NAMES

TESTS = Path(__file__).parent
KILLPOINT = TESTS / "killpoint.py"
# The CLI's stage commands (`bbox score` ingests first, so ingest has no command of its own here).
STAGES = [name for name in STAGE_NAMES if name != "ingest"]

LINES = [
    "If you were here, the day would be bright.",
    "The ships were late, and the men were tired.\n\nThey slept.",
    "Three hundred and 12 crowns, said the steward.",
    "O Romeo, Romeo! wherefore art thou Romeo?",
    "As if it were nothing, he walked away — 日本語 café.",
]

TIMING_FILES = {"stats-0of1.json", "stats.json", "metrics.json", "config.yaml", "key.txt"}


def write_project(root: Path, tiny_lm, tiny_encoder, n_docs: int = 16, **overrides) -> Path:
    rng = np.random.default_rng(0)
    with open(root / "corpus.jsonl", "w") as fh:
        for i in range(n_docs):
            fh.write(json.dumps({"id": f"doc{i}", "text": " ".join(rng.choice(LINES, size=3))}, ensure_ascii=False) + "\n")
    cfg = {
        "output_dir": str(root / "ref" / "out"),
        "cache_dir": str(root / "cache"),
        "threads": 1,
        "corpus": {"path": str(root / "corpus.jsonl"), "shard_docs": 4, "holdout_fraction": 0.25},
        "models": [
            {"name": "smol", "path": str(tiny_lm("smollm2")), "start_token": "<|endoftext|>", "window": 32, "stride": 16},
            {"name": "gem", "path": str(tiny_lm("gemma")), "window": 32, "stride": 16, "logprob_chunk": 64},
        ],
        "embedding": {"model": str(tiny_encoder), "window": 32, "stride": 16},
        "build": {"chunk_rows": 64},
        "sae": {"architecture": "topk", "d_sae": 32, "k": 4, "batch_size": 64, "epochs": 4, "lr": 0.003, "checkpoint_every": 5},
        "features": {"top_n": 10, "bootstrap_samples": 100},
        "wandb": {"mode": "disabled"},
    }
    for key, value in overrides.items():
        cfg[key] = value
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


def stage_outputs(stage: str, out: Path) -> list[str]:
    """What `bbox <stage>` writes, relative to `out`, as the stage registry declares it for the config
    saved there (`bbox score` ingests first): compared with the reference (timing files excluded),
    and removed before the stage is re-run in a copy of the reference. A table of our own would
    drift from the code (it once left out findings.parquet, so findings were never compared)."""
    from bbox_sae.config import load_config
    from bbox_sae.layout import RunLayout

    cfg = load_config(RunLayout(out).config, output_dir=str(out))
    names = ["ingest", stage] if stage == "score" else [stage]
    return [str(p.relative_to(cfg.out)) for name in names for p in BY_NAME[name].outputs(cfg)]


def run_stage_in_process(stage: str, cfg) -> dict | None:
    """`bbox <stage>` without the subprocess: the same writes in the same order (kill-point counts agree)."""
    from bbox_sae.config import save_resolved
    from bbox_sae.stages import run_command

    save_resolved(cfg)
    return run_command(stage, cfg)


def build_reference(config_path: Path, stages: list[str]) -> dict[str, int]:
    """Run the stages uninterrupted (in this process); return each stage's number of kill points."""
    sys.path.insert(0, str(TESTS))
    import killpoint

    from bbox_sae.config import load_config

    cfg = load_config(config_path)
    counts = {}
    for stage in stages:
        with pytest.MonkeyPatch.context() as mp:
            counter = killpoint.install(0, None, mp.setattr)
            run_stage_in_process(stage, cfg)
        counts[stage] = counter["n"]
        # What this stage wrote, as it wrote it.
        for rel, path in _files(cfg.out, stage_outputs(stage, cfg.out)).items():
            dest = snapshot(cfg.out, stage) / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
    return counts


def snapshot(ref: Path, stage: str) -> Path:
    return ref.parent / "after" / stage


def _files(root: Path, rel: list[str]) -> dict[str, Path]:
    out = {}
    for r in rel:
        p = root / r
        items = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else []
        for f in items:
            if f.name.startswith(".") or f.name in TIMING_FILES:
                continue
            out[str(f.relative_to(root))] = f
    return out


def assert_same_outputs(work: Path, ref: Path, stage: str, only_existing: bool = False) -> None:
    """The stage's outputs in `work` are byte-identical to the reference (all of them, or those present)."""
    outputs = stage_outputs(stage, ref)
    if snapshot(ref, stage).exists():
        ref = snapshot(ref, stage)
    mine, theirs = _files(work, outputs), _files(ref, outputs)
    if not only_existing:
        assert sorted(mine) == sorted(theirs), f"{stage}: files differ from the reference"
    assert theirs, stage
    for rel, path in mine.items():
        assert rel in theirs, f"{stage}: unexpected file {rel}"
        assert path.read_bytes() == theirs[rel].read_bytes(), f"{stage}: {rel} differs from the uninterrupted run"


def complete_shards(work: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every finished shard (Parquet file + sidecar) under `work`."""
    state = {}
    for sidecar in work.rglob("part-*.json"):
        shard = sidecar.with_suffix(".parquet")
        if shard.exists():
            for f in (shard, sidecar):
                st = f.stat()
                state[str(f.relative_to(work))] = (st.st_ino, st.st_mtime_ns)
    return state


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bbox_sae", *args], capture_output=True, text=True, timeout=timeout)


def start_killable(point: int, signal_file: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(KILLPOINT), str(signal_file), str(point), "--", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(proc: subprocess.Popen, signal_file: Path, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if signal_file.exists() and signal_file.read_text().endswith("\n"):
            return signal_file.read_text().strip()
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process ended (rc {proc.returncode}) before its kill point:\n{err[-3000:]}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("kill point not reached in time")


def sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def fresh_copy(ref: Path, work: Path, stage: str) -> None:
    """`work` = the reference run with `stage`'s outputs removed (its inputs are identical)."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(ref, work)
    for rel in stage_outputs(stage, ref):
        p = work / rel
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def kill_rerun_compare(config: Path, ref: Path, work: Path, stage: str, n_points: int, seed: int, tmp: Path) -> dict:
    """Kill `bbox <stage>` at a random kill point, re-run it, compare with the reference; returns facts for extra checks."""
    facts: dict = {"context": f"BBOX_KILL_SEED={seed}: {stage}"}
    try:
        return _kill_rerun_compare(config, ref, work, stage, n_points, random.Random(f"{seed}:{stage}"), tmp, facts)
    except AssertionError as err:
        raise AssertionError(f"[{facts['context']}] {err}") from None


def _kill_rerun_compare(config, ref, work, stage, n_points, rng, tmp, facts) -> dict:
    fresh_copy(ref, work, stage)
    # Point 1 is the CLI's config.yaml; 2..n are the stage's own writes / row groups / batches.
    point = rng.randint(2, n_points)
    if stage == "train":
        point = rng.randint(min(9, n_points), n_points)  # after the first checkpoint (every 5 steps)
    sig = tmp / f"signal-{stage}"
    sig.unlink(missing_ok=True)
    proc = start_killable(point, sig, stage, "--config", str(config), "--output-dir", str(work))
    where = wait_for(proc, sig)
    before = complete_shards(work)
    sigkill(proc)
    context = facts["context"] = f"{facts['context']} killed at point {point}/{n_points} ({where})"
    # Whatever the kill left behind under its real name is complete: equal to the reference.
    assert_same_outputs(work, ref, stage, only_existing=True)
    args = [stage, "--config", str(config), "--output-dir", str(work)] + (["--resume"] if stage == "train" else [])
    again = cli(*args)
    assert again.returncode == 0, f"{context}: re-run failed:\n{again.stderr[-3000:]}"
    assert_same_outputs(work, ref, stage)
    after = complete_shards(work)
    redone = [f for f, st in before.items() if after.get(f) != st]
    assert not redone, f"{context}: shards finished before the kill were redone: {redone}"
    facts.update(point=point, where=where, shards_kept=len(before), stdout=again.stdout)
    return facts
