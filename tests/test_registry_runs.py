"""Issue 31: every stage through the stage registry. What `bbox eval planted` and train/train_sae.py
produce is recorded in the run's manifest, so the next `bbox run` on that output redoes none of it;
train/sweep.py (`bbox sweep`) trains only on a current build and leaves the run's records alone."""

from __future__ import annotations

import csv
import shutil

import pytest

from bbox_sae.bookkeeping import staleness
from bbox_sae.config import load_config
from bbox_sae.layout import RunLayout
from bbox_sae.manifest import Manifest
from bbox_sae.stages import STAGE_NAMES, STAGES
from helpers.cli import assert_one_line_error, bbox
from helpers.planted import THE_RULES_YAML
from helpers.project import SMALL_RUN, Project, make_project
from helpers.repo import load_script

BEFORE_REPORT = STAGE_NAMES[: STAGE_NAMES.index("report")]


@pytest.fixture()
def project(tmp_path) -> Project:
    """Two users' log-prob files (b 0.5 nats worse everywhere) on the six-document corpus, a tiny SAE."""
    return make_project(tmp_path, **SMALL_RUN)


def run(capsys, project: Project, *extra: str) -> tuple[int, str]:
    return bbox(capsys, "run", "-c", str(project.config), *extra)


def up_to_date(err: str) -> list[str]:
    """The stages `bbox run` found up to date, by its progress lines."""
    return [name for name in STAGE_NAMES if f"] {name}: up to date" in err]


def script(name: str):
    return load_script(f"train/{name}.py")


def test_bbox_run_after_eval_planted_redoes_nothing_the_evaluation_did(project, capsys):
    (project.root / "rules.yaml").write_text(THE_RULES_YAML)
    evaluation = RunLayout(project.root / "eval")
    args = ["eval", "planted", "-c", str(project.config), "-o", str(evaluation.root), "--rules", str(project.root / "rules.yaml")]
    code, err = bbox(capsys, *args, "--null-seeds", "1", "--ablations")
    assert code == 0, err
    code, err = bbox(capsys, "run", "-c", str(evaluation.config))
    assert code == 0, err
    assert up_to_date(err) == BEFORE_REPORT and "report: done" in err  # the evaluation writes no report
    # Each variant (a null-pair seed, the w = 0 ablation) is a run whose manifest says what it holds.
    for variant in (evaluation.null_seed(0), evaluation.ablation_w0):
        cfg = load_config(variant.config)
        manifest = Manifest.read(cfg.out)
        assert [s.name for s in STAGES if staleness(s, cfg, manifest) is None] == BEFORE_REPORT, variant.root.name
    # A `bbox run` on the evaluation's config keeps the dir the evaluation's own: it may evaluate there
    # again, and what is current (the same planted log-probs, the same SAE settings) is not redone:
    # a re-evaluation after a change to the features stage retrained every SAE, an hour on Handbook.
    trained = {root: Manifest.read(root).get("train") for root in (evaluation.root, evaluation.null_seed(0).root)}
    code, err = bbox(capsys, *args, "--null-seeds", "1")
    assert code == 0, err
    assert {root: Manifest.read(root).get("train") for root in trained} == trained


def test_a_train_script_run_is_recorded(project, capsys):
    assert run(capsys, project, "--until", "build")[0] == 0
    # As `wandb agent` passes a sweep's parameters: bare key=value words.
    assert script("train_sae").main(["--config", str(project.config), "sae.seed=3"]) == 0
    code, err = run(capsys, project, "--until", "train", "--set", "sae.seed=3")
    assert code == 0, err
    assert up_to_date(err) == BEFORE_REPORT[: BEFORE_REPORT.index("train") + 1]


def test_a_sweep_trains_only_on_a_current_build_and_leaves_the_runs_records_alone(project, capsys):
    sweep = ["--config", str(project.config), "--set", "sae.k=[2,3]"]
    capsys.readouterr()
    code = script("sweep").main(sweep)
    assert_one_line_error(code, capsys.readouterr().err, "'train' reads", "from stage 'ingest', which has not finished")
    assert run(capsys, project, "--until", "build")[0] == 0
    config, manifest = project.paths.config.read_bytes(), project.paths.manifest.read_bytes()
    assert script("sweep").main(sweep) == 0
    with project.paths.sweep_summary_csv.open() as fh:
        assert [r["run_name"] for r in csv.DictReader(fh)] == ["k2", "k3"]
    # The manifest's one train record is the run's own SAE: a sweep run put there would make the
    # run's later stages out of date. Each sweep run's settings are in its own folder.
    assert project.paths.config.read_bytes() == config and project.paths.manifest.read_bytes() == manifest
    assert [load_config(project.paths.sae_run(f"k{k}").run_config).sae.k for k in (2, 3)] == [2, 3]


def test_a_copied_run_is_up_to_date_and_a_changed_copy_is_not(project, capsys, tmp_path):
    """`cp -r` gives every file a new time: the checksums, not the times, say whether a copy's
    outputs are still what its stages wrote, so a copy (to sweep on, say) redoes nothing."""
    code, err = run(capsys, project)
    assert code == 0, err
    copy = tmp_path / "copy"
    shutil.copytree(project.out, copy, copy_function=shutil.copy)  # contents, not times
    code, err = run(capsys, project, "-o", str(copy))
    assert code == 0, err
    assert up_to_date(err) == STAGE_NAMES
    weights = next((copy / "sae").rglob("sae_weights.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other contents
    weights.write_bytes(bytes(data))
    code, err = run(capsys, project, "-o", str(copy))
    assert code == 0, err
    assert up_to_date(err)[:4] == STAGE_NAMES[: STAGE_NAMES.index("train")]
    assert "train" not in up_to_date(err) and "train: done" in err
