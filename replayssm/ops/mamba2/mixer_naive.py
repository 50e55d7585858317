"""The Mamba-2 mixer step (mamba_ssm ``Mamba2`` decode, Nemotron-H's mixer), fp64 truth in plain torch:

    xBC = conv1d(xBC) + conv_bias  (width d_conv, channels H*P + 2*G*N);  x | B | C = SiLU(xBC)
    y, S = naive.mamba2_step(S, x, dt, B, C, A, dt_bias, D)      (no z inside the SSM)
    out = RMSNorm(y * SiLU(z)) * norm_weight   over groups of H*P / G  (``RMSNormGated``,
          ``norm_before_gate=False``, ``group_size = d_ssm / ngroups``, eps 1e-5)

Oracle: mamba_ssm ``modules/mamba2.py`` (``step``) and ``ops/triton/layernorm_gated.py``'s reference;
the SSM part is this family's ``naive.py``, reused.  Expected error in fp64: ~1e-15 relative.
"""

from __future__ import annotations

from dataclasses import replace

from replayssm.mixer.spec import MixerSpec, register_mixer
from replayssm.ops.mamba2 import naive


class Mamba2Mixer(MixerSpec):
    family = "mamba2"
    gate_act = "silu"
    norm_before_gate = False
    norm_eps = 1e-5
    conv_bias = True
    real_presets = ("nano4b",)

    def conv_inputs(self, g):
        return ("x", "B", "C")

    def ssm_geometry(self, g):
        return replace(g, has_z=False) if g.has_z else g

    def norm_group(self, g):
        return g.nheads * g.headdim // g.ngroups

    def norm_weight_shape(self, g):
        return (g.nheads * g.headdim,)

    def ssm_step(self, state, tok, params):
        return naive.mamba2_step(state, tok["x"], tok["dt"], tok["B"], tok["C"], params["A"], params["dt_bias"],
                                 params["D"])


SPEC = register_mixer(Mamba2Mixer())
