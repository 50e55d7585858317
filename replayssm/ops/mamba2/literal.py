"""Mamba-2 ReplaySSM, literally: the literal replay and baseline models of the kernel interface.

Oracle: docs/recurrences.md section 2 (replay: records x, B, Δ; the two routes), read line by line, over the
bookkeeping of ``replayssm/ops/literal.py``; the baseline step is ``naive.mamba2_step``.

* :class:`Mamba2LiteralReplay` ("literal-replay", output_only route; "literal-replay-state",
  state_and_output route) and :class:`Mamba2LiteralBaseline` ("literal-baseline") are the
  literal models of the kernel interface, rounding exactly where the precision mode says.

Expected error: at s64a64 the replay models equal the fp64 recurrence to ~1e-12 relative; at
fp32/bf16 modes the error is a few units of the mode's unit roundoff per flush (measured by the
drift reports).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.literal import FamilyMath, LiteralBaselineKernel, LiteralReplayKernel, WindowResult
from replayssm.ops.mamba2.naive import mamba2_step, softplus
from replayssm.precision import PrecisionMode
from replayssm.registry import register
from replayssm.rounding import round_tf32

ROUTES = ("output_only", "state_and_output")


def _per_head(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """Map ``[..., G, N]`` group tensors to ``[..., H, N]``: head h uses group h // (H / G)."""
    return t.repeat_interleave(nheads // t.shape[-2], dim=-2)


def _dot_operand(t: torch.Tensor, mode: PrecisionMode) -> torch.Tensor:
    return round_tf32(t) if mode.dot == "tf32" else t


class Mamba2Math(FamilyMath):
    """Replay arithmetic: records (x, B) in the activation dtype and Δ in the compute dtype.

    The decay weights are one method (:meth:`decays`), the place real kernels differ:
    the variants below compute them other ways."""

    def decays(self, A: torch.Tensor, delta: torch.Tensor, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """For the fold of records ``0..upto``: ``exp(A c_upto)`` [H] (the checkpoint's decay) and
        ``exp(A (c_upto - c_j))`` [upto + 1, H] (c the inclusive cumulative sum of Δ)."""
        c = torch.cumsum(delta[: upto + 1], dim=0)
        return torch.exp(A * c[-1]), torch.exp(A * (c[-1] - c))

    def record_layout(self, g):
        return {"x": ((g.nheads, g.headdim), "act"), "B": ((g.ngroups, g.dstate), "act"), "dt": ((g.nheads,), "decay")}

    def fold(self, s0, hist, params, mode):
        # S = exp(A c_n) S0 + sum_j Δ_j exp(A (c_n - c_j)) x_j B_j^T   (c inclusive cumsum of Δ)
        A = params["A"]
        delta = hist["dt"]  # [n, H]
        n = delta.shape[0]
        if n == 0:
            return s0
        total, seg = self.decays(A, delta, n - 1)
        w = delta * seg  # [n, H]
        Bh = _per_head(hist["B"], s0.shape[0])  # [n, H, N]
        return (total[:, None, None] * s0
                + torch.einsum("jh,jhp,jhn->hpn", w, hist["x"], Bh))

    def window(self, s0, hist, win, params, mode, options, conv=DEFAULT):
        route = options.get("route", "output_only")
        if route not in ROUTES:
            raise ValueError(f"options['route']: expected one of {ROUTES}, got {route!r}")
        A, D = params["A"], params["D"]
        H = s0.shape[0]
        n = hist["dt"].shape[0]
        delta_w = softplus(win["dt"] + params["dt_bias"], conv.softplus_threshold)  # [T, H]
        delta = torch.cat([hist["dt"], delta_w])  # [n+T, H]
        xs = torch.cat([hist["x"], win["x"]])  # [n+T, H, P]
        Bs = _per_head(torch.cat([hist["B"], win["B"]]), H)  # [n+T, H, N]
        s0_r = _dot_operand(s0, mode)
        outs, after_first = [], None
        for s in range(win["x"].shape[0]):
            w_idx = n + s
            C = _per_head(win["C"][s], H)  # [H, N]
            decay_w, seg = self.decays(A, delta, w_idx)  # [H], [j, H]
            seg = delta[: w_idx + 1] * seg
            if route == "output_only":
                s0c = (s0_r * _dot_operand(C, mode)[:, None, :]).sum(-1)  # [H, P]
                bc = (_dot_operand(Bs[: w_idx + 1], mode) * _dot_operand(C, mode)[None]).sum(-1)  # [j, H]
                y = decay_w[:, None] * s0c + torch.einsum("jh,jhp->hp", seg * bc, xs[: w_idx + 1])
                if s == 0:
                    after_first = (decay_w[:, None, None] * s0
                                   + torch.einsum("jh,jhp,jhn->hpn", seg, xs[: w_idx + 1], Bs[: w_idx + 1]))
            else:
                S = decay_w[:, None, None] * s0 + torch.einsum("jh,jhp,jhn->hpn", seg, xs[: w_idx + 1],
                                                               Bs[: w_idx + 1])
                y = (_dot_operand(S, mode) * _dot_operand(C, mode)[:, None, :]).sum(-1)
                if s == 0:
                    after_first = S
            y = y + D[:, None] * win["x"][s]
            if "z" in win:
                z = win["z"][s]
                y = y * z * torch.sigmoid(z)
            outs.append(y)
        return WindowResult(
            outputs=torch.stack(outs),
            records={"x": win["x"], "B": win["B"], "dt": delta_w},
            state_before=self.fold(s0, hist, params, mode),
            state_after_first=after_first,
        )

    # ---- the row-batched twin of fold / window (same arithmetic with a leading row axis r) -----------
    batches_rows = True

    def _decays_rows(self, A, delta, upto):
        c = torch.cumsum(delta[:, : upto + 1], dim=1)
        return torch.exp(A * c[:, -1]), torch.exp(A * (c[:, -1:] - c))

    def fold_rows(self, s0, hist, params, mode):
        A = params["A"]
        delta = hist["dt"]  # [R, n, H]
        n = delta.shape[1]
        if n == 0:
            return s0
        total, seg = self._decays_rows(A, delta, n - 1)
        w = delta * seg
        Bh = _per_head(hist["B"], s0.shape[1])
        return (total[:, :, None, None] * s0
                + torch.einsum("rjh,rjhp,rjhn->rhpn", w, hist["x"], Bh))

    def window_rows(self, s0, hist, win, params, mode, options, need_before=True, conv=DEFAULT):
        route = options.get("route", "output_only")
        if route not in ROUTES:
            raise ValueError(f"options['route']: expected one of {ROUTES}, got {route!r}")
        A, D = params["A"], params["D"]
        R, H = s0.shape[0], s0.shape[1]
        n = hist["dt"].shape[1]
        # softplus (log1p) on each row's own [T, H] tensor, as the per-row model: torch rounds it
        # differently in its vectorised and scalar loops, so its bits depend on the tensor's shape
        delta_w = torch.stack([softplus(win["dt"][r] + params["dt_bias"], conv.softplus_threshold)
                               for r in range(R)])  # [R, T, H]
        delta = torch.cat([hist["dt"], delta_w], dim=1)
        xs = torch.cat([hist["x"], win["x"]], dim=1)
        Bs = _per_head(torch.cat([hist["B"], win["B"]], dim=1), H)
        s0_r = _dot_operand(s0, mode)
        outs, after_first = [], None
        for s in range(win["x"].shape[1]):
            w_idx = n + s
            C = _per_head(win["C"][:, s], H)  # [R, H, N]
            decay_w, seg = self._decays_rows(A, delta, w_idx)
            seg = delta[:, : w_idx + 1] * seg
            if route == "output_only":
                s0c = (s0_r * _dot_operand(C, mode)[:, :, None, :]).sum(-1)
                bc = (_dot_operand(Bs[:, : w_idx + 1], mode) * _dot_operand(C, mode)[:, None]).sum(-1)
                y = decay_w[:, :, None] * s0c + torch.einsum("rjh,rjhp->rhp", seg * bc, xs[:, : w_idx + 1])
                if s == 0:
                    after_first = (decay_w[:, :, None, None] * s0
                                   + torch.einsum("rjh,rjhp,rjhn->rhpn", seg, xs[:, : w_idx + 1],
                                                  Bs[:, : w_idx + 1]))
            else:
                S = decay_w[:, :, None, None] * s0 + torch.einsum("rjh,rjhp,rjhn->rhpn", seg, xs[:, : w_idx + 1],
                                                                  Bs[:, : w_idx + 1])
                y = (_dot_operand(S, mode) * _dot_operand(C, mode)[:, :, None, :]).sum(-1)
                if s == 0:
                    after_first = S
            y = y + D[:, None] * win["x"][:, s]
            if "z" in win:
                z = win["z"][:, s]
                y = y * z * torch.stack([torch.sigmoid(z[r]) for r in range(R)])  # per row, as softplus
            outs.append(y)
        return WindowResult(
            outputs=torch.stack(outs, dim=1),
            records={"x": win["x"], "B": win["B"], "dt": delta_w},
            state_before=self.fold_rows(s0, hist, params, mode) if need_before else None,
            state_after_first=after_first,
        )

    def error_coefficients(self, tok, params, heads):
        """The running-error model of one token (fp64, all rows), as ``fp64_bound.norm_terms`` reads
        it: per head, the factor an existing state error is scaled by, ``rho = exp(A Δ)``, and the
        token's part of the bound on the new state's max |S| (the sum of absolute contributions
        ``rho |S| + c``, ``c = Δ max|x| max|B|``); no contributions built from records the kernel
        rounds to the activation format (x and B are inputs, already in it; Δ is kept in the compute
        format).  State-free: a chunk's tokens can be given at once."""
        delta = softplus(tok["dt"] + params["dt_bias"])  # [R, H]
        rho = torch.exp(params["A"] * delta)
        Bh = _per_head(tok["B"], heads).abs().amax(-1)  # [R, H]
        return {"rho": rho, "c": delta * tok["x"].abs().amax(-1) * Bh}

    def step(self, s, tok, params, conv=DEFAULT):
        return mamba2_step(s, tok["x"], tok["dt"], tok["B"], tok["C"], params["A"], params["dt_bias"],
                           params["D"], tok.get("z"), threshold=conv.softplus_threshold)


class Mamba2MathCumprod(Mamba2Math):
    """Decay weights as running products of the per-token decays exp(A Δ_j) (fp32)."""

    def decays(self, A, delta, upto):
        a = torch.exp(A * delta[: upto + 1])  # [j, H]
        # suffix products: prod_{i > j} a_i, sequentially from the newest record back
        seg = [torch.ones_like(a[0])]
        for j in range(upto, 0, -1):
            seg.append(seg[-1] * a[j])
        seg = torch.stack(seg[::-1])
        return seg[0] * a[0], seg


class Mamba2MathLogCumsum(Mamba2Math):
    """Decay weights from cumulative sums of the log-decays A Δ (multiplied before summing), as
    exp of their differences (fp32)."""

    def decays(self, A, delta, upto):
        g = torch.cumsum(A * delta[: upto + 1], dim=0)
        return torch.exp(g[-1]), torch.exp(g[-1] - g)


_MATH = Mamba2Math()


@register
class Mamba2LiteralReplay(LiteralReplayKernel):
    name = "literal-replay"
    family = "mamba2"
    description = "literal ReplaySSM model, output_only route (never builds the state to read out)"
    math = _MATH
    accepted_options = ("route",)

    def __init__(self, config):
        super().__init__(replace(config, options={"route": "output_only", **config.options}))


@register
class Mamba2LiteralReplayState(LiteralReplayKernel):
    name = "literal-replay-state"
    family = "mamba2"
    description = "literal ReplaySSM model, state_and_output route (rebuilds S each step, y = S C)"
    math = _MATH
    accepted_options = ("route",)

    def __init__(self, config):
        if config.options.get("route", "state_and_output") != "state_and_output":
            raise ValueError(f"options['route']: kernel {self.name!r} implements the state_and_output route, "
                             f"got {config.options['route']!r}")
        super().__init__(replace(config, options={**config.options, "route": "state_and_output"}))


@register
class Mamba2LiteralBaseline(LiteralBaselineKernel):
    name = "literal-baseline"
    family = "mamba2"
    description = "literal baseline: state read and written every token; one state per draft position"
    math = _MATH


class _Variant(Mamba2LiteralReplay):
    """A legitimate variant of the literal replay model (output_only route): same storage and
    rounding points, decay weights computed another way.  The tolerance rule must pass each
    (tests/core/test_variants.py)."""


@register
class Mamba2ReplayCumprod(_Variant):
    name = "literal-replay-cumprod"
    family = "mamba2"
    description = "legitimate variant: decay weights as running products of exp(A Δ) (fp32)"
    math = Mamba2MathCumprod()


@register
class Mamba2ReplayLogCumsum(_Variant):
    name = "literal-replay-cumsum-exp"
    family = "mamba2"
    description = "legitimate variant: decay weights exp of differences of the cumulative sum of A Δ (fp32)"
    math = Mamba2MathLogCumsum()

