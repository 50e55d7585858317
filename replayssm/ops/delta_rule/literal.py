"""The literal replay math of a delta-rule family (Gated DeltaNet; KDA, whose gate is per key channel):
the fold, the window's bookkeeping and their row-batched twins, over the family's own gates and in-window
solve (:class:`DeltaRuleMath`, subclassed by ``GDNMath`` and ``KDAMath``).

Oracle: docs/recurrences.md section 2 (records d, normalised k, g) and the in-window WY/UT solve of
section 4, read line by line, with the decay a scalar per value head or a vector over the key axis
(``per_channel_gate``).  Expected error: at s64a64 the replay models equal the fp64 recurrence to ~1e-12
relative (each family's ``literal.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.delta_rule.naive import l2norm
from replayssm.ops.literal import FamilyMath, WindowResult
from replayssm.precision import PrecisionMode
from replayssm.rounding import round_tf32, truncate_tf32


def _dot(t: torch.Tensor, mode: PrecisionMode | None) -> torch.Tensor:
    """A dot operand as the mode's dot reads it: tf32 rounded to nearest, or cut toward zero where the mode
    says its tf32 operands are truncated (``tf32_truncates``, :class:`replayssm.ops.variant_math.TruncatedTf32Dot`)."""
    if mode is None or mode.dot != "tf32":
        return t
    return truncate_tf32(t) if getattr(mode, "tf32_truncates", False) else round_tf32(t)


def gate_scale(decay: torch.Tensor, per_channel_gate: bool) -> torch.Tensor:
    """A decay ``[..., HV]`` (or ``[..., HV, K]`` per key channel) viewed to scale states ``[..., HV, V, K]``."""
    return decay[..., None, :] if per_channel_gate else decay[..., None, None]


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


class DeltaRuleMath(FamilyMath):
    """Replay arithmetic of a delta rule: records d and normalised k in the activation dtype, the log gate g
    (one per value head, or ``[HV, K]`` with ``per_channel_gate``) in the compute dtype.

    A family sets ``per_channel_gate``, ``fold_terms`` (the einsum of the fold's record sum, one row), its
    ``gates_fn`` and ``step_fn`` (its naive gates and step), ``solve`` (the per-row in-window solve) and
    ``solve_rows`` (its row-batched twin); the fold's decay weights are :meth:`decays`.  A family that keeps
    the row-batched twin declares ``batches_rows`` with ``fold_rows`` / ``window_rows`` in its own class
    (``FamilyMath.rows_batchable``)."""

    per_channel_gate: ClassVar[bool] = False
    fold_terms: ClassVar[str] = "jh,jhv,jhk->hvk"
    gates_fn: ClassVar[Callable]
    step_fn: ClassVar[Callable]

    def gates(self, win: dict[str, torch.Tensor], params: dict[str, torch.Tensor], conv=DEFAULT):
        """The window's log gates ``g [T, HV]`` (``[T, HV, K]`` per key channel) and ``beta [T, HV]`` (the
        family's ``gates_fn``; ``conv``: the kernel's declared conventions)."""
        return self.gates_fn(win["a"], win["b"], params["A_log"], params["dt_bias"], conv)

    def step(self, s, tok, params, conv=DEFAULT):
        return self.step_fn(s, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], params["A_log"], params["dt_bias"],
                            conv)

    def decays(self, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``exp(G_n)`` and ``exp(G_n - G_j)`` [n, ...] (G the inclusive cumulative sum of g over the token
        axis: per value head, or per key channel)."""
        G = torch.cumsum(g, dim=0)
        return torch.exp(G[-1]), torch.exp(G[-1] - G)

    def record_layout(self, g):
        gate = (g.num_v_heads, g.head_k_dim) if self.per_channel_gate else (g.num_v_heads,)
        return {"d": ((g.num_v_heads, g.head_v_dim), "act"), "k": ((g.num_k_heads, g.head_k_dim), "act"),
                "g": (gate, "decay")}

    def fold(self, s0, hist, params, mode):
        # S = exp(G) S0 + sum_j exp(G - G_j) d_j k_j^T   (G_j inclusive cumsum of g; per channel: S0 Diag(exp G))
        g = hist["g"]
        if g.shape[0] == 0:
            return s0
        total, w = self.decays(g)
        kh = hist["k"].repeat_interleave(s0.shape[0] // hist["k"].shape[-2], dim=-2)
        return gate_scale(total, self.per_channel_gate) * s0 + torch.einsum(self.fold_terms, w, hist["d"], kh)

    def window(self, s0, hist, win, params, mode, options, conv=DEFAULT):
        s_h = self.fold(s0, hist, params, mode)
        nv = s0.shape[0]
        qn = l2norm(win["q"], conv) * win["q"].shape[-1] ** -0.5
        kn = l2norm(win["k"], conv)
        rep = nv // win["q"].shape[-2]
        qh, kh = qn.repeat_interleave(rep, dim=-2), kn.repeat_interleave(rep, dim=-2)
        g, beta = self.gates(win, params, conv)
        o, d = self.solve(s_h, qh, kh, win["v"], g, beta, mode)
        after_first = gate_scale(torch.exp(g[0]), self.per_channel_gate) * s_h + d[0][:, :, None] * kh[0][:, None, :]
        return WindowResult(outputs=o, records={"d": d, "k": kn, "g": g}, state_before=s_h,
                            state_after_first=after_first)

    # ---- the row-batched twin of fold / window (same arithmetic with a leading row axis r) -----------
    def fold_rows(self, s0, hist, params, mode):
        g = hist["g"]  # [R, n, HV] or [R, n, HV, K]
        if g.shape[1] == 0:
            return s0
        G = torch.cumsum(g, dim=1)
        total, w = torch.exp(G[:, -1]), torch.exp(G[:, -1:] - G)
        kh = hist["k"].repeat_interleave(s0.shape[1] // hist["k"].shape[-2], dim=-2)
        terms = "r" + self.fold_terms.replace(",", ",r").replace("->", "->r")
        return gate_scale(total, self.per_channel_gate) * s0 + torch.einsum(terms, w, hist["d"], kh)

    def window_rows(self, s0, hist, win, params, mode, options, need_before=True, conv=DEFAULT):
        return delta_window_rows(self.fold_rows(s0, hist, params, mode), win, mode, conv, l2norm,
                                 lambda tok: self.gates(tok, params, conv), self.solve_rows)


class CumprodDecays:
    """Fold weights as running products of the per-token decays exp(g_j) (fp32; per value head or per
    key channel): a mixin over a :class:`DeltaRuleMath`."""

    def decays(self, g):
        a = torch.exp(g)
        seg = [torch.ones_like(a[0])]
        for j in range(g.shape[0] - 1, 0, -1):
            seg.append(seg[-1] * a[j])
        seg = torch.stack(seg[::-1])
        return seg[0] * a[0], seg


__all__ = ["CumprodDecays", "DeltaRuleMath", "_dot", "delta_window_rows", "gate_scale"]
