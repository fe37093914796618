"""The wheel ships every module: each folder of the package is a regular package that setuptools finds."""

from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_found_by_setuptools():
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "bbox_sae").rglob("*.py") if "__pycache__" not in p.parts}
    assert folders <= set(find_packages(where=str(ROOT), include=["bbox_sae*"]))
