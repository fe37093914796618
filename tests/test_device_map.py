"""`models[].device_map` (a model larger than one GPU, scored in process): the setting reaches
`from_pretrained`, the model it places scores exactly as the one moved whole to its device, and a
value accelerate does not know, or a model not scored in process, is a one-line config error."""

from __future__ import annotations

import numpy as np
import pytest

from bbox_sae.errors import ConfigError
from helpers.project import SENTENCES, make_project, tiny_model


def test_device_map_reaches_from_pretrained_and_changes_no_score(tmp_path, monkeypatch):
    import transformers

    from bbox_sae.scoring.stage import make_scorer

    loads = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def recorded(*args, **kwargs):
        loads.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recorded)
    models = [tiny_model("mapped", device="cpu", dtype="float32", device_map="auto"), tiny_model("whole", device="cpu", dtype="float32")]
    cfg = make_project(tmp_path, docs=None, models=models).load()
    mapped, whole = make_scorer(cfg.model("mapped"), cfg), make_scorer(cfg.model("whole"), cfg)
    assert loads[0].get("device_map") == "auto" and "device_map" not in loads[1]
    # Placed by from_pretrained on the only device here, and left there by the scorer.
    assert {p.device.type for p in mapped.model.parameters()} == {"cpu"}
    docs = [(f"d{i}", s) for i, s in enumerate(SENTENCES)]
    for a, b in zip(mapped.score(docs), whole.score(docs), strict=True):
        assert np.array_equal(a.logprobs, b.logprobs)


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"device_map": "everywhere"}, "device_map"),
        ({"source": "parquet", "path": "x.parquet", "device_map": "auto"}, "device_map applies to models scored in process"),
    ],
)
def test_a_device_map_that_cannot_apply_is_refused_when_the_config_loads(tmp_path, entry, needle):
    models = [{**tiny_model("a"), **entry}, tiny_model("b")]
    with pytest.raises(ConfigError, match=needle) as err:
        make_project(tmp_path, docs=None, models=models).load()
    assert "\n" not in str(err.value)
