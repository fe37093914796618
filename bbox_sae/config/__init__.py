"""The one config schema used by the CLI, `train/` and the tests.

A config is YAML validated by pydantic: unknown keys and wrong types are errors that name the key
and the file. `--set a.b=value` overrides are applied to the raw YAML before validation, so they
are checked exactly like the file. Every field says whether it is part of a stage's key
(`keys.py`).

- `schema.py`: `Config`, one section per stage (`inputs.py`: corpus, models, embedding;
  `analysis.py`: build, SAE, features, label, report, W&B), on the base in `section.py`
- `loading.py`: reading a config file (`unique_yaml.py`: YAML that refuses a repeated key)
- `overrides.py`: the `--set` parser
- `output_dir.py`: the run's folder and the resolved config saved there
"""

from bbox_sae.config.analysis import BuildConfig, FeaturesConfig, LabelConfig, ReportConfig, SAEConfig, WandbConfig
from bbox_sae.config.inputs import CorpusConfig, EmbeddingConfig, ModelConfig
from bbox_sae.config.keys import key_settings
from bbox_sae.config.loading import config_from_dict, load_config, load_raw
from bbox_sae.config.output_dir import check_saved_config, ensure_output_dir, save_resolved
from bbox_sae.config.overrides import apply_overrides
from bbox_sae.config.schema import SECTIONS, Config, reading

__all__ = [
    "BuildConfig",
    "Config",
    "CorpusConfig",
    "EmbeddingConfig",
    "SECTIONS",
    "FeaturesConfig",
    "LabelConfig",
    "ModelConfig",
    "ReportConfig",
    "SAEConfig",
    "WandbConfig",
    "apply_overrides",
    "check_saved_config",
    "config_from_dict",
    "ensure_output_dir",
    "key_settings",
    "load_config",
    "load_raw",
    "reading",
    "save_resolved",
]
