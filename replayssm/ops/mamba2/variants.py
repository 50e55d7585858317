"""Mamba-2's correct variants beside the literal replay model (the calibration population, docs/calibration.md).

Oracle: ``replayssm/ops/variant_math.py`` (one changed operation order or format each over
``Mamba2LiteralReplay``); the variants of ``literal.py`` (``-state``, ``-cumprod``,
``-cumsum-exp``), the staged fold (``literal-replay-staged``) and the fold at the next verify
(``literal-replay-fold-at-next-verify``) are the others.
Expected error: within the tolerance rule of the declared mode.
"""

from __future__ import annotations

from replayssm.ops.mamba2.literal import Mamba2LiteralReplay
from replayssm.ops.variant_math import Fp64Weights, IeeeDot, UnfusedFold, variant
from replayssm.registry import register

register(variant(Mamba2LiteralReplay, "literal-replay-unfused-fold", UnfusedFold,
                 "the flush folds the records one at a time (a running state), not as one weighted sum"))
register(variant(Mamba2LiteralReplay, "literal-replay-fp64-weights", Fp64Weights,
                 "decay weights computed in fp64, rounded to the compute dtype"))
register(variant(Mamba2LiteralReplay, "literal-replay-ieee-dot", IeeeDot,
                 "readout dots in ieee fp32 where the mode declares tf32"))
