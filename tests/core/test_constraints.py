"""constraints/test.txt pins, for ./dev, .ci/run and nox, one version of every dependency the package
and its test extra name, inside the range pyproject.toml declares (issue 46: a fresh machine gets
what CI ran, and a deliberate upgrade stays within the supported ranges).

Oracle: pyproject.toml's requirements, read with ``packaging``; the constraints file's ``name==version``
lines.
"""

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints" / "test.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints/test.txt: {line!r} is not NAME==VERSION"
            assert _norm(name) not in pins, f"constraints/test.txt: {name} pinned twice"
            pins[_norm(name)] = version
    return pins


def test_every_dependency_is_pinned_inside_its_declared_range():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    reqs = [Requirement(r) for r in [*meta["dependencies"], *meta["optional-dependencies"]["dev"],
                                     *meta["optional-dependencies"]["test"]]]
    for req in reqs:
        if req.marker is not None:  # tomli, for Python < 3.11 only (CI runs 3.11)
            continue
        assert _norm(req.name) in pins, f"{req.name}: not pinned in constraints/test.txt"
        assert req.specifier.contains(pins[_norm(req.name)], prereleases=True), \
            f"{req.name}=={pins[_norm(req.name)]} is outside pyproject.toml's {req.specifier}"
        assert "<" in str(req.specifier), f"{req.name}: pyproject.toml gives no upper bound ({req.specifier})"


def test_the_installers_use_the_constraints():
    for script in ("dev", ".ci/run", "noxfile.py"):
        assert "constraints/test.txt" in (ROOT / script).read_text(), script
    assert "# ---- torch" in (ROOT / "constraints" / "test.txt").read_text()  # the section ./dev and nox drop
