"""`bbox run`: every stage in order, skipping those whose inputs and settings have not changed.

A stage's key hashes its own config sections, its upstream stages' keys and (for the stages
that read the corpus) the corpus files' sizes and times; `manifest.json` records the key of
each finished stage. A stage re-runs when its key changed, its outputs are gone, or it is
forced (`--force STAGE` also redoes everything after it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from bbox_sae.artifacts import atomic_write_json
from bbox_sae.config import Config
from bbox_sae.errors import LockError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    deps: tuple[str, ...]
    settings: Callable[[Config], dict]
    outputs: Callable[[Config], list[Path]]


def _dump(cfg: Config, *keys: str) -> dict:
    data = cfg.model_dump(mode="json")
    return {k: data[k] for k in keys}


STAGES: list[Stage] = [
    Stage("score", (), lambda c: _dump(c, "corpus", "seed", "models"), lambda c: [c.out / "documents.parquet", *[c.out / "logprobs" / m.name for m in c.models]]),
    Stage("embed", (), lambda c: {**_dump(c, "corpus", "seed"), "embedding": c.embedding.model_dump(mode="json", exclude={"batch_size", "device"})}, lambda c: [c.out / "embeddings"]),
    Stage("build", ("score", "embed"), lambda c: _dump(c, "build"), lambda c: [c.out / "build" / "matrix.npy", c.out / "build" / "index.parquet"]),
    Stage("train", ("build",), lambda c: c.sae.model_dump(mode="json", exclude={"device", "checkpoint_every"}), lambda c: [c.out / "sae" / c.sae.resolved_run_name() / "cfg.json"]),
    Stage(
        "features",
        ("train",),
        lambda c: {**_dump(c, "features", "compare"), "negatives": [c.label.only_kept, c.label.validation_examples]},
        lambda c: [c.out / "features.parquet", c.out / "contexts.parquet"],
    ),
    Stage(
        "label",
        ("features",),
        # Operational knobs do not change the answers (and answers are cached anyway).
        lambda c: c.label.model_dump(mode="json", exclude={"concurrency", "dry_run", "timeout_s", "max_retries", "backoff_base_s", "backoff_max_s"}),
        lambda c: [c.out / "features.parquet"],
    ),
    Stage("report", ("label",), lambda c: _dump(c, "report", "wandb"), lambda c: [c.out / "report.html", c.out / "report.md"]),
]
STAGE_NAMES = [s.name for s in STAGES]


def _corpus_fingerprint(cfg: Config) -> str:
    from bbox_sae.scoring.stage import _corpus_fingerprint

    return _corpus_fingerprint(cfg)


def stage_keys(cfg: Config) -> dict[str, str]:
    keys: dict[str, str] = {}
    for stage in STAGES:
        payload = {"settings": stage.settings(cfg), "deps": [keys[d] for d in stage.deps]}
        if not stage.deps:
            payload["corpus"] = _corpus_fingerprint(cfg)
        keys[stage.name] = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return keys


def read_manifest(out: Path) -> dict:
    path = out / "manifest.json"
    if not path.exists():
        return {"stages": {}}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {"stages": {}}


def _read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """One `bbox run` per output dir, held as an flock on `<out>/.lock` (which names the holder).

    The kernel drops an flock when its process dies, however it dies, so a lock left by a
    killed run is simply free: the next run takes it over. Taking over by renaming the file
    instead (after a pid check) races: two takers could each move the other's fresh lock away.
    """
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    path = out / ".lock"
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for _ in range(20):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read_holder(path)
            raise LockError(
                f"{out} is in use by another bbox run (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                f"started {holder.get('started', '?')}); wait for it to finish"
            ) from None
        except OSError as err:
            os.close(fd)
            raise LockError(f"{path}: cannot lock ({err.strerror}); is the output dir on a filesystem without locks?") from None
        # The holder before us may have unlinked the file between our open and our flock: then we
        # locked an orphan inode and must start over on the current file.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise LockError(f"{out}: could not take the lock {path}")
    try:
        previous = _read_holder(path)
        if previous.get("pid") not in (None, me["pid"]):
            log.warning("took over %s from pid %s on %s (that run is gone)", path, previous.get("pid"), previous.get("host"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        yield
    finally:
        # Unlink while still holding the lock, so nobody can lock this inode and think it current.
        path.unlink(missing_ok=True)
        os.close(fd)


def _run_stage(name: str, cfg: Config, key: str | None = None) -> dict | None:
    group = cfg.wandb.group or cfg.out.name
    if name == "score":
        from bbox_sae.scoring.stage import run_score
        from bbox_sae.tracking import wandb_run

        result = run_score(cfg)
        with wandb_run(cfg, "score", group=group) as run:
            if run is not None:
                run.summary.update({"scoring": result})
        return result
    if name == "embed":
        from bbox_sae.embedding import run_embed

        return run_embed(cfg)
    if name == "build":
        from bbox_sae.dataset import run_build

        return run_build(cfg)
    if name == "train":
        from bbox_sae.sae import run_train

        # A run killed mid-training resumes from its last checkpoint when the key still matches.
        return run_train(cfg, wandb_group=group, resume_key=key)
    if name == "features":
        from bbox_sae.features import run_features

        return run_features(cfg)
    if name == "label":
        from bbox_sae.labeling import run_label

        return run_label(cfg)
    if name == "report":
        from bbox_sae.report import run_report

        return run_report(cfg)
    raise ValueError(name)


def plan(cfg: Config, force: list[str] | None = None) -> list[str]:
    """Stages that must run, in order."""
    manifest = read_manifest(cfg.out)["stages"]
    keys = stage_keys(cfg)
    todo: list[str] = []
    forced_from = min((STAGE_NAMES.index(f) for f in force or []), default=len(STAGES))
    for i, stage in enumerate(STAGES):
        done = manifest.get(stage.name, {})
        stale = done.get("key") != keys[stage.name] or not all(p.exists() for p in stage.outputs(cfg))
        if stale or i >= forced_from:
            todo.append(stage.name)
    return todo


def run_all(cfg: Config, force: list[str] | None = None, on_stage: Callable[[str, str], None] | None = None) -> dict:
    from rich.console import Console

    console = Console(stderr=True)
    with run_lock(cfg.out):
        keys = stage_keys(cfg)
        todo = plan(cfg, force)
        manifest = read_manifest(cfg.out)
        timings = {}
        for i, stage in enumerate(STAGES, start=1):
            if stage.name not in todo:
                console.print(f"[{i}/{len(STAGES)}] {stage.name}: up to date")
                if on_stage:
                    on_stage(stage.name, "skipped")
                continue
            console.print(f"[{i}/{len(STAGES)}] {stage.name} ...")
            start = time.perf_counter()
            result = _run_stage(stage.name, cfg, keys[stage.name])
            seconds = time.perf_counter() - start
            timings[stage.name] = round(seconds, 2)
            manifest["stages"][stage.name] = {
                "key": keys[stage.name],
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(seconds, 2),
                "result": result,
            }
            atomic_write_json(cfg.out / "manifest.json", manifest)
            console.print(f"[{i}/{len(STAGES)}] {stage.name}: done in {seconds:.1f}s")
            if on_stage:
                on_stage(stage.name, "ran")
        _final_summary(cfg, console)
        return {"ran": todo, "seconds": timings}


def _final_summary(cfg: Config, console) -> None:
    from bbox_sae.artifacts import read_table

    findings = read_table(cfg.out / "findings.parquet").to_pylist()
    n_latents = sum(f["n_latents"] for f in findings)
    console.print(f"\n{len(findings)} finding(s), from {n_latents} kept latent(s).")
    by_model: dict[str, list[dict]] = {}
    for f in findings:
        by_model.setdefault(f["better_model"], []).append(f)
    for model, rows in sorted(by_model.items()):
        console.print(f"\nWhere [bold]{model}[/bold] is better (held-out Δlog p, 95% CI):")
        for f in rows[:8]:
            label = f["rule"] or f["top_words"]
            console.print(f"  finding {f['finding']:>3}  {f['holdout_median_dlogp']:+.2f} [{f['holdout_ci_low']:+.2f}, {f['holdout_ci_high']:+.2f}]  {label}  ({f['top_words'][:40]})")
    console.print(f"\nReport: {(cfg.out / 'report.html').resolve()}")
