"""The mixer step of a delta-rule family (Gated DeltaNet, KDA), fp64 truth in plain torch: one conv over the
concatenated q | k | v channels (no bias), the family's delta-rule step, then a gated RMSNorm per value head of
``head_v_dim`` channels (its output gate's activation and eps are the family's).

Oracle: each family's ``mixer_naive.py`` (the model source it follows) over its ``naive.py`` step.
Expected error in fp64: ~1e-15 relative.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from replayssm.mixer.spec import MixerSpec


class DeltaRuleMixer(MixerSpec):
    """A family sets ``family``, ``gate_act``, ``norm_eps``, ``real_presets`` and ``step`` (its naive step)."""

    norm_before_gate = True
    conv_bias = False
    step: ClassVar[Callable]

    def conv_inputs(self, g):
        return ("q", "k", "v")

    def norm_group(self, g):
        return g.head_v_dim

    def norm_weight_shape(self, g):
        return (g.head_v_dim,)

    def ssm_step(self, state, tok, params):
        return self.step(state, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], params["A_log"],
                         params["dt_bias"])


__all__ = ["DeltaRuleMixer"]
