"""The replay kernels' two-launch handoff: the pre-pass's cursor snapshot, read by its stream, and
programmatic dependent launch (PDL, Hopper and later) between the two.

A kernel launched with ``launch_pdl=True`` may start before the kernel ahead of it in the stream has
finished: as soon as every program of that kernel has called :func:`release_next` (or exited).  Its
programs must call :func:`wait_previous` before they read anything the kernel ahead wrote (the wait
returns once that kernel has completed and its writes are visible).  What a program reads before the
wait must have been written at least two launches back.

The replay pairs use it so: the coefficient pre-pass waits first thing (its inputs may come from the
launch just before it) and then releases its stream; the stream issues the load of its first
checkpoint tile -- written by an earlier step's stream, before this pre-pass started -- and only then
waits for the pre-pass's coefficients and cursor snapshot, so the tile's memory round trip overlaps
the pre-pass.  The stream releases the next launch after its own wait.

Oracle: the same kernels launched without PDL, bit for bit (the arithmetic is unchanged, only
when the loads are issued): tests/core/test_pdl.py on CPU (the option's checking; the interpreter has no
grid dependency control, so the calls compile out there) and the GPU tests with ``pdl=True``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAVE_GDC = True
except ImportError:  # a Triton before 3.4: no grid dependency control (pdl_active is then False)
    HAVE_GDC = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


@triton.jit
def wait_previous(PDL: tl.constexpr):
    """Wait until the kernel ahead has completed and its writes are visible (nothing without PDL)."""
    if PDL:
        gdc_wait()


@triton.jit
def release_next(PDL: tl.constexpr):
    """Let the next PDL launch start its programs (nothing without PDL)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def cursor_snapshot(meta_ptr, r):
    """The cursors a pre-pass left for row ``r`` in ``meta [rows, 4]``: write_pos, origin, whether
    this verify flushes, the slot's stochastic-rounding counter."""
    w = tl.load(meta_ptr + r * 4)
    org = tl.load(meta_ptr + r * 4 + 1)
    flush = tl.load(meta_ptr + r * 4 + 2) != 0
    cnt = tl.load(meta_ptr + r * 4 + 3)
    return w, org, flush, cnt


@triton.jit
def cursors_after_prepass(meta_ptr, r, PDL: tl.constexpr):
    """A stream program's handoff from its pre-pass: wait for it (PDL), let the next launch start, and
    read the :func:`cursor_snapshot` it left for row ``r``."""
    wait_previous(PDL)
    release_next(PDL)
    return cursor_snapshot(meta_ptr, r)


def pdl_option(options: dict, default: bool = False) -> bool:
    """``options['pdl']``: True or False (absent: ``default``, the kernel's measured choice)."""
    value = options.get("pdl", default)
    if not isinstance(value, bool):
        raise ValueError(f"options['pdl']: expected True or False, got {value!r}")
    return value


def pdl_active(requested: bool, device: torch.device, interpret: bool) -> bool:
    """Whether a launch on ``device`` takes PDL: requested, compiled (the Triton interpreter has no grid
    dependency control), a Triton that has it (3.4 on) and compute capability 9.0 or later
    (``griddepcontrol`` is sm_90's).  Otherwise the pair runs as without the option."""
    if not requested or interpret or device.type != "cuda" or not HAVE_GDC:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_kwargs(active: bool) -> dict:
    """The launch keyword a PDL launch adds (none otherwise)."""
    return {"launch_pdl": True} if active else {}


__all__ = ["cursor_snapshot", "cursors_after_prepass", "launch_kwargs", "pdl_active", "pdl_option", "release_next",
           "wait_previous"]
