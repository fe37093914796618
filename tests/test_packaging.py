"""The wheel ships every module; dependencies are ranges, and constraints.txt is the tested set inside them."""

import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from setuptools import find_packages

from helpers.repo import REPO as ROOT
from helpers.repo import load_script

freeze = load_script("scripts/freeze_constraints.py")
constraints_text, installed_closure, project_requirements = freeze.constraints_text, freeze.installed_closure, freeze.project_requirements

# Calendar-versioned: a new year is not a breaking release, so no ceiling.
NO_CEILING = {"regex"}


def test_every_package_folder_is_found_by_setuptools():
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "bbox_sae").rglob("*.py") if "__pycache__" not in p.parts}
    assert folders <= set(find_packages(where=str(ROOT), include=["bbox_sae*"]))


def constraints() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_every_dependency_is_a_range_from_a_floor_to_a_ceiling():
    for req in project_requirements():
        operators = {s.operator for s in req.specifier}
        assert not operators & {"==", "==="}, f"{req}: a pin belongs in constraints.txt, pyproject.toml gives a range"
        assert ">=" in operators, f"{req}: no lower bound (a version the tests passed with)"
        if canonicalize_name(req.name) not in NO_CEILING:
            assert "<" in operators, f"{req}: no upper bound (the next major, or minor for 0.x)"


def test_every_pin_lies_inside_its_pyproject_range():
    pins = constraints()
    for req in project_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"constraints.txt {name}=={pins[name]} is outside pyproject's {req}"


def test_constraints_pin_neither_bbox_sae_nor_a_local_build():
    assert "bbox-sae" not in constraints()
    # `torch==2.13.0+cpu` would refuse the CUDA build of the same release on a GPU box.
    assert not re.search(r"==\S*\+", (ROOT / "constraints.txt").read_text())


def test_constraints_are_the_installed_set():
    assert (ROOT / "constraints.txt").read_text() == constraints_text(), (
        "constraints.txt differs from this venv: after changing a dependency, .venv/bin/python scripts/freeze_constraints.py > constraints.txt"
    )


@pytest.mark.parametrize(
    "requires, expected",
    [
        # An extra's requirements count only when the extra is asked for; markers are evaluated.
        (
            {"app": ["lib[fast]>=1", "tool; extra == 'dev'", "winonly; sys_platform == 'nonexistent'"], "lib": ["c; extra == 'fast'"], "c": [], "tool": []},
            {"app", "lib", "c"},
        ),
        # A cycle ends; a package reached again with a new extra is followed again.
        ({"app": ["lib", "other"], "lib": ["app", "c; extra == 'x'"], "other": ["lib[x]"], "c": []}, {"app", "lib", "other", "c"}),
    ],
)
def test_the_closure_follows_requirements_extras_and_markers(requires, expected):
    closure = installed_closure([Requirement("app")], version_of=lambda name: "1.0+cpu", requires_of=lambda name: requires[name])
    assert set(closure) == expected
    assert set(closure.values()) == {"1.0"}


def test_make_setup_installs_with_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    stamp_rule = re.search(r"^\$\(STAMP\):(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert stamp_rule, "Makefile: no $(STAMP) rule"
    prerequisites, recipe = stamp_rule.groups()
    assert "constraints.txt" in prerequisites.split()
    installs = [line for line in recipe.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs
    for line in installs:
        assert "-c constraints.txt" in line, f"installs without the constraints: {line.strip()}"
