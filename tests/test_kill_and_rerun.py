"""Interruption: SIGKILL each `bbox <stage>` at a random kill point, re-run it (`train
--resume`), and get byte-identical artifacts without redoing finished shards. Damaged shards:
test_damaged_shards.py.

Kill points (tests/helpers/killpoint.py): any atomic write, stopped with its temp file half written;
any row group of the build index, with the memory-mapped matrix half filled; any SAE batch.
Training is deterministic (seeded, one thread; batches depend only on seed and epoch), so the
resumed SAE's weights are compared byte for byte too; only metrics.json (timings,
`resumed_from_step`) differs. The seed is in every failure message; BBOX_KILL_SEED replays it.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from bbox_sae.layout import RunLayout, checkpoint_complete
from helpers.hardening import STAGES, build_reference, hardening_project, kill_rerun_compare

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("BBOX_KILL_SEED", random.SystemRandom().randrange(10**6)))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = hardening_project(tmp_path_factory.mktemp("interrupt"))
    counts = build_reference(project.config, STAGES)
    return project, counts


@pytest.mark.parametrize("stage", STAGES)
def test_kill_at_a_random_point_then_rerun_gives_identical_artifacts(project, stage):
    project, counts = project
    work = RunLayout(project.root / "work" / "out")
    facts = kill_rerun_compare(project.config, project.out, work.root, stage, counts[stage], SEED, project.root)
    # kill_rerun_compare asserts identical artifacts and no finished shard redone; here, that the kill really hit the stage.
    assert facts["where"] and 2 <= facts["point"] <= counts[stage]
    print(f"{facts['context']}, {facts['shards_kept']} finished shard files kept")
    if stage == "train":
        # Not redone: the re-run resumed from the last checkpoint finished before the kill.
        sae_run = project.load(output_dir=work.root).sae_paths
        done = sorted(int(p.name) for p in sae_run.checkpoints.iterdir() if checkpoint_complete(p).exists())
        assert done, facts["context"]
        metrics = json.loads(sae_run.metrics.read_text())
        assert metrics["resumed_from_step"] is not None and metrics["resumed_from_step"] >= 5, (facts["context"], metrics)
        assert metrics["rows_trained"] < metrics["steps"] * 64
