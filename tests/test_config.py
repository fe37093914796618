import pytest
import yaml

from bbox_sae.config import load_config
from bbox_sae.errors import ConfigError

BASE = {
    "output_dir": "out",
    "corpus": {"path": "c.jsonl"},
    "models": [{"name": "a", "source": "parquet", "path": "a.parquet"}, {"name": "b", "source": "parquet", "path": "b.parquet"}],
}


def write(tmp_path, data):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(write(tmp_path, BASE), ["sae.k=7", "build.output_feature_weight=0.3", "models.1.window=64", "models.1.stride=32"], output_dir="elsewhere")
    assert cfg.sae.k == 7 and cfg.build.output_feature_weight == 0.3 and cfg.models[1].window == 64
    assert cfg.output_dir == "elsewhere"
    assert cfg.compare == [("a", "b")]
    assert cfg.build.output_feature_weight == 0.3 and cfg.features.top_n == 50


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"sae": {"dsae": 3}}, r"c.yaml: invalid config: unknown key 'sae.dsae'"),
        ({"sae": {"d_sae": "many"}}, r"'sae.d_sae': Input should be a valid integer"),
        ({"build": {"output_feature_weight": 1.5}}, r"'build.output_feature_weight'"),
        ({"compare": [["a", "zz"]]}, r"compare names unknown model 'zz'"),
        ({"models": [{"name": "a", "source": "hf"}, {"name": "b", "source": "parquet", "path": "x"}]}, r"source 'hf' needs `path`"),
        ({"sae": {"k": 10, "d_sae": 5}}, r"k \(10\) must be <= d_sae \(5\)"),
    ],
)
def test_bad_configs_name_the_key_and_file(tmp_path, patch, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, {**BASE, **patch}))


def test_bad_yaml_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml:\d+: invalid YAML"):
        load_config(write(tmp_path, "a: [1, 2\nb: 3"))
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(write(tmp_path, BASE), ["sae.k"])
    with pytest.raises(ConfigError, match="unknown key 'sae.nope'"):
        load_config(write(tmp_path, BASE), ["sae.nope=1"])


def test_every_shipped_config_validates(monkeypatch):
    from pathlib import Path

    from bbox_sae.train.sweep_config import read_sweep

    root = Path(__file__).parents[1]
    monkeypatch.chdir(root)  # a sweep file's base, like every config path, is relative to the working directory
    for path in sorted(root.glob("configs/*.yaml")):
        if path.name.startswith("planted-rules"):
            continue
        assert read_sweep(path, [], None).configs, path


def test_each_planted_config_names_its_own_rules():
    """`bbox eval planted -c configs/planted-handbook.yaml` must plant the handbook's rules, not the default ones."""
    from pathlib import Path

    from bbox_sae.evaluation import load_rules, planted_rules_path

    root = Path(__file__).parents[1]
    for corpus in ("handbook", "shakespeare"):
        cfg = load_config(root / "configs" / f"planted-{corpus}.yaml")
        assert planted_rules_path(cfg, None) == Path(f"configs/planted-rules-{corpus}.yaml")
        rules, _, _ = load_rules(root / planted_rules_path(cfg, None))
        assert len(rules) >= 6
        assert planted_rules_path(cfg, "mine.yaml") == Path("mine.yaml")
