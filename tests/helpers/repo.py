"""The repository the tests run in: its root, and its scripts (benchmarks/, scripts/, train/:
folders that are not packages) loaded as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """The script at `relative` (to the repository root) as a module, `train/sweep.py` as `train_sweep`."""
    path = REPO / relative
    name = f"{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered first, as an import would: its dataclasses look their module up while it runs.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
