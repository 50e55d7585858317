"""What every vLLM-style adapter shares: the slot bridge, poisoned output scratch, host bookkeeping.

* **Null block 0 vs padding slot −1.**  vLLM reserves physical block 0 as the null block (padding
  rows point at it and kernels skip or zero them).  An adapter allocates ``num_slots + 1`` blocks;
  our slot ``s`` is block ``s + 1`` and a padding row (``-1``) is block 0.
* **Outputs through a poisoned scratch.**  Some external kernels write padding rows' outputs (zeros,
  or a result from the null block): every launch writes into a NaN-filled scratch and only the
  active rows are copied into the caller's ``out``, so the engine's padding-output check sees only
  the writes that reach our rows, and an element the kernel never wrote stays NaN (caught by the
  unwritten-output check).
* Inspection (``checkpoint_state``, ``committed_state``) is fp64 on the host side of the bridge:
  padding rows come back NaN.
* **Timed steps** (``timed_step``, for the bench job's side-by-side runs): the external kernels'
  launches alone, on inputs packed once beforehand the way vLLM hands them over (``mixed_qkv``,
  ``conv_out``, ``query_start_loc``), outputs left in the packed scratch, no host work and nothing a
  CUDA graph cannot capture.  Standard decode takes per-row cursors: the ``L`` cursor positions are
  built beforehand (:meth:`SlotAdapter.cursor_positions`) and call ``n`` uses position ``n mod L``,
  which is what the device cursor would hold when every row commits one token per step.  A timed
  step leaves the adapter's own cursor bookkeeping behind: the instance is for timing only after it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from replayssm.interface import PAD_SLOT, KernelUnderTest
from replayssm.precision import PrecisionMode

FLOAT_STATES = ("fp32", "bf16", "fp16")
FLOAT_ACTS = ("fp32", "bf16", "fp16")


def float_mode_reason(mode: PrecisionMode, what: str, dots: tuple[str, ...] = ("ieee",)) -> str | None:
    """The common refusal: fp32/bf16/fp16 states stored with round-to-nearest, fp32/bf16/fp16
    activations, readouts in one of ``dots``."""
    if mode.state not in FLOAT_STATES:
        return f"{what} stores the state in the state tensor's own dtype (fp32, bf16 or fp16), not {mode.state}"
    if mode.act not in FLOAT_ACTS:
        return f"{what} takes fp32, bf16 or fp16 activations, not {mode.act}"
    if mode.rounding != "nearest":
        return f"{what} stores the state with a plain cast (round to nearest), not stochastic rounding"
    if mode.dot not in dots:
        return f"{what} reads out with {' / '.join(dots)} dots, not {mode.dot}"
    return None


class SlotAdapter(KernelUnderTest):
    """Base of the adapters: block mapping, scratch outputs, reset/pending flags on the host."""

    accepted_options: ClassVar[tuple[str, ...]] = ()  # the adapters read no KernelConfig option
    modules: ClassVar[dict] = {}  # filled by the adapter's register(): short module name -> module
    source: ClassVar[str] = ""  # where the external code came from (path, commit), for reports

    def __init__(self, config) -> None:
        super().__init__(config)
        self.ready = [False] * self.num_slots
        self.pending = [False] * self.num_slots

    # ---- the slot bridge -----------------------------------------------------------------------------
    def blocks(self, slot_ids: torch.Tensor) -> torch.Tensor:
        """int32 physical block per row: slot + 1, padding (-1) -> the null block 0."""
        return torch.where(slot_ids >= 0, slot_ids + 1, 0).to(torch.int32).contiguous()

    def active_rows(self, slot_ids: torch.Tensor) -> torch.Tensor:
        return (slot_ids != PAD_SLOT).nonzero().flatten()

    def scratch(self, *shape: int) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=self.mode.act_dtype, device=self.device)

    def new_out(self, R: int) -> torch.Tensor:
        return torch.full((R, self.decode.window, *self.out_shape), float("nan"), dtype=self.mode.act_dtype,
                          device=self.device)

    # ---- host bookkeeping (bad calls are refused before anything changes) -----------------------------
    def begin_verify(self, slot_ids, inputs, out) -> list[int]:
        ids = self.check_verify_args(slot_ids, inputs, out)
        for r, s in enumerate(ids):
            if s != PAD_SLOT and not self.ready[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} was never reset")
            if s != PAD_SLOT and self.pending[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} has an uncommitted verify; commit it first")
        return ids

    def end_verify(self, ids: list[int]) -> None:
        for s in ids:
            if s != PAD_SLOT:
                self.pending[s] = True

    def begin_commit(self, slot_ids, accepted) -> tuple[list[int], list[int]]:
        ids, ks = self.check_commit_args(slot_ids, accepted, self.pending)
        if not self.decode.speculative and any(k != 1 for s, k in zip(ids, ks) if s != PAD_SLOT):
            raise ValueError("accepted: standard decode commits exactly 1 token per row")
        for s in ids:
            if s != PAD_SLOT:
                self.pending[s] = False
        return ids, ks

    def mark_reset(self, ids: list[int]) -> None:
        for s in ids:
            if s != PAD_SLOT:
                self.ready[s] = True
                self.pending[s] = False

    # ---- timed steps (bench job) -------------------------------------------------------------------------
    def cursor_positions(self, blk: torch.Tensor, write_pos: torch.Tensor):
        """For a timed standard-decode step: ``(start, [(write_pos, is_flush)] * L)`` per-row int32 /
        bool tensors of every cursor position; all rows must share one cursor (as in the bench)."""
        wp = write_pos.index_select(0, blk.long())
        if wp.numel() and bool((wp != wp[0]).any()):
            raise ValueError("slot_ids: a timed standard-decode step needs every row at the same cursor")
        L, R = self.decode.buffer, blk.shape[0]
        pos = [torch.full((R,), p, dtype=torch.int32, device=self.device) for p in range(L)]
        return (int(wp[0]) if wp.numel() else 0), [(p, p == L - 1) for p in pos]

    # ---- inspection -------------------------------------------------------------------------------------
    def per_slot(self, slot_ids, fn) -> torch.Tensor:
        """fp64 ``[R, *state_shape]`` from ``fn(slot)``; NaN rows for padding."""
        ids = self._check_slot_ids(slot_ids)
        out = torch.full((len(ids), *self.state_shape), float("nan"), dtype=torch.float64, device=self.device)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                out[r] = fn(s)
        return out

    def hist_rows(self, s: int, write_pos: int, origin: int) -> torch.Tensor:
        """Physical ring rows of slot ``s``'s committed history (logical positions 0..write_pos-1)."""
        rows = self.decode.ring_rows
        return torch.tensor([(origin + p) % rows for p in range(write_pos)], dtype=torch.long, device=self.device)
