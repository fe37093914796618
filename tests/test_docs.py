"""The documentation names only what exists: repo paths, README sections it cites, Makefile targets with a recipe."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Folders of the repository itself; paths under runs/ and .cache/ are outputs and are not checked.
REPO_FOLDERS = ("bbox_sae", "benchmarks", "configs", "docs", "scripts", "tests", "train")
# Outputs inside the repo: benchmarks/gpu_check.sh writes here when run without $OUT.
OUTPUT_PATHS = ("benchmarks/results/gpu/",)
REPO_PATH = re.compile(rf"(?<![\w./-])(?:{'|'.join(REPO_FOLDERS)})/[\w.*/-]*")
README_SECTION = re.compile(r"README(?:\.md)?, \"([^\"]+)\"")
MAX_README_LINES = 260


def documents() -> dict[Path, str]:
    """Each document with the text in which paths are claims: all of a Markdown page or script, a config's comments."""
    docs = {ROOT / "README.md": (ROOT / "README.md").read_text()}
    for path in [*(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.md"), *(ROOT / "scripts").iterdir()]:
        docs[path] = path.read_text()
    for path in (ROOT / "configs").glob("*.yaml"):
        docs[path] = "\n".join(line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line)
    return docs


def mentioned_paths(text: str) -> set[str]:
    return {m.rstrip(".-") for m in REPO_PATH.findall(text)}


def exists(path: str) -> bool:
    if path.startswith(OUTPUT_PATHS):
        return True
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def test_every_repo_path_the_docs_mention_exists():
    missing = [f"{doc.relative_to(ROOT)}: {p}" for doc, text in documents().items() for p in sorted(mentioned_paths(text)) if not exists(p)]
    assert not missing, "paths named in the docs that are not in the repo:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "text, found",
    [
        ("see `configs/demo.yaml` and docs/artifacts.md.", {"configs/demo.yaml", "docs/artifacts.md"}),
        ("the six `configs/paper-*.yaml`", {"configs/paper-*.yaml"}),
        ("`tests/test_cli.py::test_x`, `benchmarks/results/<name>.json`", {"tests/test_cli.py", "benchmarks/results/"}),
        # Output paths and paths inside a run are not the repo's.
        ("runs/demo/sae/x, .cache/corpus/docs/a.md, <output_dir>/build/matrix.npy", set()),
    ],
)
def test_paths_are_found_where_prose_names_them(text, found):
    assert mentioned_paths(text) == found


def test_a_missing_path_is_caught():
    assert not exists("configs/planted-rules.yaml")
    assert exists("configs/planted-rules-*.yaml") and exists("docs/") and exists("configs/demo.yaml")


def test_readme_sections_cited_elsewhere_exist():
    headings = {line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("#")}
    cited = [(doc, name) for doc, text in documents().items() for name in README_SECTION.findall(text)]
    assert cited, "no citation found: the pattern no longer matches how configs cite the README"
    missing = [f'{doc.relative_to(ROOT)}: README, "{name}"' for doc, name in cited if name not in headings]
    assert not missing, "README sections cited that do not exist:\n" + "\n".join(missing)


def test_every_phony_makefile_target_has_a_recipe():
    makefile = (ROOT / "Makefile").read_text()
    (phony,) = re.findall(r"^\.PHONY:(.*)$", makefile, re.M)
    for target in phony.split():
        rule = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)*)", makefile, re.M)
        assert rule, f"Makefile: .PHONY target '{target}' has no rule"
        prerequisites = re.search(rf"^{re.escape(target)}:(.*)$", makefile, re.M).group(1).split()
        assert rule.group(1).strip() or prerequisites, f"Makefile: .PHONY target '{target}' does nothing"


def test_readme_is_a_manual_of_bounded_length():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; measurements and their history belong in benchmarks/RESULTS.md"
