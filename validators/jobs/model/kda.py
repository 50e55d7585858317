"""A transformers Kimi Delta Attention layer (``KimiLinearDeltaAttention``) with its recurrence taken out.

Oracle: transformers 5.23's ``KimiLinearDeltaAttention.forward`` and its ``KimiLinearForgetGate``, read
line by line: the layer's own ``q_proj`` / ``k_proj`` / ``v_proj`` (concatenated q | k | v, the conv
input), its depthwise causal conv (``conv1d``, no bias, SiLU), the forget gate's low-rank projection
``f_b_proj(f_a_proj(h))`` (the per-channel gate pre-activation a ``[H, K]``), ``b_proj`` (beta's
pre-activation), the gated RMSNorm ``o_norm(o, g_b_proj(g_a_proj(h)))`` (fp32 inside, sigmoid gate)
and ``o_proj`` run unchanged in the model's dtype; only the KDA recurrence between them is replaced
(the drivers in ``mixer.py``): the teacher's is ``naive.kda_step`` token by token in fp64, the
student's the kernel under test, both with the layer's ``A_log [1, 1, H, 1]`` viewed as ``[H]`` and
``dt_bias [H K]`` as ``[H, K]``: g = -exp(A_log) softplus(a + dt_bias) (threshold 20, as transformers'
``torch.where(g > 20, ...)``), beta = sigmoid(b), q and k L2-normalised with eps 1e-6 (division form,
transformers' ``l2norm``), q scaled by K^-1/2.  Kimi-Linear has one head count for q, k and v
(``linear_num_heads``) and K = V (``linear_head_dim``).  transformers' recurrence and gate compute in
fp32 whatever the model's dtype, so the adapter computes them itself; tests/jobs/test_model.py checks
it against transformers' fallback.

Expected error: the reference equals transformers' fallback to ~1e-6 relative (its fp32 recurrence and
gate); the kernel at s64a64 equals the reference to ~1e-12.
"""

from __future__ import annotations

import torch

from replayssm.ops.kda.family import KDAGeometry
from replayssm.ops.kda.naive import kda_step
from replayssm.validators.jobs.model import mixer

FAMILY = "kda"


class KDAMixer(mixer.RecurrentMixer):
    """One ``KimiLinearDeltaAttention`` layer; the recurrence's inputs are q, k, v, a, b."""

    layer_classes = ("KimiLinearDeltaAttention",)

    @staticmethod
    def geometry_of(mod) -> KDAGeometry:
        return KDAGeometry(num_k_heads=mod.num_heads, num_v_heads=mod.num_heads, head_k_dim=mod.head_dim,
                           head_v_dim=mod.head_dim)

    @staticmethod
    def params_of(mod) -> dict[str, torch.Tensor]:
        f, f64 = mod.forget_gate, torch.float64
        return {"A_log": f.A_log.detach().to(f64).reshape(mod.num_heads),
                "dt_bias": f.dt_bias.detach().to(f64).reshape(mod.num_heads, mod.head_dim)}

    def _project(self, h):
        m = self.mod
        u = torch.cat([m.q_proj(h), m.k_proj(h), m.v_proj(h)], dim=-1)[0]  # [T, 3 H K]
        T = u.shape[0]
        a = m.forget_gate.f_b_proj(m.forget_gate.f_a_proj(h))[0].reshape(T, m.num_heads, m.head_dim)
        gate = m.g_b_proj(m.g_a_proj(h))[0].reshape(T, m.num_heads, m.head_dim)
        return u, (a, m.b_proj(h)[0], gate)

    def _inputs(self, c, rest):
        m = self.mod
        a, b, _ = rest
        T = c.shape[0]
        q, k, v = (x.reshape(T, m.num_heads, m.head_dim) for x in torch.split(c, [m.qkv_dim] * 3, dim=-1))
        return {"q": q, "k": k, "v": v, "a": a, "b": b}

    def _step(self, state, tok, params):
        return kda_step(state, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], params["A_log"], params["dt_bias"])

    def _finish(self, o, rest, dtype):
        m = self.mod
        T = o.shape[0]
        y = m.o_norm(o.to(dtype)[None], rest[2][None]).reshape(1, T, -1)
        return m.o_proj(y)


def install(model) -> list[KDAMixer]:
    """Replace the forward of every KDA layer of ``model``; the mixers in layer order."""
    return mixer.install(model, KDAMixer)
