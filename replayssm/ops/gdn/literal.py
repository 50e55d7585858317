"""Gated DeltaNet ReplaySSM, literally: the in-window solve and the literal replay and baseline models.

Oracle: docs/recurrences.md section 2 (replay records d, normalised k, g) and the in-window WY/UT solve of
section 4, read line by line, over the bookkeeping of ``replayssm/ops/literal.py``; the baseline
step is ``naive.gdn_step``.

* :func:`gdn_window_solve`: the causal in-window solve ``d = (I + A)^-1 R`` and the window
  outputs, from the state before the window; :func:`gdn_window_solve_rows` its row-batched twin.
* :class:`GDNLiteralReplay` ("literal-replay") and :class:`GDNLiteralBaseline`
  ("literal-baseline"): literal models of the kernel interface.

Expected error: at s64a64 the replay model equals the fp64 recurrence to ~1e-12 relative.
"""

from __future__ import annotations

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.gdn.naive import gdn_gates, gdn_step, l2norm
from replayssm.ops.literal import FamilyMath, LiteralBaselineKernel, LiteralReplayKernel, WindowResult
from replayssm.precision import PrecisionMode
from replayssm.registry import register
from replayssm.rounding import round_tf32


def _dot(t: torch.Tensor, mode: PrecisionMode | None) -> torch.Tensor:
    return round_tf32(t) if mode is not None and mode.dot == "tf32" else t


def gdn_window_solve(s_h, qh, kh, v, g, beta, mode: PrecisionMode | None = None):
    """The in-window WY/UT form (docs/recurrences.md section 3) for one row.

    ``s_h [HV, V, K]`` state before the window; per window token ``qh, kh [T, HV, K]``,
    ``v [T, HV, V]``, ``g, beta [T, HV]``.  With G the inclusive cumsum of g:
    ``R_i = beta_i (v_i - exp(G_i) S_h k_i)``, ``A_ij = beta_i exp(G_i - G_j) (k_i . k_j)`` (i > j),
    ``d = (I + A)^-1 R`` by forward substitution, and
    ``o_s = exp(G_s) S_h q_s + sum_{j<=s} exp(G_s - G_j) (k_j . q_s) d_j``.
    Returns ``(o [T, HV, V], d [T, HV, V])``."""
    T = qh.shape[0]
    G = torch.cumsum(g, dim=0)  # [T, HV]
    eG = torch.exp(G)
    s_h_dot = _dot(s_h, mode)
    sk = (s_h_dot[None] * _dot(kh, mode)[:, :, None, :]).sum(-1)  # [T, HV, V]
    R = beta[..., None] * (v - eG[..., None] * sk)
    kk = torch.einsum("ihk,jhk->hij", kh, kh)  # [HV, T, T]
    decay = torch.exp(G.T[:, :, None] - G.T[:, None, :])  # [HV, i, j] = exp(G_i - G_j)
    d = []
    for i in range(T):
        acc = R[i]
        for j in range(i):
            acc = acc - (beta[i] * decay[:, i, j] * kk[:, i, j])[:, None] * d[j]
        d.append(acc)
    d = torch.stack(d)  # [T, HV, V]
    sq = (s_h_dot[None] * _dot(qh, mode)[:, :, None, :]).sum(-1)  # [T, HV, V]
    kq = torch.einsum("jhk,shk->hsj", kh, qh)  # [HV, s, j]
    outs = []
    for s in range(T):
        o = eG[s][:, None] * sq[s]
        for j in range(s + 1):
            o = o + (decay[:, s, j] * kq[:, s, j])[:, None] * d[j]
        outs.append(o)
    return torch.stack(outs), d


def gdn_window_solve_rows(s_h, qh, kh, v, g, beta, mode: PrecisionMode | None = None):
    """:func:`gdn_window_solve` of ``R`` rows at once (every argument and result with a leading
    row axis), the same arithmetic bit for bit (tests/core/test_literal_rows.py)."""
    T = qh.shape[1]
    G = torch.cumsum(g, dim=1)  # [R, T, HV]
    eG = torch.exp(G)
    s_h_dot = _dot(s_h, mode)
    sk = (s_h_dot[:, None] * _dot(kh, mode)[:, :, :, None, :]).sum(-1)  # [R, T, HV, V]
    Rm = beta[..., None] * (v - eG[..., None] * sk)
    kk = torch.einsum("rihk,rjhk->rhij", kh, kh)  # [R, HV, T, T]
    Gt = G.transpose(1, 2)  # [R, HV, T]
    decay = torch.exp(Gt[:, :, :, None] - Gt[:, :, None, :])  # [R, HV, i, j]
    d = []
    for i in range(T):
        acc = Rm[:, i]
        for j in range(i):
            acc = acc - (beta[:, i] * decay[:, :, i, j] * kk[:, :, i, j])[:, :, None] * d[j]
        d.append(acc)
    d = torch.stack(d, dim=1)  # [R, T, HV, V]
    sq = (s_h_dot[:, None] * _dot(qh, mode)[:, :, :, None, :]).sum(-1)
    kq = torch.einsum("rjhk,rshk->rhsj", kh, qh)  # [R, HV, s, j]
    outs = []
    for s in range(T):
        o = eG[:, s][:, :, None] * sq[:, s]
        for j in range(s + 1):
            o = o + (decay[:, :, s, j] * kq[:, :, s, j])[:, :, None] * d[:, j]
        outs.append(o)
    return torch.stack(outs, dim=1), d


class GDNMath(FamilyMath):
    """Replay arithmetic: records d and normalised k in the activation dtype, g in compute dtype.

    The fold's decay weights are one method (:meth:`decays`) and the in-window solve another
    (:meth:`solve`), the places real kernels differ: the variants below do them other ways."""

    def decays(self, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``exp(G_n)`` [HV] and ``exp(G_n - G_j)`` [n, HV] (G the inclusive cumulative sum of g)."""
        G = torch.cumsum(g, dim=0)
        return torch.exp(G[-1]), torch.exp(G[-1] - G)

    def solve(self, s_h, qh, kh, v, g, beta, mode):
        """The window's outputs and d records from the state before the window."""
        return gdn_window_solve(s_h, qh, kh, v, g, beta, mode)

    def record_layout(self, g):
        return {"d": ((g.num_v_heads, g.head_v_dim), "act"), "k": ((g.num_k_heads, g.head_k_dim), "act"),
                "g": ((g.num_v_heads,), "decay")}

    def fold(self, s0, hist, params, mode):
        # S = exp(G) S0 + sum_j exp(G - G_j) d_j k_j^T   (G_j inclusive cumsum of g)
        g = hist["g"]
        if g.shape[0] == 0:
            return s0
        total, w = self.decays(g)  # [HV], [n, HV]
        kh = hist["k"].repeat_interleave(s0.shape[0] // hist["k"].shape[-2], dim=-2)
        return total[:, None, None] * s0 + torch.einsum("jh,jhv,jhk->hvk", w, hist["d"], kh)

    def window(self, s0, hist, win, params, mode, options, conv=DEFAULT):
        s_h = self.fold(s0, hist, params, mode)
        nv = s0.shape[0]
        qn = l2norm(win["q"], conv) * win["q"].shape[-1] ** -0.5
        kn = l2norm(win["k"], conv)
        rep = nv // win["q"].shape[-2]
        qh, kh = qn.repeat_interleave(rep, dim=-2), kn.repeat_interleave(rep, dim=-2)
        g, beta = gdn_gates(win["a"], win["b"], params["A_log"], params["dt_bias"], conv)
        o, d = self.solve(s_h, qh, kh, win["v"], g, beta, mode)
        after_first = torch.exp(g[0])[:, None, None] * s_h + d[0][:, :, None] * kh[0][:, None, :]
        return WindowResult(outputs=o, records={"d": d, "k": kn, "g": g}, state_before=s_h,
                            state_after_first=after_first)

    # ---- the row-batched twin of fold / window (same arithmetic with a leading row axis r) -----------
    batches_rows = True

    def rows_batchable(self):
        # a mutant replaces the module's per-row solve (validators/engine/mutants/arithmetic.py)
        return super().rows_batchable() and gdn_window_solve is _SOLVE

    def fold_rows(self, s0, hist, params, mode):
        g = hist["g"]  # [R, n, HV]
        if g.shape[1] == 0:
            return s0
        G = torch.cumsum(g, dim=1)
        total, w = torch.exp(G[:, -1]), torch.exp(G[:, -1:] - G)
        kh = hist["k"].repeat_interleave(s0.shape[1] // hist["k"].shape[-2], dim=-2)
        return total[:, :, None, None] * s0 + torch.einsum("rjh,rjhv,rjhk->rhvk", w, hist["d"], kh)

    def window_rows(self, s0, hist, win, params, mode, options, need_before=True, conv=DEFAULT):
        return delta_window_rows(self.fold_rows(s0, hist, params, mode), win, mode, conv, l2norm,
                                 lambda tok: gdn_gates(tok["a"], tok["b"], params["A_log"], params["dt_bias"], conv),
                                 gdn_window_solve_rows)

    def error_coefficients(self, tok, params, heads):
        """The running-error model of one token (fp64, all rows), as ``fp64_bound.norm_terms`` reads
        it, norms being the largest row 2-norm of a head's state ``[V, K]`` (>= its max |S|): per
        value head, the factor an existing error is scaled by, ``rho = exp(g)`` (``I - beta k k^T``
        has 2-norm <= 1 for unit k and beta in [0, 1]), the token's part of the bound on the new
        state's norm (``rho |S| + c``, ``c = beta max|v|``), and the magnitude of the contributions
        built from records rounded to the activation format, ``p (q + rho |S|)`` (d and the
        normalised k: ``2 max|d| <= 2 beta (max|v| + exp(g) |S|)``, so ``p = 2 beta``, ``q = max|v|``).
        State-free: a chunk's tokens can be given at once."""
        g, beta = gdn_gates(tok["a"], tok["b"], params["A_log"], params["dt_bias"])  # [R, HV]
        vmax = tok["v"].abs().amax(-1)
        vmax = vmax.repeat_interleave(heads // vmax.shape[-1], dim=-1) if vmax.shape[-1] != heads else vmax
        return {"rho": torch.exp(g), "c": beta * vmax, "p": 2 * beta, "q": vmax}

    def step(self, s, tok, params, conv=DEFAULT):
        return gdn_step(s, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], params["A_log"], params["dt_bias"], conv)


class GDNMathCumprod(GDNMath):
    """Fold weights as running products of the per-token decays exp(g_j) (fp32)."""

    def decays(self, g):
        a = torch.exp(g)
        seg = [torch.ones_like(a[0])]
        for j in range(g.shape[0] - 1, 0, -1):
            seg.append(seg[-1] * a[j])
        seg = torch.stack(seg[::-1])
        return seg[0] * a[0], seg


class GDNMathRecurrentWindow(GDNMath):
    """The in-window solve by stepping the delta rule token by token from the state before the
    window (no WY/UT form): ``d_t = beta_t (v_t - exp(g_t) S_{t-1} k_t)``,
    ``S_t = exp(g_t) S_{t-1} + d_t k_t^T``, ``o_t = S_t q_t``."""

    def solve(self, s_h, qh, kh, v, g, beta, mode):
        S, outs, ds = s_h, [], []
        for t in range(qh.shape[0]):
            a = torch.exp(g[t])
            sk = (_dot(S, mode) * _dot(kh[t], mode)[:, None, :]).sum(-1)
            d = beta[t][:, None] * (v[t] - a[:, None] * sk)
            S = a[:, None, None] * S + d[:, :, None] * kh[t][:, None, :]
            outs.append((_dot(S, mode) * _dot(qh[t], mode)[:, None, :]).sum(-1))
            ds.append(d)
        return torch.stack(outs), torch.stack(ds)


def delta_window_rows(s_h, win, mode, conv, norm, gates, solve) -> WindowResult:
    """The row-batched window of a delta-rule family (GDN; KDA, whose gates are per key channel)
    from the states before the window ``s_h [R, HV, V, K]``: ``norm`` the family's L2 norm,
    ``gates(tok)`` its (g, beta) of one row's window, ``solve`` its row-batched in-window solve.
    The normalisation and the gates (log1p, sigmoid) run on each row's own tensors, as the per-row
    model: torch rounds log1p and sigmoid differently in its vectorised and scalar loops."""
    R, nv = s_h.shape[0], s_h.shape[1]
    rows = [(norm(win["q"][r], conv) * win["q"].shape[-1] ** -0.5, norm(win["k"][r], conv),
             *gates({k: v[r] for k, v in win.items()})) for r in range(R)]
    qn, kn, g, beta = (torch.stack(t) for t in zip(*rows))
    rep = nv // win["q"].shape[-2]
    qh, kh = qn.repeat_interleave(rep, dim=-2), kn.repeat_interleave(rep, dim=-2)
    o, d = solve(s_h, qh, kh, win["v"], g, beta, mode)
    decay = torch.exp(g[:, 0])  # [R, HV] (one gate per head) or [R, HV, K] (per key channel)
    decay = decay[:, :, None, None] if decay.dim() == 2 else decay[:, :, None, :]
    after_first = decay * s_h + d[:, 0][:, :, :, None] * kh[:, 0][:, :, None, :]
    return WindowResult(outputs=o, records={"d": d, "k": kn, "g": g}, state_before=s_h,
                        state_after_first=after_first)


_SOLVE = gdn_window_solve  # the per-row solve this module defines (see GDNMath.rows_batchable)
_MATH = GDNMath()


@register
class GDNLiteralReplay(LiteralReplayKernel):
    name = "literal-replay"
    family = "gdn"
    description = "literal ReplaySSM model: records d, normalised k, g; WY/UT in-window solve"
    math = _MATH


@register
class GDNLiteralBaseline(LiteralBaselineKernel):
    name = "literal-baseline"
    family = "gdn"
    description = "literal baseline: state read and written every token; one state per draft position"
    math = _MATH


@register
class GDNReplayCumprod(LiteralReplayKernel):
    name = "literal-replay-cumprod"
    family = "gdn"
    description = "legitimate variant: fold weights as running products of exp(g) (fp32)"
    math = GDNMathCumprod()



@register
class GDNReplayRecurrentWindow(LiteralReplayKernel):
    name = "literal-replay-recurrent"
    family = "gdn"
    description = "legitimate variant: in-window solve by stepping the delta rule (no WY/UT form)"
    math = GDNMathRecurrentWindow()
