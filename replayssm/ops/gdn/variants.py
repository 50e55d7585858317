"""Gated DeltaNet's correct variants beside the literal replay model (the calibration population, docs/calibration.md).

Oracle: ``replayssm/ops/delta_rule/variants.py`` over ``replayssm/ops/variant_math.py`` (one changed
operation order or format each over ``GDNLiteralReplay``); the variants of ``literal.py`` (``-cumprod``,
``-recurrent``), the staged fold (``literal-replay-staged``) and the fold at the next verify
(``literal-replay-fold-at-next-verify``) are the others.
Expected error: within the tolerance rule of the declared mode.
"""

from __future__ import annotations

from replayssm.ops.delta_rule.variants import register_variants
from replayssm.ops.gdn.literal import GDNLiteralReplay

register_variants(GDNLiteralReplay)
