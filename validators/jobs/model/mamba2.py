"""A transformers Mamba-2 mixer (Nemotron-H's ``NemotronHMamba2Mixer``) with its recurrence taken out.

Oracle: transformers 5.23's ``NemotronHMamba2Mixer.forward`` and its decode step
(``mamba2_selective_state_update``, the torch fallback), read line by line: the layer's own
``in_proj`` (split into gate z | xBC | dt), its depthwise causal conv (``conv1d``, SiLU) on xBC, split
into x [H, P] | B [G, N] | C [G, N], its gated RMSNorm ``norm(y, z)`` (groups of H P / G, fp32 inside)
and ``out_proj`` run unchanged in the model's dtype; only the selective state update between them is
replaced (the drivers in ``mixer.py``): the teacher's is ``naive.mamba2_step`` token by token in fp64,
the student's the kernel under test, both with A = -exp(A_log), dt_bias and D of the layer, z = None
inside the SSM (the gate is the norm's), softplus(dt + dt_bias) with no floor.  transformers' decode
step has no floor either; its prefill (``mamba2_chunk_scan``) clamps Δ below at ``time_step_limit[0]``,
which tests/jobs/test_model.py sets to 0 where it compares the adapter with the fallback.

Expected error: the reference equals transformers' fallback to ~1e-6 relative (its fp32 scan);
the kernel at s64a64 equals the reference to ~1e-12.
"""

from __future__ import annotations

import torch

from replayssm.ops.mamba2.family import Mamba2Geometry
from replayssm.ops.mamba2.naive import mamba2_step
from replayssm.validators.jobs.model import mixer

FAMILY = "mamba2"


class Mamba2Mixer(mixer.RecurrentMixer):
    """One ``NemotronHMamba2Mixer`` layer; the recurrence's inputs are x, dt, B, C (no z)."""

    layer_classes = ("NemotronHMamba2Mixer",)

    @staticmethod
    def geometry_of(mod) -> Mamba2Geometry:
        return Mamba2Geometry(nheads=mod.num_heads, headdim=mod.head_dim, dstate=mod.ssm_state_size,
                              ngroups=mod.n_groups)

    @staticmethod
    def params_of(mod) -> dict[str, torch.Tensor]:
        f64 = torch.float64
        return {"A": -torch.exp(mod.A_log.detach().to(f64)), "dt_bias": mod.dt_bias.detach().to(f64),
                "D": mod.D.detach().to(f64)}

    def _project(self, h):
        m = self.mod
        gate, xbc, dt = m.in_proj(h)[0].split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
        return xbc, (gate, dt)

    def _inputs(self, c, rest):
        g = self.geometry
        gn = g.ngroups * g.dstate
        x, B, C = torch.split(c, [g.nheads * g.headdim, gn, gn], dim=-1)
        T = c.shape[0]
        return {"x": x.reshape(T, g.nheads, g.headdim), "dt": rest[1], "B": B.reshape(T, g.ngroups, g.dstate),
                "C": C.reshape(T, g.ngroups, g.dstate)}

    def _step(self, state, tok, params):
        return mamba2_step(state, tok["x"], tok["dt"], tok["B"], tok["C"], params["A"], params["dt_bias"],
                           params["D"])

    def _finish(self, o, rest, dtype):
        m = self.mod
        T = o.shape[0]
        y = m.norm(o.to(dtype).reshape(1, T, -1), rest[0][None])
        return m.out_proj(y.to(dtype))


def install(model) -> list[Mamba2Mixer]:
    """Replace the forward of every Mamba-2 mixer of ``model``; the mixers in layer order."""
    return mixer.install(model, Mamba2Mixer)
