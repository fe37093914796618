"""A modern-prose evaluation corpus: the Debian Administrator's Handbook (Debian package
`debian-handbook`, English HTML, CC BY-SA / GPL-2+).

`python -m bbox_sae.corpus.prose DIR` fetches the .deb once with `apt-get download` (the
package registry, no install), keeps the running prose of the English edition (its
`<div class="para">` blocks: no code listings, tables or menus), and cuts each chapter into
documents of about 200 words at paragraph ends, paragraphs separated by a blank line.
Writes `DIR/handbook.jsonl` with the chapter as `domain`. It complements the Shakespeare demo
corpus (verse and drama) in the planted-difference evaluation.
"""

from __future__ import annotations

import html
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import regex

from bbox_sae.artifacts import atomic_write_text
from bbox_sae.corpus.files import BUNDLED_CORPORA
from bbox_sae.corpus.words import pack_pieces

PACKAGE = "debian-handbook"
WORDS_PER_DOC = 200
HTML_DIR = "usr/share/doc/debian-handbook/html/en-US"


def download_deb(directory: Path) -> Path:
    found = sorted(directory.glob(f"{PACKAGE}_*.deb"))
    if found:
        return found[-1]
    directory.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["apt-get", "download", PACKAGE], cwd=directory, capture_output=True, text=True)
    found = sorted(directory.glob(f"{PACKAGE}_*.deb"))
    if not found:
        raise SystemExit(f"prose corpus: `apt-get download {PACKAGE}` failed (run `apt-get update` first?): {result.stderr.strip()[-300:]}")
    return found[-1]


def paragraphs(page: str) -> list[str]:
    """The prose paragraphs of one handbook page, tags stripped and whitespace collapsed."""
    out = []
    for block in regex.findall(r'<div class="para"[^>]*>(.*?)</div>', page, flags=regex.S):
        text = " ".join(html.unescape(regex.sub(r"<[^>]+>", "", block)).split())
        if len(text.split()) >= 5:
            out.append(text)
    return out


def cut_chapter(paras: list[str], words_per_doc: int = WORDS_PER_DOC) -> list[str]:
    return pack_pieces(paras, words_per_doc)


def build(directory: Path) -> Path:
    target = directory / BUNDLED_CORPORA["bbox_sae.corpus.prose"]
    if target.exists():
        return target
    deb = download_deb(directory / "download")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
        pages = sorted((Path(tmp) / HTML_DIR).glob("*.html"))
        chapters = {p.stem: cut_chapter(paragraphs(p.read_text(encoding="utf-8"))) for p in pages}
    lines = [
        json.dumps({"id": f"{name}-{i:03d}", "text": doc, "domain": name}, ensure_ascii=False) for name, docs in chapters.items() for i, doc in enumerate(docs)
    ]
    atomic_write_text(target, "\n".join(lines) + "\n")
    return target


if __name__ == "__main__":
    path = build(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/corpus"))
    print(f"prose corpus: {path} ({sum(1 for _ in open(path))} documents)")
