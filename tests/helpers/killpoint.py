"""Run the `bbox` CLI and stop it at its N-th kill point, so a test can SIGKILL it exactly there.

Kill points, counted in call order:
- every atomic file write (`bbox_sae.artifacts.atomic_write_bytes`: shards, sidecars, tables,
  JSON): the process stops with the write's temp file half written, the worst moment;
- every row group the build stage streams into its index (`ParquetWriter.write_table`), with
  the memory-mapped matrix half filled;
- every SAE training batch (`RowBatches.__next__`).

    python tests/helpers/killpoint.py SIGNAL_FILE N -- <bbox arguments>

At kill point N the process writes SIGNAL_FILE (naming the point) and sleeps until killed.
The library is not changed: the hooks are installed here, around the real CLI entry point.
`install(0, None, setattr)` only counts (the tests count the points of an uninterrupted run).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path


def install(target: int, signal_file: Path | None, set_attr) -> dict:
    """Wrap the kill points with `set_attr(obj, name, value)` (setattr, or a MonkeyPatch's)."""
    import pyarrow.parquet as pq

    from bbox_sae import artifacts
    from bbox_sae.train import sae

    counter = {"n": 0, "points": []}

    def reached(what: str) -> bool:
        counter["n"] += 1
        counter["points"].append(what)
        return counter["n"] == target

    def stop(what: str) -> None:
        signal_file.write_text(f"{counter['n']} {what}\n")
        while True:  # wait for SIGKILL
            time.sleep(60)

    real_write = artifacts.atomic_write_bytes

    def write(path, data):
        path = Path(path)
        if reached(f"write {path}"):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, _ = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.write(fd, data[: len(data) // 2])
            os.fsync(fd)
            stop(f"write {path}")
        return real_write(path, data)

    real_row_group = pq.ParquetWriter.write_table

    def row_group(self, table, *args, **kwargs):
        # Only writers streaming to a file (the build index); `atomic_write_table` encodes in memory.
        if isinstance(self.where, (str, Path)) and reached(f"row group of {self.where}"):
            stop(f"row group of {self.where}")
        return real_row_group(self, table, *args, **kwargs)

    real_next = sae.RowBatches.__next__

    def next_batch(self):
        if reached(f"batch {self.position}"):
            stop(f"batch {self.position}")
        return real_next(self)

    set_attr(artifacts, "atomic_write_bytes", write)
    set_attr(pq.ParquetWriter, "write_table", row_group)
    set_attr(sae.RowBatches, "__next__", next_batch)
    return counter


if __name__ == "__main__":
    signal, n, sep, *args = sys.argv[1:]
    assert sep == "--", sys.argv
    install(int(n), Path(signal), setattr)
    from bbox_sae.cli import main

    raise SystemExit(main(args))
