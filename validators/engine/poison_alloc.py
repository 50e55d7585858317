"""Allocation poisoning: every uninitialised buffer a kernel allocates during a call is filled with poison.

Oracle: none here; this makes a never-written buffer show.  ``torch.empty``, ``empty_like``,
``empty_strided``, ``Tensor.new_empty`` and ``Tensor.new_empty_strided`` called while a kernel's
``reset`` / ``verify`` / ``commit`` runs return memory whose contents are whatever the allocator
had (on the GPU, usually the bytes of the last tensor freed there, often the right values by
luck: kekzl/imp #1503 committed a snapshot slab the forward never wrote, 0 of 26 M bytes).
Under :class:`PoisonAllocations` each such buffer is filled, as soon as it is made, with NaN
(``"nan"``) or 2^100 (``"large"``: the largest finite value where the format cannot hold it; a
value that overflows nothing but dwarfs every state), integers with their maximum, booleans True;
a kernel that reads or commits one of them before writing it then fails the engine's value
checks (``non-finite`` for NaN, ``state`` / ``output`` for 2^100).  A ``TorchFunctionMode``:
the Python-level allocations (Triton launch wrappers, adapters, literal models) on the CPU and
the GPU alike; allocations inside a compiled operator are not Python calls and are not seen.
"""

from __future__ import annotations

import functools

import torch
from torch.overrides import TorchFunctionMode

from replayssm.scenarios.schedules import POISON_LARGE

HOW = ("nan", "large")
_EMPTY = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty, torch.Tensor.new_empty_strided}


def fill_poison(t: torch.Tensor, how: str) -> None:
    """Fill ``t`` with the poison ``how`` names (its dtype's version of it)."""
    if t.dtype == torch.bool:
        t.fill_(True)
    elif t.is_floating_point():
        t.fill_(float("nan") if how == "nan" else min(POISON_LARGE, float(torch.finfo(t.dtype).max)))
    else:
        t.fill_(torch.iinfo(t.dtype).max)


class PoisonAllocations(TorchFunctionMode):
    """While active, every empty-like allocation is filled with the poison ``how``; ``count`` is
    the number of buffers filled."""

    def __init__(self, how: str) -> None:
        if how not in HOW:
            raise ValueError(f"--poison-allocations: expected one of {list(HOW)}, got {how!r}")
        super().__init__()
        self.how = how
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _EMPTY and isinstance(out, torch.Tensor) and out.numel():
            fill_poison(out, self.how)
            self.count += 1
        return out


def poison_kernel_calls(kernel, how: str, counter: dict) -> None:
    """Make ``kernel``'s ``reset``, ``verify`` and ``commit`` (instance attributes shadowing the
    class's methods) run under :class:`PoisonAllocations`; ``counter["allocations poisoned"]``
    adds up the buffers filled."""
    if how not in HOW:
        raise ValueError(f"--poison-allocations: expected one of {list(HOW)}, got {how!r}")

    def wrap(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            mode = PoisonAllocations(how)
            try:
                with mode:
                    return method(*args, **kwargs)
            finally:
                counter[f"allocations poisoned ({how})"] += mode.count
        return call

    for name in ("reset", "verify", "commit"):
        setattr(kernel, name, wrap(getattr(kernel, name)))


__all__ = ["HOW", "PoisonAllocations", "fill_poison", "poison_kernel_calls"]
