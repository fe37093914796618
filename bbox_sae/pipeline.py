"""`bbox run`: every stage in order, skipping those that are current.

Whether a stage is current is the stage registry's call (`bbox_sae.stages`): its
content-addressed key is unchanged and its outputs are the ones it wrote. A stage re-runs
when its key changed, its outputs are gone or were changed, or it is forced (`--force STAGE`
also redoes everything after it).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from bbox_sae.config import Config, ensure_output_dir, save_resolved
from bbox_sae.errors import BBoxError, LockError, printable
from bbox_sae.layout import RunLayout
from bbox_sae.schemas import latent_ids
from bbox_sae.stages import STAGE_NAMES, STAGES, execute, read_manifest, staleness, writes_nothing

log = logging.getLogger(__name__)


def _read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


# A short wait, not none: a taker that flocked the inode a finishing holder just unlinked is
# not refused but tries the current file again (filelock re-polls such orphans).
_LOCK_WAIT_S = 0.5


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """One `bbox run` per output dir, held as an flock on `<out>/.lock` (which names the holder).

    The kernel drops an flock when its process dies, however it dies, so a lock left by a
    killed run is simply free: the next run takes it over. Taking over by renaming the file
    instead (after a pid check) races: two takers could each move the other's fresh lock away.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = RunLayout(out).lock
    lock = FileLock(path, timeout=_LOCK_WAIT_S, mode=0o644, on_acquired=lambda fd: _write_holder(fd, path))
    try:
        lock.acquire()
    except Timeout:
        holder = _read_holder(path)
        raise LockError(
            f"{out} is in use by another bbox run (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"started {holder.get('started', '?')}); wait for it to finish"
        ) from None
    except OSError as err:
        raise LockError(f"{path}: cannot lock ({err.strerror}); is the output dir on a filesystem without locks?") from None
    try:
        yield
    finally:
        # Unlink while still holding the lock, so nobody can lock this inode and think it current.
        path.unlink(missing_ok=True)
        lock.release()


def _write_holder(fd: int, path: Path) -> None:
    """Name this run in the lock file it now holds, after noting whose stale lock it took over."""
    try:
        previous = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        previous = {}
    if isinstance(previous, dict) and previous.get("pid") not in (None, os.getpid()):
        log.warning("took over %s from pid %s on %s (that run is gone)", path, previous.get("pid"), previous.get("host"))
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    os.fsync(fd)


def run_all(cfg: Config, force: list[str] | None = None, on_stage: Callable[[str, str], None] | None = None, until: str | None = None) -> dict:
    from rich.console import Console

    console = Console(stderr=True)
    stages = STAGES[: STAGE_NAMES.index(until) + 1] if until else STAGES
    forced_from = min((STAGE_NAMES.index(f) for f in force or []), default=len(STAGES))
    with run_lock(ensure_output_dir(cfg)):
        # Only now, holding the lock: a run refused by it must leave the directory as it was.
        save_resolved(cfg)
        ran, timings = [], {}
        for i, stage in enumerate(stages):
            step = f"[{i + 1}/{len(stages)}] {stage.name}"
            # Decided in turn, after the stages before ran: their new digests are part of this key.
            if i < forced_from and staleness(stage, cfg, read_manifest(cfg.out)) is None:
                console.print(f"{step}: up to date")
                if on_stage:
                    on_stage(stage.name, "skipped")
                continue
            console.print(f"{step} ...")
            start = time.perf_counter()
            execute(stage, cfg)
            seconds = time.perf_counter() - start
            ran.append(stage.name)
            timings[stage.name] = round(seconds, 2)
            if writes_nothing(stage, cfg):
                # The stages after it would read the outputs it did not write.
                console.print(f"{step}: dry run, nothing written; stopping here")
                return {"ran": ran, "seconds": timings}
            console.print(f"{step}: done in {seconds:.1f}s")
            if on_stage:
                on_stage(stage.name, "ran")
        if stages[-1].name == STAGE_NAMES[-1]:
            _final_summary(cfg, console)
        return {"ran": ran, "seconds": timings}


_SUMMARY_ROWS = 8  # findings printed per winning model; the report lists all


def shown(text: str) -> str:
    """Untrusted text (an LLM's label, corpus words, a model's name) as the console prints it: as
    it is, not as console markup ('[' in a corpus word), and without terminal escapes (an LLM's
    label may hold ANSI colours or an OSC-8 hyperlink to another host)."""
    from rich.markup import escape

    return escape(printable(text))


def _final_summary(cfg: Config, console) -> None:
    _print_findings(cfg.paths, console, _SUMMARY_ROWS)
    console.print(f"\nReport: {shown(str(cfg.paths.report_html.resolve()))}")


def print_findings(run_dir: Path, as_json: bool = False) -> None:
    """`bbox findings RUN`: every finding of a finished run, as the run's summary says them."""
    from rich.console import Console

    from bbox_sae.labeling.finding_statements import labeled_findings

    paths = RunLayout(run_dir)
    if not paths.findings.is_file():
        raise BBoxError(f"{paths.findings}: no findings table here; run `bbox run` (or `bbox features`) for this run first")
    if as_json:
        for f in labeled_findings(paths):
            print(json.dumps({k: f.get(k) for k in FINDING_FIELDS}, default=str))
        return
    _print_findings(paths, Console(highlight=False), limit=None)


# What `bbox findings --json` says of each finding (the full rows are findings.parquet).
FINDING_FIELDS = (
    "finding", "statement", "better_model", "model_a", "model_b", "holdout_median_dlogp", "holdout_ci_low", "holdout_ci_high",
    "holdout_n", "q_value", "proposer", "kind", "single_rule", "top_words",
)  # fmt: skip


def _print_findings(paths: RunLayout, console, limit: int | None) -> None:
    from bbox_sae.labeling.finding_statements import labeled_findings
    from bbox_sae.report.finding_inputs import against_search

    findings = labeled_findings(paths)
    n_latents = len({m for f in findings for m in latent_ids(f["latents"])})
    console.print(f"\n{len(findings)} finding(s), carried by {n_latents} latent(s).")
    against = against_search(paths, findings)
    if against:
        console.print(shown(against))
    by_model: dict[str, list[dict]] = {}
    for f in findings:
        by_model.setdefault(f["better_model"], []).append(f)
    for model, rows in sorted(by_model.items()):
        console.print(f"\nWhere [bold]{shown(model)}[/bold] is better (held-out Δlog p, 95% CI, held-out words):")
        for f in rows[:limit]:
            label = f["statement"] or f["top_words"]
            if f.get("kind") == "latent":
                label = f"latent group: {label}"
            console.print(
                f"  finding {f['finding']:>3}  {f['holdout_median_dlogp']:+.2f} [{f['holdout_ci_low']:+.2f}, {f['holdout_ci_high']:+.2f}]  "
                f"n={f['holdout_n']:<4} {shown(label)}  ({shown(f['top_words'][:40])})"
            )
        if limit is not None and len(rows) > limit:
            console.print(f"  ... and {len(rows) - limit} more (report.md, report.html, `bbox findings {shown(str(paths.root))}`)")
