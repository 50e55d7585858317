"""Where a package's files are read from, for the adapters that import one file of a package whose
``__init__`` would build or import CUDA extensions (``causal_conv1d.py``, ``mamba_ssm.py``): an
unpacked sdist named by an environment variable (the folder holding ``PKG-INFO`` and the package
folder), else the installed package, its version checked against the one the adapter reads.

Oracle: none of its own (a file lookup); the adapters' tests check the refusals.  Expected error:
not applicable.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata
from pathlib import Path


def sdist_or_install_root(*, env: str, file: Path, package: str, label: str, dist: str, version: str, how: str,
                          error: type[Exception], resolve: bool) -> tuple[Path, str]:
    """``(root, version found)``: the folder holding ``package/`` -- ``$env`` when set (its ``file``
    checked; ``resolve``: the path with ``~`` expanded and made absolute, else as given), otherwise
    the installed ``package`` -- whose version is ``version``.  Anything else raises ``error`` with one
    line starting with ``label`` and ending with ``how``; ``dist`` is the distribution's name in it."""
    given = os.environ.get(env)
    if given:
        root = Path(given).expanduser().resolve() if resolve else Path(given)
        if not (root / file).is_file():
            raise error(f"{label}: {env}={given} has no {file}; {how}")
        info = root / "PKG-INFO"
        have = next((ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
                     if ln.startswith("Version:")), "unknown") if info.is_file() else "unknown"
    else:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise error(f"{label}: package not installed and {env} not set; {how}")
        root = Path(list(spec.submodule_search_locations)[0]).parent
        try:
            have = metadata.version(package)
        except metadata.PackageNotFoundError:
            have = "unknown"
    if have != version:
        raise error(f"{label} {have} at {root}: the adapter reads {dist} {version}; {how}")
    return root, have
