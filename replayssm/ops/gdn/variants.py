"""Gated DeltaNet's correct variants beside the literal replay model (the calibration population, docs/calibration.md).

Oracle: ``replayssm/ops/variant_math.py`` (one changed operation order or format each over
``GDNLiteralReplay``); the variants of ``literal.py`` (``-cumprod``, ``-recurrent``), the
staged fold (``literal-replay-staged``) and the fold at the next verify
(``literal-replay-fold-at-next-verify``) are the others.
Expected error: within the tolerance rule of the declared mode.
"""

from __future__ import annotations

from replayssm.ops.gdn.literal import GDNLiteralReplay
from replayssm.ops.variant_math import ComputeFormatRecords, Fp64Weights, IeeeDot, OtherNormForm, UnfusedFold, variant
from replayssm.registry import register

register(variant(GDNLiteralReplay, "literal-replay-unfused-fold", UnfusedFold,
                 "the flush folds the records one at a time (a running state), not as one weighted sum"))
register(variant(GDNLiteralReplay, "literal-replay-fp64-weights", Fp64Weights,
                 "fold decay weights computed in fp64, rounded to the compute dtype"))
register(variant(GDNLiteralReplay, "literal-replay-ieee-dot", IeeeDot,
                 "readout and S k dots in ieee fp32 where the mode declares tf32"))
register(variant(GDNLiteralReplay, "literal-replay-other-norm", OtherNormForm,
                 "q, k normalised by the other form (u * (1 / sqrt) for u / sqrt, and back)"))
register(variant(GDNLiteralReplay, "literal-replay-fp32-records", ComputeFormatRecords,
                 "d and normalised k records kept in the compute format (fp32), not the activation format"))
