"""The tree is ruff-clean, lint and format, under the config in pyproject.toml."""

import subprocess
import sys

from helpers.repo import REPO


def test_ruff_lint_and_format_pass():
    for args in (["check", "."], ["format", "--check", "."]):
        done = subprocess.run([sys.executable, "-m", "ruff", *args, "--no-cache"], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
