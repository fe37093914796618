import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from bbox_sae.layout import checkpoint_complete
from bbox_sae.train.model import load_sae
from bbox_sae.train.sae import RowBatches, run_dir_for, run_train
from bbox_sae.train.sweep_config import read_sweep, wandb_sweep_spec
from helpers.hardening import interrupt_training
from helpers.planted import planted_run
from helpers.wandb_log import logged_bytes


@pytest.mark.parametrize("architecture,matrix_dtype", [("topk", "float32"), ("batchtopk", "float32"), ("topk", "float16")])
def test_recovers_planted_directions(tmp_path, architecture, matrix_dtype):
    cfg, directions = planted_run(tmp_path, architecture=architecture, matrix_dtype=matrix_dtype)
    metrics = run_train(cfg)
    sae = load_sae(run_dir_for(cfg))
    w = sae.W_dec.detach().numpy()
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    best = (directions @ w.T).max(axis=1)
    assert (best > 0.9).mean() >= 0.9
    assert metrics["holdout"]["explained_variance"] > 0.9
    assert metrics["holdout"]["mean_l0"] == pytest.approx(3, abs=0.5)
    sae_run = cfg.sae_paths
    for f in (sae_run.sae_config, sae_run.weights, sae_run.metrics, sae_run.run_config):
        assert f.exists()


def test_wandb_offline_run_has_the_logged_keys_and_no_artifact_per_checkpoint(tmp_path):
    cfg, _ = planted_run(tmp_path, n=3000, epochs=3, checkpoint_every=10)
    run_train(cfg)
    runs = list(cfg.paths.wandb.rglob("offline-run-*"))
    assert len(runs) == 1
    blob = logged_bytes(runs[0])
    for key in (
        b"losses/mse_loss",
        b"metrics/l0",
        b"sparsity/dead_features",
        b"metrics/explained_variance",
        b"eval/log10_activation_frequency",
        b"eval/holdout_mean_l0_training_mode",
    ):
        assert key in blob
    # sae-lens logs an artifact (cfg.json alone) at each checkpoint; the report logs the SAE once.
    assert b"log_feature_sparsity" not in blob and b"sae_None" not in blob
    assert not (tmp_path / "wandb").exists()


def test_resume_continues_the_step_count(tmp_path, monkeypatch):
    cfg, _ = planted_run(tmp_path, n=4000, epochs=6, checkpoint_every=10)
    from bbox_sae.train import sae as sae_mod

    interrupt_training(monkeypatch, 25)  # after the step-10 and step-20 checkpoints
    with pytest.raises(KeyboardInterrupt):
        run_train(cfg)
    monkeypatch.undo()
    checkpoints = sorted(int(p.name) for p in cfg.sae_paths.checkpoints.iterdir() if checkpoint_complete(p).exists())
    assert checkpoints, "a checkpoint was written before the kill"
    metrics = sae_mod.run_train(cfg, resume=True)
    assert metrics["resumed_from_step"] == 20
    total_steps = int(6 * np.sum(pq.read_table(cfg.paths.index)["split"].to_numpy(zero_copy_only=False) == "train")) // 512
    assert metrics["steps"] == total_steps
    assert metrics["rows_trained"] == (total_steps - 20) * 512


def test_only_the_newest_checkpoint_is_kept(tmp_path, monkeypatch):
    cfg, _ = planted_run(tmp_path, n=3000, epochs=6, checkpoint_every=5)
    interrupt_training(monkeypatch, 18)  # after the step-5, 10 and 15 checkpoints
    with pytest.raises(KeyboardInterrupt):
        run_train(cfg)
    checkpoints = cfg.sae_paths.checkpoints
    kept = [p for p in checkpoints.iterdir() if p.is_dir()]
    assert len(kept) == 1 and checkpoint_complete(kept[0]).exists(), kept
    monkeypatch.undo()
    metrics = run_train(cfg, resume=True)
    assert metrics["resumed_from_step"] == 15
    after = [p for p in checkpoints.iterdir() if p.is_dir()]
    assert len(after) == 1 and int(after[0].name) > int(kept[0].name), after  # 28 steps: the step-25 one


def test_batches_stream_from_the_memory_map(tmp_path):
    cfg, _ = planted_run(tmp_path, n=3000)
    matrix = np.load(cfg.paths.matrix, mmap_mode="r")
    assert isinstance(matrix, np.memmap)
    batches = RowBatches(matrix, np.arange(0, 3000, 2), batch_size=100, seed=0)
    seen = [next(batches) for _ in range(40)]  # 15 batches an epoch: into the third
    assert all(b.shape == (100, matrix.shape[1]) for b in seen)
    assert batches.rows_read_max == 100
    for position in (12, 15, 31):  # a batch depends on its position only, whatever was drawn before
        again = RowBatches(matrix, np.arange(0, 3000, 2), batch_size=100, seed=0, skip_batches=position)
        np.testing.assert_array_equal(next(again).numpy(), seen[position].numpy())
    epochs = [np.sort(np.concatenate([b.numpy()[:, 0] for b in seen[e * 15 : (e + 1) * 15]])) for e in range(2)]
    np.testing.assert_array_equal(epochs[0], epochs[1])  # every epoch is every row once
    assert not np.array_equal(seen[0].numpy(), seen[15].numpy())  # in a new order


def test_sweep_expands_the_cartesian_product(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "output_dir": str(tmp_path / "o"),
                "corpus": {"path": "x"},
                "models": [{"name": "a", "source": "parquet", "path": "x"}, {"name": "b", "source": "parquet", "path": "x"}],
                "sae": {"d_sae": [100, 300, 1000], "k": [25, 50], "lr": 0.001},
            }
        )
    )
    sweep = read_sweep(path, [], None)
    runs = sweep.configs
    assert sorted((c.sae.d_sae, c.sae.k) for c in runs) == [(d, k) for d in (100, 300, 1000) for k in (25, 50)]
    assert len({c.sae.resolved_run_name() for c in runs}) == 6
    assert all(c.sae.lr == 0.001 for c in runs)
    spec = wandb_sweep_spec(sweep)
    assert spec["parameters"]["sae.d_sae"]["values"] == [100, 300, 1000] and spec["method"] == "grid"


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    from bbox_sae.errors import NumericalError

    cfg, _ = planted_run(tmp_path, n=4000, epochs=6, checkpoint_every=10)
    original = RowBatches.__next__
    calls = {"n": 0}

    def poisoned(self):
        calls["n"] += 1
        batch = original(self)
        return batch * float("nan") if calls["n"] == 15 else batch

    monkeypatch.setattr(RowBatches, "__next__", poisoned)
    with pytest.raises(NumericalError, match="loss became nan at step 14"):
        run_train(cfg)
    kept = [p for p in cfg.sae_paths.checkpoints.iterdir() if checkpoint_complete(p).exists()]
    assert [p.name for p in kept] == [str(10 * 512)]  # step 10 only; nothing after the bad step


def test_saved_batchtopk_model_matches_training_mode_after_100_steps(tmp_path):
    from bbox_sae.train.model import evaluate

    cfg, _ = planted_run(tmp_path, n=6000, architecture="batchtopk", k=4, batch_size=256, total_rows=100 * 256, dead_feature_window=10)
    metrics = run_train(cfg)
    assert metrics["steps"] == 100 and metrics["rows_seen"] == 100 * 256
    matrix = np.load(cfg.paths.matrix, mmap_mode="r")
    split = pq.read_table(cfg.paths.index)["split"].to_numpy(zero_copy_only=False)
    holdout = np.flatnonzero(split == "holdout")
    sae = load_sae(run_dir_for(cfg))
    saved = evaluate(sae, matrix, holdout)
    training = metrics["training_mode"]["holdout"]
    assert saved["mean_l0"] == pytest.approx(4, rel=0.1)
    assert training["mean_l0"] == pytest.approx(4, rel=0.01)
    assert saved["explained_variance"] == pytest.approx(training["explained_variance"], abs=0.02)
    assert saved["explained_variance"] > 0.6
    # sae-lens's own threshold (a running average started at 0) is what the calibration replaces:
    # after 100 steps it fires far more than k latents.
    with torch.no_grad():
        sae.threshold.fill_(metrics["batchtopk_threshold"]["trained"])
    assert evaluate(sae, matrix, holdout)["mean_l0"] > 1.5 * 4


def test_a_run_too_short_for_its_dead_window_warns(tmp_path, caplog):
    cfg, _ = planted_run(tmp_path, n=3000, total_rows=30 * 512, dead_feature_window=100)
    with caplog.at_level("WARNING", logger="bbox_sae.train.sae"):
        metrics = run_train(cfg)
    assert len(metrics["warnings"]) == 1 and "30 training steps < 2 x sae.dead_feature_window (100)" in metrics["warnings"][0]
    assert "sae.total_rows >= 102400" in caplog.text
    cfg_ok, _ = planted_run(tmp_path / "ok", n=3000, total_rows=30 * 512, dead_feature_window=15)
    assert run_train(cfg_ok)["warnings"] == []


def test_interrupted_batchtopk_run_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch):
    """docs/reliability.md: a resumed BatchTopK SAE has the uninterrupted run's weights, and its
    threshold (a running estimate, recalibrated on save) within float noise."""
    settings = {"architecture": "batchtopk", "epochs": 6, "checkpoint_every": 10}
    reference_cfg, _ = planted_run(tmp_path / "reference", n=4000, **settings)
    run_train(reference_cfg)
    cfg, _ = planted_run(tmp_path / "interrupted", n=4000, **settings)
    interrupt_training(monkeypatch, 25)  # after the step-10 and step-20 checkpoints
    with pytest.raises(KeyboardInterrupt):
        run_train(cfg)
    monkeypatch.undo()
    assert run_train(cfg, resume=True)["resumed_from_step"] == 20
    resumed, reference = load_sae(run_dir_for(cfg)).state_dict(), load_sae(run_dir_for(reference_cfg)).state_dict()
    assert sorted(resumed) == sorted(reference)
    for name in reference:
        if name == "threshold":
            assert torch.allclose(resumed[name], reference[name], rtol=0, atol=1e-6), name
        else:
            assert torch.equal(resumed[name], reference[name]), name
