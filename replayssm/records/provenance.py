"""Where a measurement came from: the commit (and whether the code that ran differs from it), the
device, the versions.  The one implementation every job and report asks (drift budgets, the
mutation gallery, the benchmark tables, records).

Oracle: none (git, torch and nvidia-smi are asked; nothing is computed).
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from replayssm import __version__

ROOT = Path(__file__).resolve().parents[2]  # the checkout (an editable install) or site-packages
UNKNOWN = "unknown"
_HEX = re.compile(r"^[0-9a-f]{7,40}$")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def imported_sources() -> list[str]:
    """The files of the checkout this process imported (the code whose numbers it reports)."""
    root = str(ROOT)
    return sorted({str(Path(m.__file__).resolve()) for m in list(sys.modules.values())
                   if getattr(m, "__file__", None) and str(Path(m.__file__).resolve()).startswith(root)})


def git_state(paths: list[str] | None = None) -> tuple[str, bool]:
    """``(commit, dirty)``: HEAD (12 hex digits) and whether a file of ``paths`` (default: the
    checkout's files this process imported, :func:`imported_sources`) differs from HEAD, untracked
    ones included.  ``$REPLAYSSM_COMMIT`` names the commit of a copy without (or with a stale)
    ``.git`` (a device copy; clean by the caller's word).  Outside a git checkout: ``("unknown",
    True)``, since nothing shows the code is a commit's."""
    env = os.environ.get("REPLAYSSM_COMMIT", "").strip().lower()
    if env:
        return (env if _HEX.match(env) else UNKNOWN), not _HEX.match(env)
    if not (ROOT / ".git").exists():  # an installed copy (site-packages), not a checkout
        return UNKNOWN, True
    try:
        head = _git("rev-parse", "--short=12", "HEAD")
        used = imported_sources() if paths is None else list(paths)
        dirty = bool(_git("status", "--porcelain", "--", *used)) if used else False
        return head, dirty
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN, True


def describe_commit(commit: str, dirty: bool) -> str:
    """One word for a reader: ``<commit>``, ``<commit>+uncommitted``, or ``unknown``."""
    if commit == UNKNOWN:
        return UNKNOWN
    return commit + ("+uncommitted" if dirty else "")


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


@functools.lru_cache(maxsize=8)
def _nvidia_driver(index: int) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True)
        return out.stdout.strip().splitlines()[0].strip() or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def device_info(device: str = "cpu", count: int = 1) -> dict:
    """The record's ``device``: ``{"kind": "cpu"|"cuda", "name", "driver", "count"}`` for a
    ``--device`` value (``cpu``, ``cuda``, ``cuda:N``); the driver from nvidia-smi on CUDA."""
    if not str(device).startswith("cuda"):
        return {"kind": "cpu", "name": cpu_name(), "driver": None, "count": max(1, int(count))}
    import torch
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    return {"kind": "cuda", "name": torch.cuda.get_device_name(index), "driver": _nvidia_driver(index),
            "count": max(1, int(count))}


def versions() -> dict:
    """The record's ``versions``: python, torch, triton (None when absent), replayssm, and CUDA
    (torch's runtime, None on a CPU build)."""
    import torch
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": tv,
            "replayssm": __version__, "cuda": torch.version.cuda}


__all__ = ["UNKNOWN", "cpu_name", "describe_commit", "device_info", "git_state", "imported_sources", "versions"]
