"""Golden data of replayssm, installed as package data of ``replayssm.golden``.

* ``tolerances.toml``: the drift budgets (validators/jobs/drift/budgets.py, ``replayssm drift --check``);
* ``regressions/*.json``: the regression corpus (validators/jobs/fuzz/regressions.py);
* ``trajectories/``: fp64 golden trajectories of the reference on the canonical scenarios, with a
  sha256 manifest and provenance (``replayssm golden verify|regenerate``, replayssm/cli_golden.py).

The folder stays at the top level of the repository; pyproject.toml maps it to
``replayssm.golden`` and lists its data files, so an editable and a wheel install find the same
files through :func:`path`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def path(*parts: str) -> Path:
    """The file-system path of ``parts`` under the installed golden data (it may not exist yet)."""
    return Path(str(files(__name__).joinpath(*parts)))


__all__ = ["path"]
