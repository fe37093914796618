"""The `bbox` command as a user sees it: its exit code and what it printed, in this process or in
a fresh one, and the one-line error every failure must be."""

from __future__ import annotations

import subprocess
import sys

from bbox_sae.cli import main


def bbox(capsys, *args) -> tuple[int, str]:
    """`bbox <args>` in this process (the same code path as the command): exit code and stderr."""
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def bbox_process(*args: str, timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
    """`bbox <args>` in a fresh Python process."""
    return subprocess.run([sys.executable, "-m", "bbox_sae", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    """Exit 2, and the error is one line, the last (`bbox run` prints its progress lines before it)."""
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert "Traceback" not in err and lines and lines[-1].startswith("bbox: error: "), err
    assert sum("error" in line for line in lines) == 1, err
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]
