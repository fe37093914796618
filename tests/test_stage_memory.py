"""benchmarks/stage_memory.py reads a stage's large allocations from its strace: anonymous
read-write mappings, followed through munmap and mremap, reservations left out."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys

import pytest

from helpers.repo import load_script

memory = load_script("benchmarks/stage_memory.py")
MiB = 2**20


def test_large_allocations_are_followed_from_mapping_to_release(tmp_path):
    trace = tmp_path / "trace"
    trace.write_text(
        "\n".join(
            [
                f"7 10.0 mmap(NULL, {64 * MiB}, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f0000000000",
                f"7 10.5 mmap(NULL, {128 * MiB}, PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE, -1, 0) = 0x7f1000000000",
                f"7 10.6 mmap(0x2b000000000, {1024 * MiB}, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE, -1, 0) = 0x2b000000000",
                f"7 11.0 mmap(NULL, {400 * MiB}, PROT_READ, MAP_SHARED, 3, 0) = 0x7f2000000000",  # a file: the matrix
                f"8 11.5 mmap(NULL, {1 * MiB}, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f3000000000",  # small
                f"7 12.0 mremap(0x7f0000000000, {64 * MiB}, {96 * MiB}, MREMAP_MAYMOVE) = 0x7f4000000000",
                f"8 13.0 mmap(NULL, {40 * MiB}, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f5000000000",
                f"8 14.0 munmap(0x7f5000000000, {40 * MiB}) = 0",
            ]
        )
        + "\n"
    )
    found = sorted(memory.anonymous_allocations(trace), key=lambda a: a["at"])
    assert [(a["bytes"] // MiB, a["at"], a["until"]) for a in found] == [(64, 10.0, 12.0), (96, 12.0, None), (40, 13.0, 14.0)]


def test_steps_are_the_bars_and_lines_a_stage_prints_and_when_a_bar_is_gone():
    printed = (
        "features: encode train:  50%|##   | 1/2 [00:01<00:01]\rfeatures: encode train: 100%|#####| 2/2 [00:02<00:00]\r" + " " * 40 + "\rkept 3 findings\n"
    )
    steps: list = []
    memory.follow_steps(io.StringIO(printed), steps)
    assert [s for _, s in steps] == ["features: encode train", "after features: encode train", "kept 3 findings"]
    assert memory.step_at(steps, steps[1][0]) == "after features: encode train"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_traced_process_shows_its_one_large_array(tmp_path):
    trace = tmp_path / "trace"
    code = "import numpy as np; a = np.ones(100 * 2**20 // 8); del a"
    subprocess.run(["strace", "-f", "-ttt", "-e", "trace=mmap,munmap,mremap", "-o", str(trace), sys.executable, "-c", code], check=True)
    sizes = [a["bytes"] for a in memory.anonymous_allocations(trace)]
    assert any(100 * MiB <= s < 100 * MiB + 2 * MiB for s in sizes)
