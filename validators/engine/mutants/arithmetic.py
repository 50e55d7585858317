"""Arithmetic mutants of the gallery: a wrong formula in the literal math, one each.

Oracle: each mutant is a literal model (``replayssm/ops/*/literal.py``) plus exactly one deliberate
bug in its arithmetic (prefix sums, head mapping, softplus); the tolerance rule on states and outputs
must catch it.  Each applies to every family having the mechanism it ``needs``; slips of one family's
own arithmetic (GDN's in-window solve, Mamba-2's skip term) live in that family's folder.
"""

from __future__ import annotations

import dataclasses

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.literal import WindowResult
from replayssm.validators.engine.mutants._common import DelegatingMath, WrapMath, patched, with_methods
from replayssm.validators.engine.mutants.registry import register_mutant


def _exclusive_cumsum(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The bug: c_j = sum_{i < j} instead of sum_{i <= j}."""
    return _CUMSUM(x, dim=dim) - x


_CUMSUM = torch.cumsum


class _ExclusiveDecays:
    """A family math whose fold's decay weights (``decays``: Mamba-2's Δ sums, GDN's scalar and
    KDA's per-channel log-gate sums) take an exclusive prefix sum."""

    def decays(self, *args):
        with patched(torch, "cumsum", _exclusive_cumsum):
            return super().decays(*args)


class ExclusiveCumsum:
    """The history fold decays with an exclusive instead of inclusive prefix sum (flush checkpoint
    and committed state wrong; window outputs, computed separately, right)."""

    def __init__(self, config):
        super().__init__(config)
        self.math = with_methods(type(self).math, _ExclusiveDecays)


def _tile_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, N] -> [..., heads, N] with head h using group h % G (the bug: tiling, not interleaving)."""
    reps = [1] * t.dim()
    reps[-2] = heads // t.shape[-2]
    return t.repeat(*reps)


# The inputs read per group (Mamba-2 B, C) or per key head (GDN, KDA q, k): "grouped-heads".
_GROUPED = ("B", "C", "q", "k")


class _TiledHeadsMath(DelegatingMath):
    """Head h reads group (or key head) h % G instead of h // (H / G)."""

    def _expand(self, s0, d: dict) -> dict:
        return {k: (_tile_heads(v, s0.shape[0]) if k in _GROUPED else v) for k, v in d.items()}

    def fold(self, s0, hist, params, mode):
        return self.inner.fold(s0, self._expand(s0, hist), params, mode)

    def window(self, s0, hist, win, params, mode, options):
        res = self.inner.window(s0, self._expand(s0, hist), self._expand(s0, win), params, mode, options)
        # the records keep one row per group: the tiled copy's first G rows are the groups themselves
        records = {k: (v[..., :win[k].shape[-2], :] if k in _GROUPED and k in win else v)
                   for k, v in res.records.items()}
        return WindowResult(res.outputs, records, self.fold(s0, hist, params, mode), res.state_after_first)


class TiledHeadGroups(WrapMath):
    """Wrong head-to-group mapping: head h uses group h % G (Mamba-2 B, C) or key head h % H
    (GDN, KDA q, k) instead of h // (H / G)."""

    math_wrapper = _TiledHeadsMath


class DtBiasTwice:
    """dt_bias is added twice before the softplus (once by the caller, once in the kernel)."""

    def __init__(self, config):
        super().__init__(config)
        self.params = {**self.params, "dt_bias": 2 * self.params["dt_bias"]}


class _SoftplusThresholdMath(DelegatingMath):
    def window(self, s0, hist, win, params, mode, options, conv=DEFAULT):
        # The bug: the window computes with threshold 2 while the kernel declares the default 20.
        return self.inner.window(s0, hist, win, params, mode, options,
                                 conv=dataclasses.replace(conv, softplus_threshold=2.0))


class SoftplusThreshold(WrapMath):
    """softplus switches to the identity for u > 2 instead of u > 20 (a threshold typed for a
    different dtype, undeclared): Δ / the gate is off by log1p(exp(-u)) for 2 < u <= 20."""

    math_wrapper = _SoftplusThresholdMath


# ---- registration --------------------------------------------------------------------------------------
register_mutant(ExclusiveCumsum, "mutant-exclusive-cumsum",
                "history fold decays with an exclusive instead of inclusive prefix sum", klass="arithmetic",
                needs=("decay-records",))
register_mutant(TiledHeadGroups, "mutant-tiled-head-groups",
                "head h uses group h % G (tiled) instead of h // (H/G) (Mamba-2 B/C, GDN/KDA q/k)", klass="arithmetic",
                needs=("grouped-heads",))
register_mutant(DtBiasTwice, "mutant-dt-bias-twice", "dt_bias added twice before the softplus", klass="arithmetic",
                needs=("dt-bias",))
register_mutant(SoftplusThreshold, "mutant-softplus-threshold",
                "softplus switches to the identity above 2 instead of 20", klass="arithmetic", needs=("softplus-gate",))

__all__: list[str] = []
