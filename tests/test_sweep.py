import csv

import yaml

from bbox_sae import stages
from bbox_sae.train.sweep import MAX_L0_OFF_K, run_flags, run_sweep
from helpers.planted import planted_run


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
    monkeypatch.setattr(stages, "require_current_inputs", lambda stage, cfg: None)
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
    summary_runs = [p for p in cfg.paths.wandb.rglob("offline-run-*") if b"sweep/summary" in next(p.glob("*.wandb")).read_bytes()]
    assert len(summary_runs) == 1
