"""The paper's six model pairs ship as configs that load and carry the paper's settings (no downloads)."""

import pytest

from bbox_sae.config import config_from_dict, load_config, load_raw
from bbox_sae.scoring.stage import model_key
from helpers.repo import REPO, load_script

HUB = {
    "llama2-7b": "meta-llama/Llama-2-7b-hf",
    "llama2-7b-chat": "meta-llama/Llama-2-7b-chat-hf",
    "llama2-13b": "meta-llama/Llama-2-13b-hf",
    "olmo2-7b": "allenai/OLMo-2-1124-7B",
    "olmo2-7b-dpo": "allenai/OLMo-2-1124-7B-DPO",
    "olmo2-13b": "allenai/OLMo-2-1124-13B",
}
PAPER_PAIRS = {
    ("llama2-7b", "llama2-13b"),
    ("llama2-7b", "llama2-7b-chat"),
    ("llama2-7b", "olmo2-7b"),
    ("llama2-13b", "olmo2-13b"),
    ("olmo2-7b", "olmo2-13b"),
    ("olmo2-7b", "olmo2-7b-dpo"),
}
CONFIGS = sorted((REPO / "configs").glob("paper-*.yaml"))
MAX_POSITIONS = 4096  # Llama-2 and OLMo-2 (1124) alike


def _endpoint_config():
    return load_script("scripts/endpoint_config.py")


def test_one_config_per_paper_pair():
    pairs = [tuple(load_config(p).compare[0]) for p in CONFIGS]
    assert len(CONFIGS) == 6 and set(pairs) == PAPER_PAIRS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_paper_config_has_the_papers_setting(path):
    cfg = load_config(path)
    assert len(cfg.compare) == 1 and [m.name for m in cfg.models] == list(cfg.compare[0])
    assert cfg.output_dir == f"runs/{path.stem}"
    for m in cfg.models:
        assert m.source == "hf" and m.path == HUB[m.name]
        assert m.window <= MAX_POSITIONS and m.window - m.stride >= m.window // 2
        assert m.dtype == "bfloat16"
    assert cfg.embedding.model == "allenai/longformer-base-4096" and cfg.embedding.window + 2 <= 4096
    assert (cfg.sae.architecture, cfg.sae.d_sae, cfg.sae.k) == ("batchtopk", 3000, 50)
    assert cfg.build.output_feature_weight == 0.7 and cfg.build.performance == "probs"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_endpoint_config_serves_each_hub_model_on_its_own_ports(path):
    raw = _endpoint_config().endpoint_models(load_raw(path), base_port=8000, replicas=2, concurrency=8)
    local, remote = load_config(path), config_from_dict(raw)
    assert remote.compare == local.compare and remote.sae == local.sae and remote.embedding == local.embedding
    ports = [e for m in remote.models for e in m.endpoints]
    assert len(ports) == len(set(ports)) == 2 * len(remote.models)
    for i, (a, b) in enumerate(zip(local.models, remote.models)):
        assert b.source == "endpoint" and b.served_model == b.tokenizer == a.path and b.prompt_logprobs
        assert b.endpoints == [f"http://127.0.0.1:{8000 + 100 * i + r}" for r in range(2)]
        assert (b.window, b.stride, b.start_token) == (a.window, a.stride, a.start_token)
    # Workers with more or fewer replicas must share their finished shards.
    fewer = config_from_dict(_endpoint_config().endpoint_models(load_raw(path), base_port=9000, replicas=1, concurrency=2))
    assert [model_key(m) for m in fewer.models] == [model_key(m) for m in remote.models]


def test_the_paper_sweep_varies_only_the_sae_of_a_paper_config(monkeypatch):
    from bbox_sae.train.sweep_config import read_sweep

    monkeypatch.chdir(REPO)  # `base`, like every path in a config, is relative to the working directory
    sweep = read_sweep("configs/sweep-paper-dict-size.yaml", [], None)
    assert sweep.base in [p.relative_to(REPO) for p in CONFIGS] and sweep.features
    base = load_config(sweep.base)
    sizes = {(c.sae.d_sae, c.sae.k) for c in sweep.configs}
    assert (base.sae.d_sae, base.sae.k) in sizes and len({d for d, _ in sizes}) >= 3
    for cfg in sweep.configs:
        # The same build, output dir and features as the paper run, and the paper's SAE but for its size.
        assert cfg.model_dump(exclude={"sae"}) == base.model_dump(exclude={"sae"})
        assert cfg.sae.model_dump(exclude={"d_sae", "k", "run_name"}) == base.sae.model_dump(exclude={"d_sae", "k", "run_name"})
