"""The one full-state pass of the fp64 reference steps, fused: ``S' = a S + u wᵀ`` and ``S' ∘ c``.

Oracle: the eager torch expressions it replaces, bit for bit --
Mamba-2 (``naive.advance``): ``torch.add(a * S, (Δ x) * B)`` and ``S' * C`` before the sum over N;
Gated DeltaNet (``naive.gdn_step``): ``α S + d kᵀ`` and ``S' * q`` before the sum over K.  Each
element is one IEEE product ``a s``, one product ``u w``, their sum, and one product with ``c``,
each rounded once as torch rounds them: the kernel is compiled with floating-point contraction
off (``enable_fp_fusion=False``: no FMA), and the reductions stay torch's own sums over the
product this pass writes.  Expected difference: none (tests/test_drift_fast.py compares it with
the eager step under the Triton interpreter; tools/h200_drift_fast.sh on a GPU).

It moves the state once in and twice out (new state, product) where the eager step makes five
full-size passes (``a S``, ``u w``, the add, the product), so the fast drift path's fp64
reference runs nearer the memory floor.

Shapes (contiguous): ``s, new, prod [R, H, I, J]``, ``a [R, H]``, ``u [R, H, I]``, ``w, c [R, H, J]``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _decay_outer_kernel(s_ptr, a_ptr, u_ptr, w_ptr, c_ptr, new_ptr, prod_ptr, n, I: tl.constexpr, J: tl.constexpr,
                        BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    rh = offs // (I * J)
    j = offs % J
    s = tl.load(s_ptr + offs, mask=m)
    a = tl.load(a_ptr + rh, mask=m)
    u = tl.load(u_ptr + offs // J, mask=m)
    w = tl.load(w_ptr + rh * J + j, mask=m)
    c = tl.load(c_ptr + rh * J + j, mask=m)
    new = a * s + u * w
    tl.store(new_ptr + offs, new, mask=m)
    tl.store(prod_ptr + offs, new * c, mask=m)


def decay_outer_update(s: torch.Tensor, a: torch.Tensor, u: torch.Tensor, w: torch.Tensor, c: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a S + u wᵀ, (a S + u wᵀ) ∘ c)`` for ``s [R, H, I, J]`` fp64 and broadcast factors of any
    shape that view as ``a [R, H]``, ``u [R, H, I]``, ``w, c [R, H, J]`` (same dtype and device)."""
    if s.dim() != 4:
        raise ValueError(f"s: expected a [R, H, I, J] state, got shape {tuple(s.shape)}")
    R, H, I, J = s.shape
    want = {"a": (a, R * H), "u": (u, R * H * I), "w": (w, R * H * J), "c": (c, R * H * J)}
    for name, (t, numel) in want.items():
        if t.dtype != s.dtype or t.device != s.device or t.numel() != numel:
            raise ValueError(f"{name}: expected {numel} {s.dtype} elements on {s.device}, got {t.numel()} "
                             f"{t.dtype} on {t.device}")
    s = s.contiguous()
    new, prod = torch.empty_like(s), torch.empty_like(s)
    n = s.numel()
    with torch.cuda.device(s.device) if s.device.type == "cuda" else contextlib.nullcontext():
        _decay_outer_kernel[(triton.cdiv(n, BLOCK),)](s, a.contiguous(), u.contiguous(), w.contiguous(),
                                                      c.contiguous(), new, prod, n, I=I, J=J, BLOCK=BLOCK,
                                                      enable_fp_fusion=False)
    return new, prod


__all__ = ["decay_outer_update"]
