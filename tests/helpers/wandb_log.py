"""What an offline W&B run logged, read back from its files: the tables W&B writes as JSON, and the
summary, which offline mode keeps only in the run's `.wandb` record log (no `wandb-summary.json`).

The log is LevelDB-framed: 32 KiB blocks, the first opening with a 7-byte file header, every
fragment of a record with a 7-byte header (CRC, length, type). A summary item can straddle a
block, so the fragments are joined before it is searched."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path


def logged_table(run_dir: Path, key: str) -> dict:
    """The table logged under `key`, as {"columns": [...], "data": [[...], ...]}."""
    (path,) = (run_dir / "files" / "media" / "table").glob(f"{key}_*.table.json")
    return json.loads(path.read_text())


def logged_rows(run_dir: Path, key: str) -> list[dict]:
    table = logged_table(run_dir, key)
    return [dict(zip(table["columns"], row)) for row in table["data"]]


BLOCK = 32768
HEADER = 7


def _payload(raw: bytes) -> bytes:
    """The log's record bytes with the framing taken out (fragments joined in order)."""
    out, at = bytearray(), HEADER
    while at + HEADER <= len(raw):
        room = BLOCK - at % BLOCK
        if room < HEADER:  # a block's tail too short for a header is padding
            at += room
            continue
        length = int.from_bytes(raw[at + 4 : at + 6], "little")
        out += raw[at + HEADER : at + HEADER + length]
        at += HEADER + length
    return bytes(out)


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


SETTLE_S, SETTLE_WAIT_S = 0.5, 60.0


def logged_bytes(run_dir: Path) -> bytes:
    """Every record the run's `.wandb` log holds, unframed: a name searched in the raw file can
    straddle a block boundary (CI once missed an artifact's name that way). W&B's service process
    may still be writing the log when `finish()` has returned (a clean-clone CI read it empty), so
    it is read once its size has stopped changing for `SETTLE_S`."""
    (log,) = run_dir.glob("*.wandb")
    deadline, size = time.monotonic() + SETTLE_WAIT_S, -1
    while time.monotonic() < deadline:
        now = log.stat().st_size
        if now == size and now > HEADER:
            break
        size = now
        time.sleep(SETTLE_S)
    return _payload(log.read_bytes())


def logged_summary(run_dir: Path, prefix: str) -> dict:
    """The summary items whose key starts with `prefix`, the last value of each: a SummaryItem is
    `key` (field 1) then `value_json` (field 16, tag bytes 0x82 0x01), each length-prefixed."""
    raw = logged_bytes(run_dir)
    out = {}
    for match in re.finditer(rb"\n([\x01-\x7f])(" + re.escape(prefix.encode()) + rb"[^\x00-\x1f]*?)\x82\x01", raw):
        if len(match.group(2)) != match.group(1)[0]:
            continue
        length, at = _varint(raw, match.end())
        out[match.group(2).decode()] = json.loads(raw[at : at + length])
    return out
