"""Issue 31: every stage through the stage registry. What `bbox eval planted`, train/train_sae.py and
train/sweep.py (`bbox sweep`) produce is recorded in the run's manifest, so the next `bbox run` on
that output redoes none of it."""

from __future__ import annotations

import csv
import importlib.util

import pytest
from test_cli import TEXTS, assert_one_line_error, bbox, write_corpus, write_logprobs
from test_hostile_round3_state import REPO, RULES, run, write_config

from bbox_sae.config import load_config
from bbox_sae.stages import STAGE_NAMES, STAGES, read_manifest, staleness

BEFORE_REPORT = STAGE_NAMES[: STAGE_NAMES.index("report")]


@pytest.fixture()
def project(tmp_path, tiny_encoder):
    """Two users' log-prob files (b 0.5 nats worse everywhere) on the six-document corpus, a tiny SAE."""
    write_corpus(tmp_path / "c.jsonl", TEXTS)
    for m, offset in (("a", 0.0), ("b", 0.5)):
        write_logprobs(tmp_path / f"{m}.parquet", TEXTS, offset)
    write_config(tmp_path, tiny_encoder)
    return tmp_path


def up_to_date(err: str) -> list[str]:
    """The stages `bbox run` found up to date, by its progress lines."""
    return [name for name in STAGE_NAMES if f"] {name}: up to date" in err]


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO / "train" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bbox_run_after_eval_planted_redoes_nothing_the_evaluation_did(project, capsys):
    (project / "rules.yaml").write_text(RULES)
    evaluation = project / "eval"
    args = ["eval", "planted", "-c", str(project / "cfg.yaml"), "-o", str(evaluation), "--rules", str(project / "rules.yaml")]
    code, err = bbox(capsys, *args, "--null-seeds", "1", "--ablations")
    assert code == 0, err
    code, err = bbox(capsys, "run", "-c", str(evaluation / "config.yaml"))
    assert code == 0, err
    assert up_to_date(err) == BEFORE_REPORT and "report: done" in err  # the evaluation writes no report
    # Each variant (a null-pair seed, the w = 0 ablation) is a run whose manifest says what it holds.
    for variant in ("null-seed0", "ablation-w0"):
        cfg = load_config(evaluation / variant / "config.yaml")
        manifest = read_manifest(cfg.out)
        assert [s.name for s in STAGES if staleness(s, cfg, manifest) is None] == BEFORE_REPORT, variant
    # A `bbox run` on the evaluation's config keeps the dir the evaluation's own: it may evaluate there again.
    code, err = bbox(capsys, *args, "--null-seeds", "0")
    assert code == 0, err


def test_a_train_script_run_is_recorded(project, capsys):
    assert run(capsys, project, "--until", "build")[0] == 0
    # As `wandb agent` passes a sweep's parameters: bare key=value words.
    assert script("train_sae").main(["--config", str(project / "cfg.yaml"), "sae.seed=3"]) == 0
    code, err = run(capsys, project, "--until", "train", "--set", "sae.seed=3")
    assert code == 0, err
    assert up_to_date(err) == BEFORE_REPORT[: BEFORE_REPORT.index("train") + 1]


def test_a_sweep_trains_only_on_a_current_build_and_is_recorded(project, capsys):
    sweep = ["--config", str(project / "cfg.yaml"), "--set", "sae.k=[2,3]"]
    capsys.readouterr()
    code = script("sweep").main(sweep)
    assert_one_line_error(code, capsys.readouterr().err, "'train' reads", "from stage 'ingest', which has not finished")
    assert run(capsys, project, "--until", "build")[0] == 0
    assert script("sweep").main(sweep) == 0
    with (project / "out" / "sae" / "sweep_summary.csv").open() as fh:
        assert [r["run_name"] for r in csv.DictReader(fh)] == ["k2", "k3"]
    # The saved config is the last run's, and its SAE is the one on record.
    code, err = bbox(capsys, "run", "-c", str(project / "out" / "config.yaml"), "--until", "train")
    assert code == 0, err
    assert up_to_date(err) == BEFORE_REPORT[: BEFORE_REPORT.index("train") + 1]
