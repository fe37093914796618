"""What a stage is, and whether its outputs are current: keys, records and the run lock.

Below the stage packages and above `manifest`: nothing here names a particular stage (the table of
stages, `bbox_sae.stages`, stands above the stage packages and is built from `Stage`).

A stage's key is content-addressed: it hashes the key fields of the config sections it reads
(`reads`: only the fields the schema marks as part of a key, `bbox_sae/config/keys.py`) and its
code's version (`version`), the files outside the output dir it reads (`sources`: the corpus,
users' log-prob files, by checksum), and the recorded digests of the stages whose outputs it reads
(`inputs`). A stage is current when its recorded key is unchanged and its outputs are still the ones
it wrote (`manifest.StageRecord`). Nothing else decides.

Running a stage first withdraws its record, so a stage that fails (or is killed) leaves no claim
that its old outputs are current: the stages after it refuse to run on them. While it runs, it can
read only the config sections it declares (`config.reading`): a section it read without declaring
could change without its key changing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from bbox_sae.config import Config, key_settings, reading
from bbox_sae.errors import ArtifactError, LockError
from bbox_sae.layout import RunLayout
from bbox_sae.manifest import Manifest, StageRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Option:
    """A command-line option of a stage's subcommand, passed to its `run` as `dest`."""

    flag: str
    dest: str
    help: str
    argparse: Mapping = field(default_factory=dict)
    # A value with which the run covers only part of the stage's work (some models, one worker's
    # shards): its record is withdrawn and not renewed, so it needs no key.
    partial: Callable[[object], bool] = lambda value: False


@dataclass(frozen=True)
class Stage:
    name: str
    help: str
    # (cfg, key, **options) -> the result recorded in the manifest.
    run: Callable[..., dict | None]
    inputs: tuple[Stage, ...]
    # The config sections (and top-level fields) the stage reads: their key fields are its key, and
    # while it runs it can read no other.
    reads: tuple[str, ...]
    outputs: Callable[[Config], list[Path]]
    sources: Callable[[Config], dict] = lambda cfg: {}
    # The version of the code that writes the outputs, by part (defined next to that code): bumped when
    # that code changes what it writes for the same settings, so the runs made before are redone.
    version: Callable[[], Mapping[str, int]] = lambda: {}
    # What of `reads` the key holds instead of the sections' key fields (the score stage: each model's key).
    settings: Callable[[Config], dict] | None = None
    options: tuple[Option, ...] = ()
    # Its outputs are written by workers (`--shard i/n`, or one model each) and finished by
    # `bbox merge`, which checks with this that every worker's shards are complete and intact.
    check_shards: Callable[[Config], None] | None = None
    # Stages its own command runs first: scoring without the current corpus has no meaning.
    runs_first: tuple[Stage, ...] = ()
    # A run that writes nothing (a label dry run): its record is neither withdrawn nor renewed.
    writes_nothing: Callable[[Config], bool] = lambda cfg: False
    # It logs to W&B, so it may read the `wandb` section, which says where it logs, never what it
    # writes: not part of its key (a run logged online after one offline trains no SAE again).
    logs: bool = False

    @property
    def sharded(self) -> bool:
        return self.check_shards is not None

    @property
    def readable(self) -> frozenset[str]:
        return frozenset(self.reads) | ({"wandb"} if self.logs else set())

    def key_settings(self, cfg: Config) -> dict:
        if self.settings is not None:
            return {**self.settings(cfg), **self.version()}
        settings = key_settings(cfg)
        return {**{n: settings[n] for n in self.reads}, **self.version()}

    def ancestors(self) -> list[Stage]:
        """Every stage whose outputs this one depends on, directly or not, inputs before readers."""
        found: list[Stage] = []

        def visit(stage: Stage) -> None:
            for dep in stage.inputs:
                visit(dep)
                if dep not in found:
                    found.append(dep)

        visit(self)
        return found

    def is_partial(self, options: Mapping) -> bool:
        return any(o.partial(options.get(o.dest)) for o in self.options)


def stage_key(stage: Stage, cfg: Config, manifest: Manifest) -> str | None:
    """None when an input stage has no finished record to take its digest from."""
    inputs = {}
    for dep in stage.inputs:
        record = manifest.get(dep.name)
        if record is None:
            return None
        inputs[dep.name] = record.digest
    payload = {"stage": stage.name, "settings": stage.key_settings(cfg), "sources": stage.sources(cfg), "inputs": inputs}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def staleness(stage: Stage, cfg: Config, manifest: Manifest) -> str | None:
    """Why the stage's outputs are not current (None when they are)."""
    record = manifest.get(stage.name)
    if record is None:
        return "has not finished"
    if record.key != stage_key(stage, cfg, manifest):
        return "is out of date (its inputs or settings changed)"
    if not record.outputs_unchanged(cfg.out, stage.outputs(cfg)):
        return "has outputs that are missing or were changed since it finished"
    return None


def require_current_inputs(stage: Stage, cfg: Config, manifest: Manifest, reader: str | None = None) -> None:
    """A stage run on its own refuses inputs that are not current: it would turn stale into new-looking
    results. `reader`: the command that reads what `stage` reads (`eval coherence` reads the report's inputs)."""
    for dep in stage.ancestors():
        why = staleness(dep, cfg, manifest)
        if why is not None:
            names = ", ".join(str(p.relative_to(cfg.out)) for p in dep.outputs(cfg))
            raise ArtifactError(
                f"{cfg.out}: '{reader or stage.name}' reads {names} from stage '{dep.name}', which {why}; run `bbox {dep.name}` (or `bbox run`) first"
            )


def _run(stage: Stage, cfg: Config, key: str | None, options: Mapping) -> dict | None:
    with reading(stage.name, stage.readable):
        return stage.run(cfg, key, **options)


def execute(stage: Stage, cfg: Config, manifest: Manifest, **options) -> dict | None:
    """Run one stage and record it in `manifest` (and its file). A partial run (`Option.partial`)
    withdraws the record and does not renew it."""
    if stage.is_partial(options):
        manifest.put(stage.name, None)
        return _run(stage, cfg, None, options)
    key = stage_key(stage, cfg, manifest)
    if key is None:
        require_current_inputs(stage, cfg, manifest)  # names the input that is missing
    if stage.writes_nothing(cfg):
        return _run(stage, cfg, key, options)
    manifest.put(stage.name, None)
    start = time.perf_counter()
    result = _run(stage, cfg, key, options)
    manifest.put(stage.name, StageRecord.finished_now(cfg.out, key, stage.outputs(cfg), time.perf_counter() - start, result))
    return result


def run_aside(stage: Stage, cfg: Config, manifest: Manifest, **options) -> dict | None:
    """Run a stage on current inputs without touching its record: a sweep's SAEs are not the run's own."""
    require_current_inputs(stage, cfg, manifest)
    return _run(stage, cfg, stage_key(stage, cfg, manifest), options)


def record_finished(stage: Stage, cfg: Config, manifest: Manifest, result: dict) -> None:
    """Record a stage whose outputs were made complete without running it here: every worker's shards
    (`bbox merge`), or a variant's links to its parent's outputs. Its inputs must be current."""
    require_current_inputs(stage, cfg, manifest)
    manifest.put(stage.name, StageRecord.finished_now(cfg.out, stage_key(stage, cfg, manifest), stage.outputs(cfg), 0.0, result))


# ---------------------------------------------------------------- one command per output dir


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
