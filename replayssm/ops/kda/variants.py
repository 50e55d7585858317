"""KDA's correct variants beside ``KDALiteralReplay`` (the calibration population, docs/calibration.md): the
delta rule's (``replayssm/ops/delta_rule/variants.py``).  Oracle: ``replayssm/ops/variant_math.py``, one
changed operation order or format each.  Expected error: within the tolerance rule of the declared mode.
"""

from __future__ import annotations

from replayssm.ops.delta_rule.variants import register_variants
from replayssm.ops.kda.literal import KDALiteralReplay

register_variants(KDALiteralReplay)
