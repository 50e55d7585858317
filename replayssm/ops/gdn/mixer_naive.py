"""The Gated DeltaNet mixer step (Qwen3-Next / Qwen3.5 ``GatedDeltaNet`` decode), fp64 truth in plain torch:

    qkv = conv1d(q|k|v packed)  (width d_conv, channels 2*H*K + HV*V, no bias);  q | k | v = SiLU(qkv)
    o, S = naive.gdn_step(S, q, k, v, a, b, A_log, dt_bias)   (q, k L2-normalised inside the step)
    out = RMSNorm(o) * norm_weight * SiLU(z)   per value head (``Qwen3NextRMSNormGated``, eps 1e-6)

Oracle: transformers ``modeling_qwen3_next.py`` (``torch_causal_conv1d_update``, the gated norm);
the delta rule is this family's ``naive.py``, reused.  Expected error in fp64: ~1e-15 relative.
"""

from __future__ import annotations

from replayssm.mixer.spec import register_mixer
from replayssm.ops.delta_rule.mixer import DeltaRuleMixer
from replayssm.ops.gdn import naive


class GDNMixer(DeltaRuleMixer):
    family = "gdn"
    gate_act = "silu"
    norm_eps = 1e-6
    real_presets = ("qwen35-4b",)
    step = staticmethod(naive.gdn_step)


SPEC = register_mixer(GDNMixer())
