"""The drift output folder's files: atomic writes, the cell result and checkpoint paths, and the
quarantine a foreign or corrupt checkpoint is moved to.

Oracle: none of its own (file handling); a write is all or nothing (tests/jobs/test_drift_provenance.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from replayssm.guard import out_path
from replayssm.validators.engine import checkpoint_file
from replayssm.validators.jobs.drift.cells import CellSpec


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``:
    after a kill, ``path`` is either the old file or the complete new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, p)


# ---- one cell ----------------------------------------------------------------------------------------------

def _read_json(p: Path) -> dict | None:
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def cell_path(out: Path, cell_id: str) -> Path:
    return out_path(Path(out) / "cells", f"{cell_id}.json", "cell id")


def ckpt_path(out: Path, cell_id: str) -> Path:
    return out_path(Path(out) / "checkpoints", f"{cell_id}{checkpoint_file.SUFFIX}", "cell id")


def quarantine_path(out: Path) -> Path:
    """Where checkpoints that cannot be used are set aside (never loaded, never deleted)."""
    return out / "quarantine"


def _set_aside(out: Path, path: Path, spec: CellSpec, why: str) -> None:
    """Move an unusable checkpoint of ``spec`` into ``quarantine/`` with one line on stderr."""
    dest = checkpoint_file.set_aside(path, quarantine_path(out))
    print(f"replayssm: drift: checkpoint {path} set aside as {dest}: {' '.join(why.split())}; "
          f"cell {spec.id} recomputed from its start", file=sys.stderr, flush=True)


