"""Shared helpers for the hardening tests: a tiny project, an uninterrupted reference run, and
"kill a stage at a random point, re-run it, compare" (helpers/killpoint.py stops the real CLI).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbox_sae.layout import RunLayout
from bbox_sae.stages import BY_NAME, STAGE_NAMES
from bbox_sae.train.sae import RowBatches
from helpers import killpoint
from helpers.cli import bbox_process
from helpers.project import Project, make_project, sample_docs, tiny_pair

KILLPOINT = Path(__file__).with_name("killpoint.py")
# The CLI's stage commands (`bbox score` ingests first, so ingest has no command of its own here).
STAGES = [name for name in STAGE_NAMES if name != "ingest"]

_RUN = RunLayout(Path())
_SAE_RUN = _RUN.sae_run("")
# Written with the run's timings or the command's own config: not compared with the reference.
TIMING_FILES = {_RUN.score_stats(0, 1).name, _RUN.embedding_stats.name, _SAE_RUN.metrics.name, _RUN.config.name, _SAE_RUN.checkpoint_key.name}


def hardening_project(root: Path, **overrides) -> Project:
    """The project the hardening tests interrupt: two tiny random models, every stage small, the
    reference run in `root/ref/out`; `overrides` as `make_project` takes them."""
    settings = dict(
        docs=sample_docs(16),
        models=tiny_pair(),
        output_dir=str(root / "ref" / "out"),
        threads=1,
        corpus={"shard_docs": 4, "holdout_fraction": 0.25},
        embedding={"window": 32, "stride": 16},
        build={"chunk_rows": 64},
        sae={"architecture": "topk", "d_sae": 32, "k": 4, "batch_size": 64, "epochs": 4, "lr": 0.003, "checkpoint_every": 5},
        features={"top_n": 10, "bootstrap_samples": 100},
    )
    return make_project(root, **{**settings, **overrides})


def interrupt_training(monkeypatch, at_batch: int) -> None:
    """The `at_batch`-th batch raises KeyboardInterrupt, as a kill mid-training would stop it."""
    original, calls = RowBatches.__next__, {"n": 0}

    def dying(self):
        calls["n"] += 1
        if calls["n"] == at_batch:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(RowBatches, "__next__", dying)


def stage_outputs(stage: str, out: Path) -> list[str]:
    """What `bbox <stage>` writes, relative to `out`, as the stage registry declares it for the config
    saved there (`bbox score` ingests first): compared with the reference (timing files excluded),
    and removed before the stage is re-run in a copy of the reference. A table of our own would
    drift from the code (it once left out findings.parquet, so findings were never compared)."""
    from bbox_sae.config import load_config

    cfg = load_config(RunLayout(out).config, output_dir=str(out))
    names = ["ingest", stage] if stage == "score" else [stage]
    return [str(p.relative_to(cfg.out)) for name in names for p in BY_NAME[name].outputs(cfg)]


def run_stage_in_process(stage: str, cfg) -> dict | None:
    """`bbox <stage>` without the subprocess: the same writes in the same order (kill-point counts agree)."""
    from bbox_sae.config import save_resolved
    from bbox_sae.manifest import Manifest
    from bbox_sae.stages import run_command

    save_resolved(cfg)
    return run_command(BY_NAME[stage], cfg, Manifest.read(cfg.out))


def build_reference(config_path: Path, stages: list[str]) -> dict[str, int]:
    """Run the stages uninterrupted (in this process); return each stage's number of kill points."""
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


def start_killable(point: int, signal_file: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(KILLPOINT), str(signal_file), str(point), "--", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
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
    again = bbox_process(*args)
    assert again.returncode == 0, f"{context}: re-run failed:\n{again.stderr[-3000:]}"
    assert_same_outputs(work, ref, stage)
    after = complete_shards(work)
    redone = [f for f, st in before.items() if after.get(f) != st]
    assert not redone, f"{context}: shards finished before the kill were redone: {redone}"
    facts.update(point=point, where=where, shards_kept=len(before), stdout=again.stdout)
    return facts
