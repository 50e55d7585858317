"""The fp64 running-error bound of drift's fast path over a piece of steps, in one launch.

Oracle: :meth:`replayssm.validators.engine.checks.fp64_bound.RunningBound.window` with
``outputs_only=True``, step after step -- the carried error ``E``, the arithmetic's ``A``, the
norm bound ``M``, the tokens ``n`` and decay exponent ``L`` since the last stored state, per row
and head, and each window output's bound ``FACTOR max_h (E + u_c (K_SUM n + K_EXP L) M) w``.
Expected difference: none.  Every value is the same IEEE fp64 product or sum, in the same order,
as the torch expressions of ``fp64_bound.py``: the kernel is compiled with floating-point
contraction off (``enable_fp_fusion=False``: no FMA), its constants are read as fp64 from a
tensor (a Python float argument would be specialised to fp32), the maximum over heads is exact
and a NaN in it is kept, as ``amax`` keeps it.  tests/core/test_bound_scan.py compares the two bit
for bit under the Triton interpreter and on a GPU.

Why: the bound's recurrence is a few dozen operations on ``[rows, heads]`` tensors per token;
inside drift's CUDA graphs each was a graph node of its own, most of a step's kernels
(docs/benchmarks.md, "The drift fast path per step").  Its coefficients depend on the tokens
alone (``RunningBound.coefficients``), so they are computed for a whole chunk at load and the
recurrence over a piece's steps is one program per row, the heads in its lanes.

Shapes (contiguous): ``state [5, R, H]`` (E, A, M, n, L; read and written), ``rho, c, p, q, dL,
w [N, R, H]`` (token ``j T + t`` of chunk step ``j``), ``flush [K, R]`` (bool: the rows whose
verify stores a checkpoint), ``accepted [K, R]`` (int64; speculative only), ``out [K, R, T]``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl


@triton.jit
def _fold(u_c, k_sum, k_exp, n, L, M):
    return u_c * (k_sum * n + k_exp * L) * M


@triton.jit
def _bound_scan_kernel(st_ptr, rho_ptr, c_ptr, p_ptr, q_ptr, dl_ptr, w_ptr, flush_ptr, acc_ptr, out_ptr, k_ptr,
                       j0, steps, R, H, T: tl.constexpr, REPLAY: tl.constexpr, SPEC: tl.constexpr,
                       HAS_REC: tl.constexpr, BLOCK_H: tl.constexpr):
    r = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    m = h < H
    RH = R * H
    base = r * H + h
    u_c = tl.load(k_ptr + 0)
    u_a = tl.load(k_ptr + 1)
    u_store = tl.load(k_ptr + 2)
    k_sum = tl.load(k_ptr + 3)
    k_exp = tl.load(k_ptr + 4)
    factor = tl.load(k_ptr + 5)
    E = tl.load(st_ptr + base, mask=m, other=0.0)
    A = tl.load(st_ptr + RH + base, mask=m, other=0.0)
    M = tl.load(st_ptr + 2 * RH + base, mask=m, other=0.0)
    n = tl.load(st_ptr + 3 * RH + base, mask=m, other=0.0)
    L = tl.load(st_ptr + 4 * RH + base, mask=m, other=0.0)
    for j in range(j0, j0 + steps):
        f = tl.load(flush_ptr + j * R + r) != 0
        if REPLAY and SPEC:  # a speculative replay's checkpoint holds the state before its window
            fold = _fold(u_c, k_sum, k_exp, n, L, M)
            E = tl.where(f, E + fold + u_store * M, E)
            A = tl.where(f, A + fold, A)
            n = tl.where(f, 0.0, n)
            L = tl.where(f, 0.0, L)
        kE, kA, kM, kn, kL = E, A, M, n, L
        acc = tl.load(acc_ptr + j * R + r)  # (standard decode: a placeholder, unused)
        for t in tl.static_range(T):
            i = (j * T + t) * RH + base
            rho = tl.load(rho_ptr + i, mask=m, other=0.0)
            if HAS_REC:
                rec = tl.load(p_ptr + i, mask=m, other=0.0) * (tl.load(q_ptr + i, mask=m, other=0.0) + rho * M)
            else:
                rec = tl.zeros_like(M)
            E = rho * E + u_a * rec
            A = rho * A
            M = rho * M + tl.load(c_ptr + i, mask=m, other=0.0)
            n = n + 1.0
            L = L + tl.load(dl_ptr + i, mask=m, other=0.0)
            if not REPLAY:  # a baseline stores every token's state
                fold = _fold(u_c, k_sum, k_exp, n, L, M)
                E = E + fold + u_store * M
                A = A + fold
                n = tl.zeros_like(n)
                L = tl.zeros_like(L)
            elif t == 0 and not SPEC:  # a standard replay's flush stores the state after its token
                fold = _fold(u_c, k_sum, k_exp, n, L, M)
                E = tl.where(f, E + fold + u_store * M, E)
                A = tl.where(f, A + fold, A)
                n = tl.where(f, 0.0, n)
                L = tl.where(f, 0.0, L)
            v = (E + _fold(u_c, k_sum, k_exp, n, L, M)) * tl.load(w_ptr + i, mask=m, other=0.0)
            v = tl.where(m, v, float("-inf"))
            top = tl.max(v, 0)
            nan = tl.sum(tl.where(v != v, 1, 0), 0) > 0  # amax keeps a NaN
            top = tl.where(nan, float("nan"), top)
            tl.store(out_ptr + (j * R + r) * T + t, factor * top)
            if SPEC:  # the bound after each row's accepted prefix
                keep = acc == t + 1
                kE = tl.where(keep, E, kE)
                kA = tl.where(keep, A, kA)
                kM = tl.where(keep, M, kM)
                kn = tl.where(keep, n, kn)
                kL = tl.where(keep, L, kL)
            else:
                kE, kA, kM, kn, kL = E, A, M, n, L
        E, A, M, n, L = kE, kA, kM, kn, kL
    tl.store(st_ptr + base, E, mask=m)
    tl.store(st_ptr + RH + base, A, mask=m)
    tl.store(st_ptr + 2 * RH + base, M, mask=m)
    tl.store(st_ptr + 3 * RH + base, n, mask=m)
    tl.store(st_ptr + 4 * RH + base, L, mask=m)


def bound_scan(state: torch.Tensor, coef: dict[str, torch.Tensor], weights: torch.Tensor, flush: torch.Tensor,
               accepted: torch.Tensor | None, out: torch.Tensor, j0: int, steps: int, *, constants: torch.Tensor,
               replay: bool) -> None:
    """Advance ``state`` ``[5, R, H]`` (E, A, M, n, L) over chunk steps ``j0 .. j0 + steps - 1`` and write
    each window output's bound into ``out[j, :, t]``.  ``coef``: ``RunningBound.coefficients`` of the
    chunk's tokens (``rho, c, dL`` and, where the family has rounded records, ``p, q``; each ``[N, R,
    H]``), ``weights`` ``[N, R, H]`` (``RunningBound.weights``), ``flush`` ``[K, R]`` bool,
    ``accepted`` ``[K, R]`` int64 (speculative; None: standard decode, every row keeps its token),
    ``out`` ``[K, R, T]``; ``constants``: fp64 ``[u_c, u_a, K_STORE u_s, K_SUM, K_EXP, FACTOR]``
    (:meth:`RunningBound.scan_constants`); ``replay``: a replay kernel (else a baseline)."""
    if state.dim() != 3 or state.shape[0] != 5 or state.dtype != torch.float64 or not state.is_contiguous():
        raise ValueError(f"state: expected a contiguous fp64 [5, R, H] tensor, got {state.dtype} {tuple(state.shape)}")
    _, R, H = state.shape
    K, Ro, T = out.shape
    N = weights.shape[0]
    need = ("rho", "c", "dL") + (("p", "q") if "p" in coef else ())
    for name, t in [(k, coef.get(k)) for k in need] + [("weights", weights)]:
        if t is None or t.dtype != torch.float64 or t.device != state.device or tuple(t.shape) != (N, R, H) \
                or not t.is_contiguous():
            got = "nothing" if t is None else f"{t.dtype} {tuple(t.shape)} on {t.device}"
            raise ValueError(f"{name}: expected a contiguous fp64 [{N}, {R}, {H}] tensor on {state.device}, got {got}")
    if Ro != R or out.dtype != torch.float64 or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous fp64 [K, {R}, T] tensor, got {out.dtype} {tuple(out.shape)}")
    if tuple(flush.shape) != (K, R) or flush.dtype != torch.bool:
        raise ValueError(f"flush: expected a bool [{K}, {R}] tensor, got {flush.dtype} {tuple(flush.shape)}")
    if accepted is not None and (tuple(accepted.shape) != (K, R) or accepted.dtype != torch.int64):
        raise ValueError(f"accepted: expected an int64 [{K}, {R}] tensor, got {accepted.dtype} {tuple(accepted.shape)}")
    if not (0 <= j0 and steps >= 1 and j0 + steps <= K and (j0 + steps) * T <= N):
        raise ValueError(f"j0, steps: expected chunk steps within {K} and {N // T} tokens' worth, got {j0}, {steps}")
    if constants.dtype != torch.float64 or constants.numel() != 6:
        raise ValueError(f"constants: expected 6 fp64 values, got {constants.numel()} {constants.dtype}")
    spec = accepted is not None
    rec = "p" in coef
    with torch.cuda.device(state.device) if state.device.type == "cuda" else contextlib.nullcontext():
        fl = flush.view(torch.uint8)
        _bound_scan_kernel[(R,)](state, coef["rho"], coef["c"], coef["p"] if rec else coef["rho"],
                                 coef["q"] if rec else coef["rho"], coef["dL"], weights, fl, accepted if spec else fl,
                                 out, constants, j0, steps, R, H, T=T, REPLAY=bool(replay), SPEC=spec, HAS_REC=rec,
                                 BLOCK_H=triton.next_power_of_2(H), num_warps=1, enable_fp_fusion=False)


__all__ = ["bound_scan"]
