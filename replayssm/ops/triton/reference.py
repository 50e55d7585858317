"""The fp64 reference steps' state-sized work in a pass per row: the update and the readout sums.

Oracle: the eager torch expressions it replaces, bit for bit --
Mamba-2 (``naive.advance``): ``S' = torch.add(a * S, (Δ x) * B)``, the readout ``pairwise_sum(S' * C)``
and the readout magnitude ``pairwise_sum(|S'| * |C|)`` (``Mamba2.readout_magnitude``);
Gated DeltaNet (``naive.gdn_step``): ``sk = pairwise_sum(S * k)``, ``d = β (v - α sk)``,
``S' = α S + d kᵀ``, ``o = pairwise_sum(S' * q)`` and ``pairwise_sum(|S'| * |q|)``.
Each element is rounded as torch rounds it (one IEEE product or sum per operation: the kernel is
compiled with floating-point contraction off, ``enable_fp_fusion=False``, so no FMA), and every sum
over the row is :func:`replayssm.ops.ordered_sum.pairwise_sum`'s halving tree, which this kernel
reproduces level by level (``x[:h] + x[h:]`` as a reshape to ``[rows, 2, h]`` and a sum over the
pair; ``|s c| = |s| |c|`` exactly).  Expected difference: none (tests/jobs/test_drift_fast.py against the
eager step under the Triton interpreter, and on a GPU).

One program takes ``ROWS`` rows of the state (a row: the ``J`` = dstate / key entries of one (row, head,
headdim / value) index): it reads the state once and writes the new state, the readout and the
magnitude.  Gated DeltaNet's ``S k``, needed before its update, is a read-only pass of the same kernel
first (``UPDATE=False``): two passes where the eager step makes about ten state-sized ones.

Shapes (contiguous): ``s, new [R, H, I, J]``; per (row, head) ``a`` (α), ``beta [R, H]``, ``w, c [R, H, J]``;
per row ``u [R, H, I]`` (Mamba-2's Δ x; Gated DeltaNet's v).  Outputs ``y, mag [R, H, I]``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

# rows per program, on one warp: a warp's rows reduce in its lanes (on 4 warps the halving tree crossed
# warps: 67 barriers per program in an sm_90 compile; on one, none), and 4 rows keep the fp64 tile small
ROWS = 4


@triton.jit
def tree_sum(x, ROWS: tl.constexpr, BJ: tl.constexpr, LOG2BJ: tl.constexpr):
    """``pairwise_sum`` over the last axis of ``x [ROWS, BJ]`` (``BJ = 2 ** LOG2BJ``): ``[ROWS]``."""
    for lvl in tl.static_range(LOG2BJ):
        x = tl.sum(tl.reshape(x, (ROWS, 2, BJ >> (lvl + 1))), axis=1)
    return tl.reshape(x, (ROWS,))


@triton.jit
def _reference_rows_kernel(s_ptr, a_ptr, u_ptr, w_ptr, c_ptr, new_ptr, y_ptr, mag_ptr, live_ptr, keep_ptr, keepm_ptr,
                           nrows, per, I: tl.constexpr, J: tl.constexpr, BJ: tl.constexpr, LOG2BJ: tl.constexpr,
                           ROWS: tl.constexpr, UPDATE: tl.constexpr, SHARED: tl.constexpr, LIVE: tl.constexpr,
                           KEEP: tl.constexpr):
    """UPDATE: ``new = a S + u wᵀ``, ``y`` and ``mag`` the sums of ``new ∘ c`` and its magnitude; else only
    ``y = pairwise_sum(S ∘ w)`` (the delta rule's ``S k``: a pass of its own, since the tree's result fed back
    into the update made the layout pass give the tree a register-replicated layout, 14 KB of spills per
    program in an sm_90 compile).  LIVE: only the rows of the batch rows ``live`` marks (``per`` state rows
    each) are read and written; the others' ``new``, ``y`` and ``mag`` are left as they were.  KEEP: ``new`` also
    stored into ``keep`` for the batch rows ``keepm`` marks (of those computed): a row of ``keep`` may be the
    row of ``s`` this program reads, since it loads its rows before it stores them."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    mr = rows < nrows
    if LIVE:
        mr = mr & (tl.load(live_ptr + rows // per, mask=mr, other=0) != 0)
    j = tl.arange(0, BJ)
    mj = j < J
    m2 = mr[:, None] & mj[None, :]
    rh = rows // I
    s = tl.load(s_ptr + rows[:, None] * J + j[None, :], mask=m2, other=0.0)
    if SHARED:  # the program's rows share one (row, head): w and c once, as [BJ] vectors
        rh0 = (tl.program_id(0).to(tl.int64) * ROWS) // I
        w = tl.load(w_ptr + rh0 * J + j, mask=mj, other=0.0)[None, :]
    else:
        w = tl.load(w_ptr + rh[:, None] * J + j[None, :], mask=m2, other=0.0)
    if not UPDATE:
        tl.store(y_ptr + rows, tree_sum(tl.where(m2, s * w, 0.0), ROWS, BJ, LOG2BJ), mask=mr)
        return
    if SHARED:
        c = tl.load(c_ptr + rh0 * J + j, mask=mj, other=0.0)[None, :]
    else:
        c = tl.load(c_ptr + rh[:, None] * J + j[None, :], mask=m2, other=0.0)
    a = tl.load(a_ptr + rh, mask=mr, other=0.0)
    u = tl.load(u_ptr + rows, mask=mr, other=0.0)
    new = a[:, None] * s + u[:, None] * w
    prod = tl.where(m2, new * c, 0.0)
    tl.store(new_ptr + rows[:, None] * J + j[None, :], new, mask=m2)
    if KEEP:
        mk = mr & (tl.load(keepm_ptr + rows // per, mask=mr, other=0) != 0)
        tl.store(keep_ptr + rows[:, None] * J + j[None, :], new, mask=mk[:, None] & mj[None, :])
    tl.store(y_ptr + rows, tree_sum(prod, ROWS, BJ, LOG2BJ), mask=mr)
    tl.store(mag_ptr + rows, tree_sum(tl.abs(prod), ROWS, BJ, LOG2BJ), mask=mr)


def _launch(s, a, u, w, c, new, y, mag, update: bool, live: torch.Tensor | None = None,
            keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    R, H, I, J = s.shape
    nrows, bj = R * H * I, triton.next_power_of_2(J)
    kd, km = keep if keep is not None else (s, s)
    with torch.cuda.device(s.device) if s.device.type == "cuda" else contextlib.nullcontext():
        _reference_rows_kernel[(triton.cdiv(nrows, ROWS),)](
            s, a, u, w, c, new, y, mag, s if live is None else live.view(torch.uint8), kd,
            km.view(torch.uint8) if keep is not None else s, nrows, H * I, I=I, J=J,
            BJ=bj, LOG2BJ=bj.bit_length() - 1, ROWS=ROWS, UPDATE=update, SHARED=I % ROWS == 0,
            LIVE=live is not None, KEEP=keep is not None, enable_fp_fusion=False, num_warps=1)


def reference_rows(s: torch.Tensor, a: torch.Tensor, u: torch.Tensor, w: torch.Tensor, c: torch.Tensor,
                   beta: torch.Tensor | None = None, live: torch.Tensor | None = None,
                   keep: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(S', pairwise_sum(S' ∘ c), pairwise_sum(|S' ∘ c|))`` for ``s [R, H, I, J]`` fp64 and factors that
    view as ``a [R, H]``, ``u [R, H, I]``, ``w, c [R, H, J]`` (same dtype and device): ``S' = a S + u wᵀ``,
    or with ``beta [R, H]`` the delta rule's ``S' = a S + d wᵀ``, ``d = beta (u - a pairwise_sum(S ∘ w))``
    (``naive.gdn_step``'s expressions; ``S ∘ w`` summed in a pass of its own).  ``live``: a bool ``[R]`` mask;
    only its rows are computed, the others' results are undefined (drift's shadow: only the rows armed to
    measure a flush are ever read).  ``keep``: ``(dst, mask)``, a contiguous fp64 tensor of the state's shape and
    a bool ``[R]`` mask: ``S'``'s rows that the mask marks (and ``live``, if given) are also written into ``dst``
    in place (drift's kept rows: the copy ``row_copy.copy_rows`` made after the step, without its pass; ``dst``
    may be ``s`` itself)."""
    if s.dim() != 4:
        raise ValueError(f"s: expected a [R, H, I, J] state, got shape {tuple(s.shape)}")
    R, H, I, J = s.shape
    want = {"a": (a, R * H), "u": (u, R * H * I), "w": (w, R * H * J), "c": (c, R * H * J)}
    if beta is not None:
        want["beta"] = (beta, R * H)
    for name, (t, numel) in want.items():
        if t.dtype != s.dtype or t.device != s.device or t.numel() != numel:
            raise ValueError(f"{name}: expected {numel} {s.dtype} elements on {s.device}, got {t.numel()} "
                             f"{t.dtype} on {t.device}")
    if live is not None and (live.dtype != torch.bool or tuple(live.shape) != (R,) or live.device != s.device):
        raise ValueError(f"live: expected a bool [{R}] tensor on {s.device}, got {live.dtype} {tuple(live.shape)} "
                         f"on {live.device}")
    if keep is not None:
        dst, km = keep
        if dst.dtype != s.dtype or dst.device != s.device or dst.numel() != s.numel() or not dst.is_contiguous():
            raise ValueError(f"keep: expected a contiguous {s.dtype} destination of {s.numel()} elements on "
                             f"{s.device}, got {dst.dtype} {tuple(dst.shape)} on {dst.device} "
                             f"(contiguous: {dst.is_contiguous()})")
        if km.dtype != torch.bool or tuple(km.shape) != (R,) or km.device != s.device:
            raise ValueError(f"keep: expected a bool [{R}] mask on {s.device}, got {km.dtype} {tuple(km.shape)} "
                             f"on {km.device}")
        keep = (dst, km.contiguous())
    if keep is not None and not s.is_contiguous():
        raise ValueError("s: a state with keep must be contiguous (its rows may be the destination's)")
    s, a, u, w, c = (t.contiguous() for t in (s, a, u, w, c))
    live = None if live is None else live.contiguous()
    new = torch.empty_like(s)
    y, mag = (torch.empty((R, H, I), dtype=s.dtype, device=s.device) for _ in range(2))
    if beta is not None:  # d = beta (v - alpha (S k)), as naive.gdn_step writes it
        _launch(s, a, u, w, c, new, y, mag, update=False, live=live)
        u = beta.reshape(R, H, 1) * (u.reshape(R, H, I) - a.reshape(R, H, 1) * y)
    _launch(s, a, u, w, c, new, y, mag, update=True, live=live, keep=keep)
    return new, y, mag


__all__ = ["reference_rows", "tree_sum"]
