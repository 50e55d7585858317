"""Checks every subcommand makes before any work: the output is writable, the run fits in memory.

Oracle: none (argument and environment checking).  A failed check raises :class:`EnvironmentProblem`
(exit 3, one line naming the flag and what to change) or ``ValueError`` (exit 2, bad input);
nothing is created or written by a check.

The memory estimate is the host memory of the step plan (one ``StepPlan`` per step, measured with
``tracemalloc`` on CPython 3.12: about 520 B + 8 B per row at its peak, 1 KiB + 64 B per row
charged here to cover the runner's per-step records too) plus the states the engine holds (kernel,
literal model, fp64 reference: ``STATE_COPIES`` fp64 copies of one row's state per row).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from pathlib import Path

from filelock import FileLock, Timeout


class EnvironmentProblem(Exception):
    """The environment cannot run the command (user module import, unwritable output, no device,
    not enough memory): printed as one line, exit 3."""


PLAN_STEP_BYTES = 1024
PLAN_ROW_BYTES = 64
STATE_COPIES = 8
# Refuse a run whose estimate exceeds this share of the available memory.
MEMORY_SHARE = 0.8


def int_at_least(lo: int):
    """An argparse ``type``: an integer >= ``lo`` (checked at parse time, exit 2 naming the flag);
    ``1e9`` is read as the integer it names."""
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            try:  # 1e9 and 2048.0 name integers too
                f = float(text)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f.is_integer()):
                raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}") from None
            v = int(f)
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {v}")
        return v
    conv.__name__ = f"integer >= {lo}"
    return conv


def float_in(lo: float, hi: float = math.inf, *, lo_open: bool = True, hi_open: bool = True, what: str = "a number"):
    """An argparse ``type``: a finite float in the interval (``lo``, ``hi``) (ends open or closed)."""
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} in {interval}, got {text!r}") from None
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {what} in {interval}, got {text}")
        return v
    conv.__name__ = what
    return conv


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path: str | os.PathLike, flag: str, *, is_dir: bool = True) -> None:
    """Refuse (exit 3) when ``path`` (a folder when ``is_dir``, else a file) cannot be created or
    written; creates nothing."""
    p = Path(path).absolute()
    if p.exists():
        if is_dir and not p.is_dir():
            raise EnvironmentProblem(f"{flag} {path}: exists and is not a folder")
        if not is_dir and p.is_dir():
            raise EnvironmentProblem(f"{flag} {path}: is a folder, expected a file path")
        if not os.access(p, os.W_OK | (os.X_OK if is_dir else 0)):
            raise EnvironmentProblem(f"{flag} {path}: not writable (permission denied)")
        return
    base = _nearest_existing(p.parent)
    if not base.is_dir():
        raise EnvironmentProblem(f"{flag} {path}: cannot be created, {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise EnvironmentProblem(f"{flag} {path}: cannot be created, {base} is not writable (permission denied)")


def check_record_path(path: str | os.PathLike | None, flag: str = "--record") -> None:
    """Refuse (exit 3, naming ``flag``) a records file (JSON lines, appended) that cannot be created
    or written; nothing is created.  ``None``: no records asked for."""
    if path is not None:
        check_writable(path, flag, is_dir=False)


LOCK_NAME = ".replayssm.lock"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, flag: str):
    """Hold ``<path>/.replayssm.lock`` (created with the folder) while writing into ``path``: one
    writer per output; a second one is refused at once (exit 3) instead of mixing files."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise EnvironmentProblem(f"{flag} {path}: another replayssm process is writing there (it holds "
                                 f"{folder / LOCK_NAME}); wait for it to finish or give another {flag}") from None
    try:
        yield lock
    finally:
        lock.release()


def available_memory() -> int | None:
    """Bytes of host memory available (``MemAvailable`` of /proc/meminfo, else free pages); None
    when the platform does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def run_bytes(steps: int, rows: int, state_elems: int) -> int:
    """Estimated host bytes of a run of ``steps`` steps over ``rows`` rows of ``state_elems``-element states."""
    return steps * (PLAN_STEP_BYTES + PLAN_ROW_BYTES * rows) + STATE_COPIES * 8 * rows * state_elems


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_memory(need: int, flag: str, what: str, available: int | None = None) -> None:
    """Refuse (exit 3) a run whose estimate ``need`` exceeds :data:`MEMORY_SHARE` of the available memory."""
    have = available_memory() if available is None else available
    if have is None or need <= MEMORY_SHARE * have:
        return
    raise EnvironmentProblem(f"{flag}: the run would need about {_gib(need)} of host memory ({what}) but "
                             f"{_gib(have)} is available; lower {flag}")


def state_elems(geometry) -> int:
    """Elements of one row's state for a geometry object (its ``state_shape``)."""
    return math.prod(geometry.state_shape)


__all__ = ["LOCK_NAME", "EnvironmentProblem", "available_memory", "check_memory", "check_record_path",
           "check_writable", "float_in", "int_at_least", "output_lock", "run_bytes", "state_elems"]
