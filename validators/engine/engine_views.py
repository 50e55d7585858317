"""The ``views`` layout: the kernel's tensors as a serving engine holds them, strided views of wider buffers.

Oracle: none here; this builds the views and remembers what lies between them (the
``view-gaps`` check compares it after each call).  Under a plan with ``layout: "views"`` the
Lockstep hands the kernel, instead of contiguous tensors:

* each input ``[R, T', *shape]`` as a slice of one wider buffer ``[R, T', W]`` that holds every
  input of the step side by side with a few elements of canary between them (vLLM's split of a
  fused projection: ``qkv[..., :dq]``): strides ``(T' W, W, <the shape's own>)``, the storage
  offset of its slice;
* ``out`` as a slice of a wider ``[R, T', W_out]`` buffer, the gaps filled with canary (a kernel
  that writes its outputs as if ``out`` were contiguous writes into them);
* ``slot_ids`` as column 0 of a ``[R, 3]`` block table (``block_table[:, 0]``, stride 3: vLLM
  #51682), the other columns holding other slots' ids (the unused slots, else padding), and
  ``accepted`` as column 1 of a ``[R, 3]`` table of counts.

:func:`strided_views` and :func:`column_view` return the views and a :class:`Gaps` record of the
wider buffer: its bits outside the views before the call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replayssm.validators.engine import invariants as inv

GAP = 3  # canary elements between two views (and after the last)
TABLE_COLS = 3


@dataclass(eq=False)
class Gaps:
    """A wider buffer, the mask of its elements no view covers, and their bits before the call."""

    name: str
    buffer: torch.Tensor
    mask: torch.Tensor
    before: torch.Tensor

    def changed(self) -> torch.Tensor:
        """A 0-d bool on the buffer's device: whether any gap element changed its bits."""
        now = inv.int_view(self.buffer)[self.mask]
        return (now != self.before).any()

    def first_change(self) -> tuple[int, ...] | None:
        diff = torch.zeros_like(self.mask)
        diff[self.mask] = inv.int_view(self.buffer)[self.mask] != self.before
        return inv.first_index(diff)


def _gaps(name: str, buf: torch.Tensor, covered: torch.Tensor) -> Gaps:
    mask = ~covered
    return Gaps(name, buf, mask, inv.int_view(buf)[mask].clone())


def strided_views(name: str, tensors: dict[str, torch.Tensor], canary: float) -> tuple[dict[str, torch.Tensor], Gaps]:
    """Copies of ``tensors`` (each ``[R, T', ...]``, one dtype) as slices of one wider
    ``[R, T', W]`` buffer, ``GAP`` canary elements after each; the record of its gaps."""
    first = next(iter(tensors.values()))
    R, T = first.shape[:2]
    sizes = {n: math.prod(t.shape[2:]) for n, t in tensors.items()}
    W = sum(sizes.values()) + GAP * len(sizes)
    buf = torch.full((R, T, W), canary, dtype=first.dtype, device=first.device)
    covered = torch.zeros((R, T, W), dtype=torch.bool, device=first.device)
    views, off = {}, 0
    for n, t in tensors.items():
        inner = t.shape[2:]
        inner_strides = torch.empty(inner, device="meta").stride() if inner else ()
        v = torch.as_strided(buf, (R, T, *inner), (T * W, W, *inner_strides), off)
        v.copy_(t)
        views[n] = v
        covered[:, :, off:off + sizes[n]] = True
        off += sizes[n] + GAP
    return views, _gaps(name, buf, covered)


def column_view(name: str, t: torch.Tensor, col: int, fill: list[int]) -> tuple[torch.Tensor, Gaps]:
    """``t`` (1-D integers) as column ``col`` of a ``[len(t), TABLE_COLS]`` table whose other
    columns hold ``fill`` (cycled); the record of the other columns."""
    R = t.shape[0]
    table = torch.tensor([[fill[(r * TABLE_COLS + c) % len(fill)] for c in range(TABLE_COLS)] for r in range(R)],
                         dtype=t.dtype, device=t.device).reshape(R, TABLE_COLS)
    table[:, col] = t
    covered = torch.zeros_like(table, dtype=torch.bool)
    covered[:, col] = True
    return table[:, col], _gaps(name, table, covered)


__all__ = ["GAP", "TABLE_COLS", "Gaps", "column_view", "strided_views"]
