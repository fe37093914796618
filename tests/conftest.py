import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

# Tests use one thread: with another CPU-heavy process on these 2 cores, 2 threads run 5-10x slower.
torch.set_num_threads(1)

from assets import tiny_encoder_dir, tiny_lm_dir, tokenizer_dir  # noqa: E402


@pytest.fixture(scope="session")
def tokenizers():
    from transformers import AutoTokenizer

    return {k: AutoTokenizer.from_pretrained(tokenizer_dir(k)) for k in ("smollm2", "gemma", "minilm")}


@pytest.fixture(scope="session")
def tiny_lm():
    return tiny_lm_dir


@pytest.fixture(scope="session")
def tiny_encoder():
    return tiny_encoder_dir()
