"""The run lock, with real processes: a second `bbox run` on the same output
dir is refused with a one-line message naming the holder (pid, host, start time); a lock left
by a killed run is taken over safely, and that run resumes where it stopped (the SAE from its
last checkpoint) with the same final artifacts as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from bbox_sae.bookkeeping import run_lock
from bbox_sae.errors import LockError
from bbox_sae.layout import RunLayout
from bbox_sae.pipeline import run_all
from bbox_sae.stages import STAGE_NAMES
from helpers import killpoint
from helpers.cli import bbox_process
from helpers.hardening import assert_same_outputs, hardening_project, sigkill, start_killable, wait_for

SEED = random.SystemRandom().randrange(10**6)


@pytest.mark.slow
def test_second_run_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, monkeypatch):
    project = hardening_project(tmp_path)
    config = project.config
    # Uninterrupted reference, counting kill points to find the SAE's training batches.
    cfg = project.load()
    with pytest.MonkeyPatch.context() as mp:
        counter = killpoint.install(0, None, mp.setattr)
        run_all(cfg)  # saves config.yaml once it holds the lock, as `bbox run` does
    batches = [i for i, p in enumerate(counter["points"], start=1) if p.startswith("batch ") and int(p.split()[1]) >= 7]
    point = random.Random(SEED).choice(batches)  # mid-training, after the step-5 checkpoint
    context = f"seed {SEED}: `bbox run` killed at point {point} ({counter['points'][point - 1]})"

    work = RunLayout(tmp_path / "work" / "out")
    signal_file = tmp_path / "signal"
    first = start_killable(point, signal_file, "run", "--config", str(config), "--output-dir", str(work.root))
    try:
        wait_for(first, signal_file)
        holder = json.loads(work.lock.read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname() and holder["started"]

        second = bbox_process("run", "--config", str(config), "--output-dir", str(work.root))
        assert second.returncode == 2, (context, second.stderr)
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
        assert lines[0] == (
            f"bbox: error: {work.root} is in use by another bbox run (pid {first.pid} on {holder['host']}, started {holder['started']}); wait for it to finish"
        )
    finally:
        sigkill(first)
    assert work.lock.exists()  # left behind by the killed run: stale

    third = bbox_process("run", "--config", str(config), "--output-dir", str(work.root))
    assert third.returncode == 0, (context, third.stderr[-3000:])
    assert f"took over {work.lock} from pid {first.pid}" in third.stderr
    for stage in ("score", "embed", "build"):
        assert f"{stage}: up to date" in third.stderr, (context, third.stderr)
    assert not work.lock.exists()
    metrics = json.loads(project.load(output_dir=work.root).sae_paths.metrics.read_text())
    assert metrics["resumed_from_step"] is not None and metrics["resumed_from_step"] >= 5, (context, metrics)
    manifest = json.loads(work.manifest.read_text())
    assert sorted(manifest["stages"]) == sorted(STAGE_NAMES)
    for stage in ("score", "embed", "build", "train", "label"):
        assert_same_outputs(work.root, cfg.out, stage)
    for name in ("contexts", "top_activations", "corpus_stats", "report_md"):
        assert getattr(work, name).read_bytes() == getattr(cfg.paths, name).read_bytes(), (context, name)


def test_lock_is_exclusive_within_one_process_and_released(tmp_path):
    with run_lock(tmp_path):
        with pytest.raises(LockError, match=rf"pid {os.getpid()} on {socket.gethostname()}"):
            with run_lock(tmp_path):
                pass
    assert not RunLayout(tmp_path).lock.exists()
    with run_lock(tmp_path):  # free again
        pass


def test_a_stale_lock_is_taken_over_and_names_the_new_holder(tmp_path, caplog):
    lock = RunLayout(tmp_path).lock
    lock.write_text(json.dumps({"pid": 999999999, "host": "elsewhere", "started": "earlier"}))
    with caplog.at_level("WARNING", logger="bbox_sae.pipeline"), run_lock(tmp_path):
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    assert f"took over {lock} from pid 999999999 on elsewhere" in caplog.text
    assert not lock.exists()


def test_a_run_finishing_as_another_starts_does_not_refuse_it(tmp_path):
    held, release = threading.Event(), threading.Event()

    def finishing_run():
        with run_lock(tmp_path):
            held.set()
            release.wait()

    first = threading.Thread(target=finishing_run)
    first.start()
    held.wait()
    threading.Timer(0.05, release.set).start()
    with run_lock(tmp_path):  # waits out the holder's last moments instead of refusing
        assert json.loads(RunLayout(tmp_path).lock.read_text())["pid"] == os.getpid()
    first.join()


RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from bbox_sae.errors import LockError
    from bbox_sae.bookkeeping import run_lock
    out, start_at, log = Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
    time.sleep(max(0.0, start_at - time.time()))
    try:
        with run_lock(out):
            t0 = time.time()
            time.sleep(1.5)
            log.with_name(f"held-{os.getpid()}").write_text(json.dumps([t0, time.time()]))
    except LockError:
        log.with_name(f"refused-{os.getpid()}").write_text("")
    """
)


def test_racing_takers_of_a_stale_lock_never_both_hold_it(tmp_path):
    out = RunLayout(tmp_path / "out")
    out.root.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out.lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "earlier"}))
    logs = tmp_path / "logs"
    logs.mkdir()
    start_at = time.time() + 4.0
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(out.root), str(start_at), str(logs / "x")]) for _ in range(4)]
    for r in racers:
        assert r.wait(timeout=60) == 0
    held = sorted(json.loads(p.read_text()) for p in logs.glob("held-*"))
    refused = list(logs.glob("refused-*"))
    assert len(held) + len(refused) == 4 and held, (held, refused)
    for (_a0, a1), (b0, _b1) in zip(held, held[1:]):
        assert a1 <= b0, f"two runs held the lock at once: {held}"
    assert not out.lock.exists()
