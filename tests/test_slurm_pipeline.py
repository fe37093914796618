"""scripts/slurm_pipeline.sh: the three jobs it submits, played in dependency order as Slurm would
run them (a fake `sbatch` records them), take a project from its corpus to a finished run: every
`bbox` command they issue parses against the CLI, and the array's tasks cover every shard once."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bbox_sae.bookkeeping import staleness
from bbox_sae.cli import build_parser
from bbox_sae.manifest import Manifest
from bbox_sae.stages import STAGES
from helpers.project import SMALL_RUN, make_project, sample_docs
from helpers.repo import REPO

SCRIPT = REPO / "scripts" / "slurm_pipeline.sh"
N_TASKS = 3

FAKE_SBATCH = """\
import json, os, sys
record = os.environ["SBATCH_RECORD"]
n = sum(1 for _ in open(record)) if os.path.exists(record) else 0
with open(record, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
print(1000 + n)
"""

FAKE_BBOX = """\
import json, os, subprocess, sys
with open(os.environ["BBOX_RECORD"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(subprocess.call([sys.executable, "-m", "bbox_sae", *sys.argv[1:]]))
"""


def _executable(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _option(argv: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), None)


@pytest.mark.slow
def test_the_submitted_jobs_run_the_pipeline_from_ingest_to_report(tmp_path):
    project = make_project(tmp_path / "p", sample_docs(7, seed=1), **SMALL_RUN, label={"labeler": "heuristic"})
    env = {
        **os.environ,
        "SBATCH": str(_executable(tmp_path / "sbatch", FAKE_SBATCH)),
        "BBOX": str(_executable(tmp_path / "bbox", FAKE_BBOX)),
        "SBATCH_RECORD": str(tmp_path / "sbatch.jsonl"),
        "BBOX_RECORD": str(tmp_path / "bbox.jsonl"),
        "PY": sys.executable,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "SLURM_SUBMIT_DIR": str(REPO),
    }
    submit = subprocess.run(["bash", str(SCRIPT), str(project.config), str(N_TASKS)], env=env, capture_output=True, text=True, timeout=60)
    assert submit.returncode == 0, submit.stderr
    jobs = [json.loads(line) for line in Path(env["SBATCH_RECORD"]).read_text().splitlines()]
    assert [_option(j, "export") for j in jobs] == ["ALL,PHASE=ingest", "ALL,PHASE=shards", "ALL,PHASE=rest"]
    assert [_option(j, "dependency") for j in jobs] == [None, "afterok:1000", "afterok:1001"]
    assert _option(jobs[1], "array") == f"0-{N_TASKS - 1}"

    def play(phase: str, **slurm: str) -> None:
        done = subprocess.run(["bash", str(SCRIPT), str(project.config)], env={**env, "PHASE": phase, **slurm}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    play("ingest")
    for task in range(N_TASKS):
        play("shards", SLURM_ARRAY_JOB_ID="1001", SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_COUNT=str(N_TASKS))
    play("rest")

    calls = [json.loads(line) for line in Path(env["BBOX_RECORD"]).read_text().splitlines()]
    parser = build_parser()
    for argv in calls:
        parser.parse_args(argv)  # exits (fails the test) on an option the CLI does not have
    shards = {(argv[0], argv[argv.index("--shard") + 1]) for argv in calls if "--shard" in argv}
    assert shards == {(stage, f"{i}/{N_TASKS}") for stage in ("score", "embed") for i in range(N_TASKS)}
    assert calls[-2:] == [["merge", "-c", str(project.config), "--stage", "score", "--stage", "embed"], ["run", "-c", str(project.config)]]
    cfg = project.load()
    manifest = Manifest.read(cfg.out)
    assert {s.name: staleness(s, cfg, manifest) for s in STAGES} == {s.name: None for s in STAGES}
    # The final `bbox run` found scoring and embedding done by the array and redid neither.
    assert manifest.get("score").result == {"merged": True} and manifest.get("embed").result == {"merged": True}
    assert cfg.paths.report_html.exists()
