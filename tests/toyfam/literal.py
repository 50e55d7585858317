"""Decaying linear attention, ReplaySSM literally: records v, k (activation dtype) and g (compute dtype).

Oracle: the fold ``S = exp(G) S0 + sum_j exp(G - G_j) v_j k_j^T`` (G the inclusive cumsum of g) and
the window outputs ``o_s = exp(G_s) S_h q_s + sum_{j<=s} exp(G_s - G_j) (k_j . q_s) v_j``."""

from __future__ import annotations

import torch

from replayssm.ops.literal import FamilyMath, LiteralBaselineKernel, LiteralReplayKernel, WindowResult
from replayssm.registry import register
from toyfam.naive import log_decay, toy_step


class ToyMath(FamilyMath):
    def record_layout(self, g):
        return {"v": ((g.heads, g.dv), "act"), "k": ((g.heads, g.dk), "act"), "g": ((g.heads,), "decay")}

    def fold(self, s0, hist, params, mode):
        if hist["g"].shape[0] == 0:
            return s0
        G = torch.cumsum(hist["g"], dim=0)
        w = torch.exp(G[-1] - G)
        return torch.exp(G[-1])[:, None, None] * s0 + torch.einsum("jh,jhv,jhk->hvk", w, hist["v"], hist["k"])

    def window(self, s0, hist, win, params, mode, options):
        s_h = self.fold(s0, hist, params, mode)
        g = log_decay(win["a"], params["A_log"], params["dt_bias"])
        G = torch.cumsum(g, dim=0)
        sq = (s_h[None] * win["q"][:, :, None, :]).sum(-1)
        kq = torch.einsum("jhk,shk->hsj", win["k"], win["q"])
        outs = []
        for s in range(g.shape[0]):
            o = torch.exp(G[s])[:, None] * sq[s]
            for j in range(s + 1):
                o = o + (torch.exp(G[s] - G[j]) * kq[:, s, j])[:, None] * win["v"][j]
            outs.append(o)
        first = torch.exp(g[0])[:, None, None] * s_h + win["v"][0][:, :, None] * win["k"][0][:, None, :]
        return WindowResult(torch.stack(outs), {"v": win["v"], "k": win["k"], "g": g}, s_h, first)

    def step(self, s, tok, params):
        return toy_step(s, tok["q"], tok["k"], tok["v"], tok["a"], params["A_log"], params["dt_bias"])


@register
class ToyLiteralReplay(LiteralReplayKernel):
    name = "literal-replay"
    family = "toy"
    description = "literal ReplaySSM model of the test family"
    math = ToyMath()


@register
class ToyLiteralBaseline(LiteralBaselineKernel):
    name = "literal-baseline"
    family = "toy"
    description = "literal baseline of the test family"
    math = ToyMath()
