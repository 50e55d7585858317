"""Checks every subcommand makes before any work: the output is writable, the run fits in memory
and time, numbers are finite and in range, names used in file paths are plain names.

Oracle: none (argument and environment checking).  A failed check raises :class:`EnvironmentProblem`
(exit 3, one line naming the flag and what to change) or ``ValueError`` (exit 2, bad input);
nothing is created or written by a check (:func:`check_writable` probes with a temporary file it
removes again).

The memory estimate (:func:`footprint`) is charged by cause, so a refusal names the flag that
drives it: the step plan (one ``StepPlan`` per step, measured with ``tracemalloc`` on CPython
3.12: about 520 B + 8 B per row at its peak, 1 KiB + 64 B per row charged here to cover the
runner's per-step records too; the step count of the exhaustive schedule is bounded by
:data:`EXHAUSTIVE_STEPS_PER_PAIR` x its (write_pos, k) pairs, measured 1.3-3.5), the rows (the
states the engine holds: kernel, literal model, fp64 reference, ``STATE_COPIES`` fp64 copies of
one row's state, plus ``WINDOW_COPIES`` fp64 copies of a window of inputs and outputs, plus
``ROW_HOST_BYTES`` of Python objects), the slots the kernel owns (``SLOT_COPIES`` fp64 copies of
a slot's state and its ``ring_rows`` x per-token records: kernel, literal model, snapshot, repeat
run; plus ``SLOT_HOST_BYTES`` of Python objects).  Element sizes are charged at 8 bytes (fp64, the
widest storage a mode has), so the estimate is an upper bound for every precision mode (measured:
``validate`` on the tiny geometry with 4,000 rows, random schedule, 4 steps: 0.9 GiB estimated,
0.64 GiB of resident memory above the idle process).  The time
estimate covers the one plan whose construction grows faster than its length: the exhaustive
schedule's cover walk (one per distinct row order, at most T' of them), about
``EXHAUSTIVE_S_PER_PAIR`` x pairs + ``EXHAUSTIVE_S_PER_PAIR2`` x pairs^2 seconds each (the constants
fitted to the walk's time on a shared 2-core CPU from 520 to 8,004 pairs; those timings are unrecorded).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout


class EnvironmentProblem(Exception):
    """The environment cannot run the command (user module import, unwritable output, no device,
    not enough memory): printed as one line, exit 3."""


PLAN_STEP_BYTES = 1024
PLAN_ROW_BYTES = 64
STATE_COPIES = 8
WINDOW_COPIES = 8
ROW_HOST_BYTES = 512
SLOT_COPIES = 4
SLOT_HOST_BYTES = 256
ELEM_BYTES = 8
EXHAUSTIVE_STEPS_PER_PAIR = 4
EXHAUSTIVE_S_PER_PAIR = 4e-4
EXHAUSTIVE_S_PER_PAIR2 = 6e-7
# Refuse a plan whose construction alone is estimated to take longer than this.
PLAN_TIME_LIMIT_S = 120.0
# Refuse a run whose estimate exceeds this share of the available memory.
MEMORY_SHARE = 0.8


def int_at_least(lo: int, hi: int | None = None, why: str = ""):
    """An argparse ``type``: an integer >= ``lo`` (and <= ``hi`` when given), checked at parse time
    (exit 2, argparse names the flag); ``1e9`` is read as the integer it names; ``why`` is added to
    the refusal in parentheses."""
    want = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    note = f" ({why})" if why else ""

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            try:  # 1e9 and 2048.0 name integers too
                f = float(text)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f.is_integer()):
                raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}{note}") from None
            v = int(f)
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {v}{note}")
        return v
    conv.__name__ = want
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


def _probe(folder: Path) -> str | None:
    """Why a file cannot be created in the existing ``folder`` (None: it can): creates a temporary
    file there and removes it, which also catches read-only mounts and /proc, where ``os.access``
    says yes (always so for root)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".replayssm-probe-", dir=folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(fd)
    os.unlink(tmp)
    return None


def check_writable(path: str | os.PathLike, flag: str, *, is_dir: bool = True) -> None:
    """Refuse (exit 3) when ``path`` (a folder when ``is_dir``, else a file) cannot be created or
    written; leaves nothing behind (the probe file is removed)."""
    p = Path(path).absolute()
    if p.exists():
        if is_dir and not p.is_dir():
            raise EnvironmentProblem(f"{flag} {path}: exists and is not a folder")
        if not is_dir and p.is_dir():
            raise EnvironmentProblem(f"{flag} {path}: is a folder, expected a file path")
        why = _probe(p if is_dir else p.parent)
        if why is None and not is_dir and not os.access(p, os.W_OK):
            why = "permission denied"
        if why is not None:
            raise EnvironmentProblem(f"{flag} {path}: not writable ({why})")
        return
    base = _nearest_existing(p.parent)
    if not base.is_dir():
        raise EnvironmentProblem(f"{flag} {path}: cannot be created, {base} is a file, not a folder")
    why = _probe(base)
    if why is not None:
        raise EnvironmentProblem(f"{flag} {path}: cannot be created, {base} is not writable ({why})")


NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")


def check_name(value: str, flag: str) -> str:
    """A name that becomes part of a file name (kernel, family, mode, geometry, schedule, case id):
    letters, digits, ``_ . -`` and not only dots, else ValueError naming ``flag`` (exit 2)."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value) or set(value) == {"."}:
        raise ValueError(f"{flag}: expected a name of letters, digits, '_', '.' and '-' (it becomes part of "
                         f"file names), got {value!r}")
    return value


def name_arg(text: str) -> str:
    """An argparse ``type`` for :func:`check_name` (argparse names the flag)."""
    try:
        return check_name(text, "name")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None


name_arg.__name__ = "name"


def out_path(root: str | os.PathLike, name: str, flag: str) -> Path:
    """``root / name`` for a file written under an output folder; ValueError naming ``flag`` when
    the result would leave ``root`` (a name holding ``/``, ``..`` or an absolute path)."""
    base = Path(root).absolute()
    p = (base / name).absolute()
    if os.path.normpath(p.parent) != os.path.normpath(base) or p.name in ("", ".", ".."):
        raise ValueError(f"{flag}: the file name {name!r} would be written outside {root}; names in file "
                         f"names are letters, digits, '_', '.' and '-'")
    return Path(root) / name


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


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def check_memory(need: int, flag: str, what: str, available: int | None = None) -> None:
    """Refuse (exit 3) a run whose estimate ``need`` exceeds :data:`MEMORY_SHARE` of the available memory."""
    have = available_memory() if available is None else available
    if have is None or need <= MEMORY_SHARE * have:
        return
    raise EnvironmentProblem(f"{flag}: the run would need about {_gib(need)} of host memory ({what}) but "
                             f"{_gib(have)} is available; lower {flag}")


def token_elems(geometry) -> int:
    """Elements of one token's inputs and output for a geometry object."""
    return sum(math.prod(s) for s in geometry.input_shapes().values()) + math.prod(geometry.out_shape)


def ring_rows_of(decode: str, window: int, buffer: int) -> int:
    """Record rows per slot under the default policy: next_pow2(B + T') speculative, L standard."""
    return 1 << max(0, (buffer + window - 1).bit_length()) if decode == "speculative" else buffer


def exhaustive_pairs(decode: str, window: int, buffer: int) -> int:
    """The (write_pos, k) pairs the exhaustive schedule covers (default policy): (B + 1) x T'
    speculative, L standard."""
    return (buffer + 1) * window if decode == "speculative" else buffer


def footprint(geometry, *, rows: int, slots: int, window: int, ring_rows: int, steps: int,
              flags: dict[str, str], copies: int = 1) -> list[tuple[str, int, int, str]]:
    """The estimated memory of a run (``copies`` of it side by side: drift workers) by cause, as
    ``(flag, host_bytes, tensor_bytes, what)`` per cause; ``flags`` names the flag of each cause
    (keys ``rows``, ``slots``, ``ring``, ``window``, ``steps``).  Tensor bytes live on the run's
    device, host bytes on the host (module docstring: the constants and what they cover)."""
    st, tok = math.prod(geometry.state_shape), token_elems(geometry)
    terms = [
        (flags["rows"], rows * ROW_HOST_BYTES, rows * STATE_COPIES * ELEM_BYTES * st,
         f"{rows:,} rows x {_size(STATE_COPIES * ELEM_BYTES * st + ROW_HOST_BYTES)} of states"),
        (flags["slots"], slots * SLOT_HOST_BYTES, slots * SLOT_COPIES * ELEM_BYTES * st,
         f"{slots:,} slots x {_size(SLOT_COPIES * ELEM_BYTES * st + SLOT_HOST_BYTES)} of states"),
        (flags["ring"], 0, slots * SLOT_COPIES * ELEM_BYTES * ring_rows * tok,
         f"{slots:,} slots x {ring_rows:,} record rows x {_size(SLOT_COPIES * ELEM_BYTES * tok)}"),
        (flags["window"], 0, rows * WINDOW_COPIES * ELEM_BYTES * window * tok,
         f"{rows:,} rows x a window of {window:,} tokens x {_size(WINDOW_COPIES * ELEM_BYTES * tok)}"),
        (flags["steps"], steps * (PLAN_STEP_BYTES + PLAN_ROW_BYTES * rows), 0,
         f"a plan of {steps:,} steps x {rows:,} rows"),
    ]
    if copies > 1:
        terms = [(f, copies * h, copies * t, f"{copies} worker(s) x {w}") for f, h, t, w in terms]
    return terms


def device_memory(device: str) -> int | None:
    """Free bytes of a CUDA ``device`` (torch.cuda.mem_get_info), None when it cannot say."""
    try:
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    except Exception:  # noqa: BLE001 - no estimate rather than a failed run
        return None


def check_fits(terms: list[tuple[str, int, int, str]], device: str = "cpu", *, available: int | None = None,
               device_available: int | None = None) -> None:
    """Refuse (exit 3) a run whose :func:`footprint` exceeds :data:`MEMORY_SHARE` of the available
    host memory (tensors included on the CPU) or of the free memory of a CUDA ``device``; the
    message names the flag of the largest cause, the estimate and the limit."""
    on_gpu = str(device).startswith("cuda")
    pools = [("host memory", [(f, h + (0 if on_gpu else t), w) for f, h, t, w in terms],
              available_memory() if available is None else available)]
    if on_gpu:
        pools.append((f"GPU memory on {device}", [(f, t, w) for f, _h, t, w in terms],
                      device_memory(device) if device_available is None else device_available))
    for where, parts, have in pools:
        need = sum(b for _f, b, _w in parts)
        if have is None or need <= MEMORY_SHARE * have:
            continue
        flag, b, what = max(parts, key=lambda x: x[1])
        raise EnvironmentProblem(f"{flag}: the run would need about {_size(need)} of {where} ({what}: "
                                 f"{_size(b)}) but {_size(have)} is available (a run may use "
                                 f"{MEMORY_SHARE:.0%}); lower {flag}")


def check_plan_time(pairs: int, walks: int, flag: str) -> None:
    """Refuse (exit 3) an exhaustive schedule whose ``walks`` cover walks over ``pairs`` (write_pos,
    k) pairs are estimated to take more than :data:`PLAN_TIME_LIMIT_S` to build (module docstring)."""
    est = walks * (EXHAUSTIVE_S_PER_PAIR * pairs + EXHAUSTIVE_S_PER_PAIR2 * float(pairs) ** 2)
    if est > PLAN_TIME_LIMIT_S:
        raise EnvironmentProblem(f"{flag}: the exhaustive schedule covers {pairs:,} (write_pos, k) pairs; building "
                                 f"its plan alone would take about {est:,.0f} s (limit {PLAN_TIME_LIMIT_S:,.0f} s); "
                                 f"lower {flag}, or use --schedule random with --steps")


def state_elems(geometry) -> int:
    """Elements of one row's state for a geometry object (its ``state_shape``)."""
    return math.prod(geometry.state_shape)


__all__ = ["LOCK_NAME", "NAME_PATTERN", "available_memory", "check_fits", "check_memory", "check_name",
           "check_plan_time", "check_record_path", "check_writable", "device_memory", "EnvironmentProblem",
           "exhaustive_pairs", "float_in", "footprint", "int_at_least", "name_arg", "out_path", "output_lock",
           "ring_rows_of", "run_bytes", "state_elems", "token_elems"]
