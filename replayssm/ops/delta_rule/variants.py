"""A delta-rule family's correct variants beside its literal replay model (the calibration population,
docs/calibration.md): :func:`register_variants` registers them over the family's ``literal-replay`` class.

Oracle: ``replayssm/ops/variant_math.py`` (one changed operation order or format each over the literal
replay model); the variants of the family's ``literal.py`` (``-cumprod``, ``-recurrent``), the staged fold
(``literal-replay-staged``) and the fold at the next verify (``literal-replay-fold-at-next-verify``) are the
others.
Expected error: within the tolerance rule of the declared mode.
"""

from __future__ import annotations

from replayssm.ops.variant_math import (
    ComputeFormatRecords,
    Fp64Weights,
    IeeeDot,
    OtherNormForm,
    TruncatedTf32Dot,
    UnfusedFold,
    variant,
)
from replayssm.registry import register

VARIANTS = (
    ("literal-replay-unfused-fold", UnfusedFold,
     "the flush folds the records one at a time (a running state), not as one weighted sum"),
    ("literal-replay-fp64-weights", Fp64Weights, "fold decay weights computed in fp64, rounded to the compute dtype"),
    ("literal-replay-ieee-dot", IeeeDot, "readout and S k dots in ieee fp32 where the mode declares tf32"),
    ("literal-replay-tf32-truncated", TruncatedTf32Dot,
     "readout and S k dots' tf32 operands cut toward zero (a tensor core given fp32 operands unrounded)"),
    ("literal-replay-other-norm", OtherNormForm,
     "q, k normalised by the other form (u * (1 / sqrt) for u / sqrt, and back)"),
    ("literal-replay-fp32-records", ComputeFormatRecords,
     "d and normalised k records kept in the compute format (fp32), not the activation format"),
)


def register_variants(replay_cls: type) -> None:
    """Register the delta-rule variants over ``replay_cls`` (a family's literal replay kernel class)."""
    for name, mixin, description in VARIANTS:
        register(variant(replay_cls, name, mixin, description))


__all__ = ["VARIANTS", "register_variants"]
