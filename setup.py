"""Packaging: the package list is found, not written.  pyproject.toml holds everything else,
including ``package-dir`` (which folder installs as which ``replayssm.*`` package); every folder
with an ``__init__.py`` under those folders is a package, so a new op family
(``replayssm/ops/<name>/``) or check folder needs no packaging line."""

import sys
from pathlib import Path

from setuptools import find_packages, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (tomli is a build requirement there)
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def packages() -> list[str]:
    """Every package-dir name and the packages found under its folder."""
    found = {f"{name}.{sub}" for name, folder in PACKAGE_DIR.items() for sub in find_packages(str(HERE / folder))}
    return sorted(set(PACKAGE_DIR) | found)


setup(packages=packages())
