"""A transformers Gated DeltaNet layer (``Qwen3NextGatedDeltaNet``, ``Qwen3_5GatedDeltaNet``) with its
recurrence taken out.

Oracle: transformers 5.23's ``Qwen3NextGatedDeltaNet.forward`` and ``Qwen3_5GatedDeltaNet.forward``,
read line by line.  The two layers differ only in how the hidden state is projected to the conv input
q | k | v and to z, b, a (:data:`PROJECTIONS`, the one seam): qwen3_next's fused ``in_proj_qkvz`` /
``in_proj_ba`` in per-key-head groups, reordered by the layer's ``fix_query_key_value_ordering``;
Qwen3.5's separate ``in_proj_qkv`` (already q | k | v, flat), ``in_proj_z``, ``in_proj_b`` and
``in_proj_a``.  Everything else is shared: the conv input's layout (q [key_dim] | k [key_dim] |
v [value_dim]), its depthwise causal conv (``conv1d.weight``, SiLU), the gated RMSNorm ``norm(o, z)``
and ``out_proj`` run unchanged in the model's dtype; only the gated delta rule between them is
replaced (the drivers in ``mixer.py``): the teacher's is ``naive.gdn_step`` token by token in fp64
(transformers' own recurrence, whose torch fallback computes in fp32 whatever the model's dtype;
tests/jobs/test_model.py checks the adapter against it to fp32 rounding, for both layers), the
student's the kernel under test.

Expected error: the reference equals transformers' fallback to ~1e-6 relative (its fp32 arithmetic);
the kernel at s64a64 equals the reference to ~1e-12.
"""

from __future__ import annotations

import torch

from replayssm.ops.gdn.family import GDNGeometry
from replayssm.ops.gdn.naive import gdn_step
from replayssm.validators.jobs.model import mixer

FAMILY = "gdn"


def _qwen3_next_projection(m, h):
    q, k, v, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(h), m.in_proj_ba(h))
    u = torch.cat([x.reshape(x.shape[0], x.shape[1], -1) for x in (q, k, v)], dim=-1)[0]  # [T, C]
    return u, z[0], b[0], a[0]


def _qwen3_5_projection(m, h):
    T = h.shape[1]
    z = m.in_proj_z(h)[0].reshape(T, m.num_v_heads, m.head_v_dim)
    return m.in_proj_qkv(h)[0], z, m.in_proj_b(h)[0], m.in_proj_a(h)[0]


# Layer class -> (mod, h [1, T, hidden]) -> (conv input [T, key_dim 2 + value_dim] as q | k | v,
# z [T, Hv, V], b [T, Hv], a [T, Hv]).
PROJECTIONS = {"Qwen3NextGatedDeltaNet": _qwen3_next_projection, "Qwen3_5GatedDeltaNet": _qwen3_5_projection}


class GDNMixer(mixer.RecurrentMixer):
    """One Gated DeltaNet layer of a class in :data:`PROJECTIONS`; the recurrence's inputs are q, k, v, a, b."""

    layer_classes = tuple(PROJECTIONS)

    @staticmethod
    def geometry_of(mod) -> GDNGeometry:
        return GDNGeometry(num_k_heads=mod.num_k_heads, num_v_heads=mod.num_v_heads, head_k_dim=mod.head_k_dim,
                           head_v_dim=mod.head_v_dim)

    @staticmethod
    def params_of(mod) -> dict[str, torch.Tensor]:
        return {"A_log": mod.A_log.detach().to(torch.float64), "dt_bias": mod.dt_bias.detach().to(torch.float64)}

    def _project(self, h):
        u, z, b, a = PROJECTIONS[type(self.mod).__name__](self.mod, h)
        return u, (z, b, a)

    def _inputs(self, c, rest):
        m, g = self.mod, self.geometry
        _, b, a = rest
        q, k, v = torch.split(c, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
        T = c.shape[0]
        return {"q": q.reshape(T, g.num_k_heads, g.head_k_dim), "k": k.reshape(T, g.num_k_heads, g.head_k_dim),
                "v": v.reshape(T, g.num_v_heads, g.head_v_dim), "a": a, "b": b}

    def _step(self, state, tok, params):
        return gdn_step(state, tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], params["A_log"], params["dt_bias"])

    def _finish(self, o, rest, dtype):
        m, z = self.mod, rest[0]
        T = o.shape[0]
        y = m.norm(o.to(dtype).reshape(-1, o.shape[-1]), z.reshape(-1, z.shape[-1]))
        return m.out_proj(y.reshape(1, T, -1))


def install(model) -> list[GDNMixer]:
    """Replace the forward of every GDN layer of ``model``; the mixers in layer order."""
    return mixer.install(model, GDNMixer)
