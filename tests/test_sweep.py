"""Dictionary-size sweeps: a sweep file names its base config; the sweep trains on the run's current
build, leaves the run as it was, and says per size what it reconstructs and what it finds."""

import csv
import hashlib
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from bbox_sae import bookkeeping, stages
from bbox_sae import sweep as sweeps
from bbox_sae.artifacts import read_table
from bbox_sae.config import load_config
from bbox_sae.corpus.words import word_spans
from bbox_sae.layout import RunLayout
from bbox_sae.sweep import MAX_L0_OFF_K, run_flags, run_sweep
from helpers.cli import assert_one_line_error, bbox
from helpers.planted import planted_run
from helpers.project import SMALL_RUN, Project, make_project, sample_docs
from helpers.repo import load_script
from helpers.wandb_log import logged_bytes


def test_flags_name_poor_reconstruction_off_k_sparsity_and_short_runs():
    good = {"holdout": {"explained_variance": 0.9, "mean_l0": 16.5}, "warnings": []}
    assert run_flags(good, k=16) == []
    assert run_flags({**good, "holdout": {"explained_variance": 0.49, "mean_l0": 16}}, k=16) == ["EV<0.5"]
    assert run_flags({**good, "holdout": {"explained_variance": float("nan"), "mean_l0": 16}}, k=16) == ["EV<0.5"]
    off = 16 * (1 + MAX_L0_OFF_K) + 0.1
    assert run_flags({**good, "holdout": {"explained_variance": 0.9, "mean_l0": off}}, k=16) == ["L0 off k by >25%"]
    assert run_flags({**good, "holdout": {"explained_variance": 0.9, "mean_l0": 11.9}}, k=16) == ["L0 off k by >25%"]
    assert run_flags({**good, "warnings": ["too short"]}, k=16) == ["short run"]


def test_sweep_writes_a_flagged_summary_a_plot_and_a_wandb_table(tmp_path, capsys, monkeypatch):
    cfg, _ = planted_run(tmp_path, n=3000, architecture="batchtopk")
    # The matrix is made by hand, with no build on record (which a sweep otherwise requires): what is
    # tested here is the summary (tests/test_registry_runs.py: a sweep on a recorded build).
    for module in (sweeps, bookkeeping):
        monkeypatch.setattr(module, "require_current_inputs", lambda stage, cfg, manifest: None)
    path = tmp_path / "sweep.yaml"
    raw = cfg.model_dump(mode="json")
    raw["sae"].update({"d_sae": 128, "k": 3, "total_rows": [2 * 512, 80 * 512], "dead_feature_window": 10})
    path.write_text(yaml.safe_dump(raw))
    run_sweep(path, [], None)
    with cfg.paths.sweep_summary_csv.open() as fh:
        short, long = csv.DictReader(fh)
    for r in (short, long):
        assert abs(float(r["l0_over_k"]) - 1) < 0.1  # calibrated even after 2 steps
    assert short["steps"] == "2" and float(short["ev_holdout"]) < 0.5
    assert short["flags"] == "EV<0.5; short run"
    assert long["steps"] == "80" and float(long["ev_holdout"]) > 0.5 and long["flags"] == ""
    assert float(long["ev_holdout_training_mode"]) - float(long["ev_holdout"]) < 0.02
    png = cfg.paths.sweep_summary_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "1 run(s) flagged (total_rows1024)" in " ".join(capsys.readouterr().out.split())
    summary_runs = [p for p in cfg.paths.wandb.rglob("offline-run-*") if b"sweep/summary" in logged_bytes(p)]
    assert len(summary_runs) == 1


def were_project(root: Path) -> Project:
    """Forty documents, model b 3 nats worse on every 'were' and the same elsewhere: a difference
    the tiny SAE finds in seconds."""
    docs = sample_docs(40, seed=1)
    project = make_project(
        root, docs=docs, corpus={"holdout_fraction": 0.5, "shard_docs": 8}, sae={**SMALL_RUN["sae"], "epochs": 20}, features=SMALL_RUN["features"]
    )
    ids, idx, lp = [], [], []
    for d in docs:
        for i, (start, end) in enumerate(word_spans(d["text"])):
            ids.append(d["id"])
            idx.append(i)
            lp.append(-4.0 if d["text"][start:end].strip().lower() == "were" else -1.0)
    pq.write_table(pa.table({"doc_id": ids, "word_idx": pa.array(idx, pa.int32()), "logprob": lp}), project.logprob_file("b"))
    return project


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root`: its content's checksum and its time (a rewrite with the same bytes changes it)."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


def write_sweep(path: Path, **sweep) -> Path:
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_a_sweep_on_a_copy_of_a_run_leaves_it_as_it_was_and_says_what_each_size_finds(tmp_path, capsys):
    project = were_project(tmp_path / "project")
    code, err = bbox(capsys, "run", "-c", str(project.config))
    assert code == 0, err
    copy = RunLayout(tmp_path / "copy")
    shutil.copytree(project.out, copy.root)
    before = tree(copy.root)
    sweep = write_sweep(tmp_path / "sweep.yaml", base=str(project.config), features=True, sae={"d_sae": [8, 16], "k": [2], "epochs": 20})
    capsys.readouterr()
    assert load_script("train/sweep.py").main(["-c", str(sweep), "-o", str(copy.root)]) == 0, capsys.readouterr().err
    after = tree(copy.root)
    # The run's files are the same files (config.yaml, manifest, features.parquet, report...); what
    # the sweep wrote is all under its own runs' folders and its summary.
    assert {path: after[path] for path in before} == before
    runs = ["d_sae8-k2", "d_sae16-k2"]
    new = {Path(path).parts[:2] for path in set(after) - set(before)}
    assert new == {("sae", run) for run in runs} | {("sae", "sweep_summary.csv"), ("sae", "sweep_summary.png")}
    # Each run's resolved config: the base's settings, the sweep's SAE, the run dir of -o.
    base = load_config(project.config)
    for run, d_sae in zip(runs, (8, 16)):
        cfg = load_config(copy.sae_run(run).run_config)
        assert (cfg.sae.d_sae, cfg.sae.k, cfg.out) == (d_sae, 2, copy.root)
        assert cfg.corpus == base.corpus and cfg.build == base.build and cfg.features == base.features
    with copy.sweep_summary_csv.open() as fh:
        rows = {r["run_name"]: r for r in csv.DictReader(fh)}
    for run in runs:
        tables = copy.sae_run(run).features
        features = read_table(tables.features).to_pylist()
        assert int(rows[run]["findings"]) == read_table(tables.findings).num_rows
        assert int(rows[run]["kept_latents"]) == len({f["latent"] for f in features if f["kept"]})
    assert any(int(r["findings"]) > 0 for r in rows.values())  # b's 'were' is found
    png = copy.sweep_summary_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # A sweep whose one run would train over the run's own SAE is refused, and writes nothing.
    code, err = bbox(capsys, "sweep", "-c", str(write_sweep(tmp_path / "own.yaml", base=str(project.config))), "-o", str(copy.root))
    assert_one_line_error(code, err, "the run's own SAE")
    assert tree(copy.root) == after
    # And the run's own stages are all still current: the sweep put nothing on its record.
    code, err = bbox(capsys, "run", "-c", str(copy.config), "-o", str(copy.root))
    assert code == 0 and err.count(": up to date") == len(stages.STAGES), err


@pytest.mark.parametrize("built", [None, "build"], ids=["no-build", "stale-build"])
def test_a_refused_sweep_leaves_the_file_tree_as_it_was(tmp_path, capsys, built):
    project = were_project(tmp_path)
    if built:
        assert bbox(capsys, "run", "-c", str(project.config), "--until", built)[0] == 0
    sweep = write_sweep(tmp_path / "sweep.yaml", base=str(project.config), features=True, sae={"d_sae": [8, 16]})
    before = tree(tmp_path)
    # Not current: the base's build settings, changed after the build, are not the build's.
    code, err = bbox(capsys, "sweep", "-c", str(sweep), "--set", "build.output_feature_weight=0.5", "--wandb-sweep-yaml", str(tmp_path / "w.yaml"))
    assert_one_line_error(code, err, f"sweep {sweep}", "'train' reads", f"base config {project.config}")
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "sweep, needles",
    [
        ({"base": "nope.yaml", "sae": {"k": [2]}}, ["base nope.yaml: config file not found", "working directory"]),
        ({"base": "BASE", "corpus": {"max_docs": 96}}, ["unknown key 'corpus' in a sweep file", "base config"]),
        ({"base": "BASE", "features": {"top_n": 5}}, ["'features' is true or false"]),
        ({"base": "BASE", "sae": [8, 16]}, ["'sae' must be a mapping"]),
        ({"base": "SWEEP"}, ["is a sweep file itself"]),
    ],
    ids=["missing-base", "copied-settings", "features-settings", "sae-list", "nested"],
)
def test_a_bad_sweep_file_is_one_line_naming_it(tmp_path, capsys, sweep, needles):
    project = make_project(tmp_path)
    path = tmp_path / "sweep.yaml"
    names = {"BASE": str(project.config), "SWEEP": str(path)}
    write_sweep(path, **{k: names.get(v, v) if isinstance(v, str) else v for k, v in sweep.items()})
    assert_one_line_error(*bbox(capsys, "sweep", "-c", str(path)), str(path), *needles)
