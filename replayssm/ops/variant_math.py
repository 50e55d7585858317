"""Correct variants of a family's literal math: one changed operation order or format each, whatever the family.

Oracle: each mixin changes one thing a real kernel may do differently without being wrong, the
rest is the family's literal math (``replayssm/ops/<family>/literal.py``) through ``super()``:

* :class:`UnfusedFold` -- the flush folds the buffered records one at a time (a running state
  updated per record, ``S <- decay_j S + contribution_j``) instead of one fused weighted sum;
* :class:`Fp64Weights` -- the fold's decay weights computed in fp64, then rounded to the
  compute dtype (more accurate than the literal model's fp32 cumulative sums);
* :class:`IeeeDot` -- the readout and the delta rule's ``S k`` dots in full fp32 where the mode
  declares tf32 dots (a declared tf32 dot is a licence, not an obligation);
* :class:`TruncatedTf32Dot` -- the tf32 dots' fp32 operands cut toward zero, as tensor cores do with
  operands given unrounded (Triton's tf32 ``tl.dot``), where the literal model rounds them to nearest;
* :class:`OtherNormForm` -- q, k normalised by the other form of the declared convention
  (``u * (1 / sqrt(.))`` for ``u / sqrt(.)`` and back): an fp32 ulp per element;
* :class:`ComputeFormatRecords` -- the records the mode rounds to the activation format (GDN and
  KDA's ``d`` and normalised ``k``) kept in the compute format instead (records more precise than
  the mode allows for; Mamba-2's act records are its inputs, already in that format).

:func:`variant` builds the registered kernel class of one variant from a literal replay kernel.
Expected error: within the tolerance rule of the declared mode (the population of
``validators/jobs/calibration.py``; its false-alarm table is docs/calibration.md).
"""

from __future__ import annotations

import dataclasses

import torch

from replayssm.conventions import DEFAULT
from replayssm.ops.literal import FamilyMath, LiteralReplayKernel


class UnfusedFold:
    """The fold of ``n`` records as ``n`` folds of one record each (a running state)."""

    def fold(self, s0, hist, params, mode):
        n = next(iter(hist.values())).shape[0]
        s = s0
        for j in range(n):
            s = super().fold(s, {k: v[j:j + 1] for k, v in hist.items()}, params, mode)
        return s


class Fp64Weights:
    """The fold's decay weights (``decays``) computed in fp64 and rounded to the compute dtype."""

    def decays(self, *args):
        dt = next(a.dtype for a in args if isinstance(a, torch.Tensor))
        wide = [a.to(torch.float64) if isinstance(a, torch.Tensor) else a for a in args]
        return tuple(w.to(dt) for w in super().decays(*wide))


class IeeeDot:
    """The window computed with ieee fp32 dots whatever dot the mode declares."""

    def window(self, s0, hist, win, params, mode, options, **conv):
        return super().window(s0, hist, win, params, dataclasses.replace(mode, dot="ieee"), options, **conv)


class _Tf32Truncating:
    """A precision mode read through, its tf32 dot operands cut toward zero (``tf32_truncates``)."""

    tf32_truncates = True

    def __init__(self, mode):
        self._mode = mode

    def __getattr__(self, name):
        return getattr(self._mode, name)


class TruncatedTf32Dot:
    """The window's tf32 dots with their fp32 operands cut to tf32 toward zero, as a tensor core does with
    operands it is given unrounded (Triton's tf32 ``tl.dot`` on NVIDIA GPUs), where the literal model rounds
    them to nearest: the same declared tf32 dot, a one-signed error up to twice as large per operand."""

    def window(self, s0, hist, win, params, mode, options, **conv):
        return super().window(s0, hist, win, params, _Tf32Truncating(mode) if mode.dot == "tf32" else mode, options,
                              **conv)


class OtherNormForm:
    """q, k normalised by the other form (division <-> reciprocal) than the declared convention."""

    def window(self, s0, hist, win, params, mode, options, **conv):
        from_conv = conv.get("conv", DEFAULT)
        other = "reciprocal" if from_conv.l2_form == "division" else "division"
        return super().window(s0, hist, win, params, mode, options,
                              conv=dataclasses.replace(from_conv, l2_form=other))


class ComputeFormatRecords:
    """Every record kept in the compute format (role ``decay``), none rounded to the activation format."""

    def record_layout(self, geometry):
        return {k: (shape, "decay") for k, (shape, _role) in super().record_layout(geometry).items()}


def with_mixin(math: FamilyMath, mixin: type) -> FamilyMath:
    """A copy of the family math object ``math`` whose class also has ``mixin`` (first in the MRO)."""
    cls = type(f"{mixin.__name__}{type(math).__name__}", (mixin, type(math)), {})
    out = cls.__new__(cls)
    out.__dict__.update(vars(math))
    return out


def variant(base: type[LiteralReplayKernel], name: str, mixin: type, description: str) -> type[LiteralReplayKernel]:
    """The kernel class ``name`` of ``base`` (a literal replay kernel) with its math changed by ``mixin``
    (to be passed to ``replayssm.registry.register``)."""
    return type(f"{mixin.__name__}{base.__name__}", (base,),
                {"name": name, "family": base.family, "description": f"legitimate variant: {description}",
                 "math": with_mixin(base.math, mixin), "__module__": base.__module__})


__all__ = ["ComputeFormatRecords", "Fp64Weights", "IeeeDot", "OtherNormForm", "TruncatedTf32Dot", "UnfusedFold",
           "variant", "with_mixin"]
