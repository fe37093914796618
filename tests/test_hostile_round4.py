"""Issue 41 (hostile review, round 4): the LLM endpoint, refusals with side effects, markup and
terminal injection, and numbers no machine holds. Each case asserts what the user sees (exit code,
one line naming the file or field) and what is kept on disk (inputs hashed before and after)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bbox_sae.config.output_dir import SAVED_HEADER
from helpers.cli import assert_one_line_error, bbox
from helpers.project import SMALL_RUN, Project, make_project


@pytest.fixture()
def project(tmp_path) -> Project:
    return make_project(tmp_path, **SMALL_RUN)


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- 1: a run never writes over its own input


@pytest.mark.parametrize("command", [["run"], ["ingest"], ["report"], ["eval", "coherence"]])
def test_an_output_dir_holding_the_users_own_config_yaml_is_refused(tmp_path, capsys, command):
    """`bbox run -c config.yaml -o .` in a project folder overwrote that very config.yaml."""
    project = make_project(tmp_path, config_name="config.yaml", **SMALL_RUN)
    before = digests(project.root)
    code, err = bbox(capsys, *command, "-c", str(project.config), "-o", str(project.root))
    assert_one_line_error(code, err, f"output_dir {project.root}: holds config.yaml, which bbox did not write", "choose another output dir (-o)")
    assert digests(project.root) == before and sorted(p.name for p in project.root.iterdir()) == sorted(before)


def test_the_runs_own_config_yaml_is_rewritten_and_says_who_wrote_it(project, capsys):
    code, err = bbox(capsys, "run", "-c", str(project.config), "--until", "ingest")
    assert code == 0, err
    saved = project.paths.config
    assert saved.read_text().startswith(SAVED_HEADER)
    code, err = bbox(capsys, "run", "-c", str(project.config), "--until", "ingest", "--set", "seed=3")
    assert code == 0, err
    assert "\nseed: 3\n" in saved.read_text()
    # A run's config.yaml saved before the header existed (the config's canonical dump) is the tool's too.
    saved.write_text(saved.read_text().removeprefix(SAVED_HEADER))
    code, err = bbox(capsys, "run", "-c", str(project.config), "--until", "ingest")
    assert code == 0, err
    assert saved.read_text().startswith(SAVED_HEADER)
    # Edited by hand, it is no longer the tool's record: refused, and left as it is.
    saved.write_text(saved.read_text().removeprefix(SAVED_HEADER).replace("seed: 0", "seed: 0 # mine"))
    kept = saved.read_bytes()
    assert_one_line_error(*bbox(capsys, "run", "-c", str(project.config), "--until", "ingest"), "which bbox did not write")
    assert saved.read_bytes() == kept


def test_a_dangling_or_looping_symlink_as_output_dir_is_named_as_such(tmp_path, capsys):
    """Item 18: it said only `File exists`."""
    project = make_project(tmp_path, **SMALL_RUN)
    dangling, loop = tmp_path / "dangling", tmp_path / "loop"
    dangling.symlink_to(tmp_path / "nowhere")
    loop.symlink_to(loop)
    for out in (dangling, loop):
        code, err = bbox(capsys, "run", "-c", str(project.config), "-o", str(out))
        assert_one_line_error(code, err, f"output_dir {out}: is a symlink to", "which does not resolve (dangling, or a loop)")
    assert not (tmp_path / "nowhere").exists() and not project.out.exists()
