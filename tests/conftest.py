import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.assets import tiny_encoder_dir, tiny_lm_dir, tokenizer_dir  # noqa: E402

# Tests use one thread: with another CPU-heavy process on these 2 cores, 2 threads run 5-10x slower.
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Modules holding slow tests first: `make test`'s workers take whole modules in this order, and
    a long one handed out last kept one worker busy while the other sat idle (RESULTS.md, issue 58)."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)


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


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the report's browser tests (skipped where it is not installed)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed")
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as p:
        try:
            chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        except Error as err:
            pytest.skip(f"{CHROMIUM} failed to launch: {err.message.splitlines()[0]}")
        yield chromium
        chromium.close()
