"""The Kimi Delta Attention mixer step (Kimi-Linear ``KimiDeltaAttention`` decode), fp64 truth in plain torch:

    q, k, v = SiLU(ShortConvolution(q)), SiLU(...(k)), SiLU(...(v))   three depthwise convs of width
              d_conv, no bias; kept here as one conv over the concatenated channels q | k | v
              (a depthwise conv is per channel, so the two are the same numbers)
    o, S = naive.kda_step(S, q, k, v, a, b, A_log, dt_bias)   (per-channel gate, L2 norm inside)
    out = RMSNorm(o) * norm_weight * sigmoid(z)   per head (fla ``FusedRMSNormGated(activation="sigmoid")``,
          eps 1e-5)

Oracle: fla ``layers/kda.py`` (``q_conv1d``/``k_conv1d``/``v_conv1d``, ``o_norm``); the delta rule is this
family's ``naive.py``, reused.  Expected error in fp64: ~1e-15 relative.
"""

from __future__ import annotations

from replayssm.mixer.spec import register_mixer
from replayssm.ops.delta_rule.mixer import DeltaRuleMixer
from replayssm.ops.kda import naive


class KDAMixer(DeltaRuleMixer):
    family = "kda"
    gate_act = "sigmoid"
    norm_eps = 1e-5
    real_presets = ("kimi-linear-48b",)
    step = staticmethod(naive.kda_step)


SPEC = register_mixer(KDAMixer())
