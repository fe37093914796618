"""Interruption: SIGKILL each `bbox <stage>` at a random kill point, re-run it (`train
--resume`), and get byte-identical artifacts without redoing finished shards. Damaged shards:
test_damaged_shards.py.

Kill points (tests/killpoint.py): any atomic write, stopped with its temp file half written;
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

from hardening import STAGES, build_reference, kill_rerun_compare, write_project

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("BBOX_KILL_SEED", random.SystemRandom().randrange(10**6)))


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_lm, tiny_encoder):
    root = tmp_path_factory.mktemp("interrupt")
    config = write_project(root, tiny_lm, tiny_encoder)
    counts = build_reference(config, STAGES)
    return root, config, counts


@pytest.mark.parametrize("stage", STAGES)
def test_kill_at_a_random_point_then_rerun_gives_identical_artifacts(project, stage):
    root, config, counts = project
    work = root / "work" / "out"
    facts = kill_rerun_compare(config, root / "ref" / "out", work, stage, counts[stage], SEED, root)
    # kill_rerun_compare asserts identical artifacts and no finished shard redone; here, that the kill really hit the stage.
    assert facts["where"] and 2 <= facts["point"] <= counts[stage]
    print(f"{facts['context']}, {facts['shards_kept']} finished shard files kept")
    if stage == "train":
        # Not redone: the re-run resumed from the last checkpoint finished before the kill.
        done = sorted(int(p.name) for p in (work / "sae" / "topk-d32-k4" / "checkpoints").iterdir() if (p / ".complete").exists())
        assert done, facts["context"]
        metrics = json.loads((work / "sae" / "topk-d32-k4" / "metrics.json").read_text())
        assert metrics["resumed_from_step"] is not None and metrics["resumed_from_step"] >= 5, (facts["context"], metrics)
        assert metrics["rows_trained"] < metrics["steps"] * 64
