"""The Gated DeltaNet family: geometry and presets, parameter and input laws, the reference hooks,
the readout magnitude, the Hypothesis geometry piece and the bench's bytes model.

Oracle: docs/recurrences.md section 1 (``naive.py``) for the numbers, the bytes model of its sections 2-4
for traffic.
Presets: ``qwen35-4b`` is a Qwen3.5-4B GDN layer (16 key / 32 value heads, 128 x 128),
``gdn-hv64`` the 64-value-head variant of larger Qwen3.5 models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm.conventions import DEFAULT
from replayssm.families import FamilyMutant, register_family
from replayssm.ops.delta_rule.family import DeltaRuleFamily, DeltaRuleGeometry
from replayssm.ops.gdn import literal, naive
from replayssm.ops.gdn import mutants as broken
from replayssm.ops.ordered_sum import pairwise_sum
from replayssm.ops.triton.reference import reference_rows


@dataclass(frozen=True)
class GDNGeometry(DeltaRuleGeometry):
    """State ``[slots, HV, V, K]``; per token ``q, k [H, K]``, ``v [HV, V]``, ``a, b [HV]``;
    parameters ``A_log, dt_bias [HV]``; output ``o [HV, V]``."""

    family: str = "gdn"


class GatedDeltaNet(DeltaRuleFamily):
    name = "gdn"
    description = ("Gated DeltaNet, the gated delta rule (docs/recurrences.md section 1); ReplaySSM records d, "
                   "normalised k, g")
    geometry_cls = GDNGeometry
    presets = {
        "tiny": GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8),
        # K = V: a state transposed in memory has the same shape (SGLang #40398, mutant-transposed-state)
        "tiny-square": GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16),
        "qwen35-4b": GDNGeometry(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
        "gdn-hv64": GDNGeometry(num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128),
    }
    bench_geometry = "qwen35-4b"
    literal_replay_cls = literal.GDNLiteralReplay
    literal_baseline_cls = literal.GDNLiteralBaseline
    mutants = (
        FamilyMutant(broken.SolveWithoutBeta, "mutant-solve-without-beta",
                     "GDN in-window WY/UT solve drops beta_i from the off-diagonal", klass="arithmetic",
                     decodes=("speculative",)),
    )
    def reference_advance(self, state, prep, params, conv=DEFAULT):
        t = prep
        return naive.gdn_step(state, t["q"], t["k"], t["v"], t["a"], t["b"], params["A_log"], params["dt_bias"], conv)

    def _gates(self, prep, params, dtype):
        a, b = prep["a"].to(dtype), prep["b"].to(dtype)
        g, beta = naive.gdn_gates(a, b, params["A_log"].to(dtype), params["dt_bias"].to(dtype))
        return torch.exp(g), beta

    def reference_hoist(self, prep, params):
        alpha, beta = self._gates(prep, params, prep["q"].dtype)
        return {**prep, "alpha": alpha, "beta": beta}

    def reference_advance_fused(self, state, prep, params, rows=None, keep=None):
        y, new, _ = self.reference_advance_magnitude(state, prep, params, rows, keep)
        return y, new

    def reference_advance_magnitude(self, state, prep, params, rows=None, keep=None):
        # naive.gdn_step line by line; its state-sized work, S k, d = beta (v - alpha S k), alpha S + d k^T and
        # the readout sums over K (pairwise_sum of S' q and of |S'| |q|), in one pass per row
        # (ops/triton/reference.py)
        dtype = state.dtype
        q, k, v = (prep[n].to(dtype) for n in ("q", "k", "v"))
        qh, kh = naive.gdn_prepare(q, k, v.shape[-2])
        alpha, beta = (prep["alpha"], prep["beta"]) if "alpha" in prep else self._gates(prep, params, dtype)
        HV, V, K = state.shape[-3:]
        new, o, mag = reference_rows(state.reshape(-1, HV, V, K), alpha, v, kh, qh, beta=beta, live=rows,
                                     keep=keep)
        lead = state.shape[:-1]
        return o.view(lead), new.view(state.shape), mag.view(lead)

    def readout_magnitude(self, state_abs, tok, params):
        qh, _ = naive.gdn_prepare(tok["q"], tok["k"], state_abs.shape[-3])
        return pairwise_sum(state_abs * qh.abs()[..., None, :])

    def bench_launch_candidates(self, kind, decode, batch):
        if kind == "baseline":
            if decode.speculative:
                return [{"block_v": 8, "num_warps": 1}, {"block_v": 16, "num_warps": 2}]
            return [{"block_v": 8, "num_warps": 1}, {"block_v": 32, "num_warps": 4}]
        if decode.speculative:  # + the pre-pass on 4 warps (on one it is register-limited at 19 % occupancy, 11 %
            # of a verify at batch 512: docs/benchmarks.md; the ieee dot and split readouts, slower there, are
            # left out; the two-launch path below 16 rows too: slower than the single kernel at batch 8)
            # + the pair with programmatic dependent launch (measured equal from 128 rows, slower at 8)
            return [{}, {"prepass": False, "block_v": 16, "num_warps": 1}, {"coef_warps": 4},
                    {"prepass": True, "pdl": True}]
        # (the one launch with 4 or 16 value blocks per program, KDA's default, measured slower here:
        # ops/gdn/replay.py decode_tiles)
        # (the default: the pair with programmatic dependent launch from 8 rows; pdl=False: the pair without it
        # from 16 rows, the single kernel below)
        return [{}, {"prepass": False, "block_v": 8, "num_warps": 1}, {"pdl": False},
                {"prepass": True, "block_v": 16, "num_warps": 1}]


FAMILY = register_family(GatedDeltaNet())
