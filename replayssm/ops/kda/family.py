"""The Kimi Delta Attention family: geometry and presets, parameter and input laws, the reference
hooks, the readout magnitude, the Hypothesis geometry piece and the bench's bytes model.

Oracle: ``naive.py`` (the KDA recurrence as flash-linear-attention 0.6.0 writes it) for the
numbers, the bytes model of docs/recurrences.md sections 2-4 for traffic.

Presets:

* ``kimi-linear-48b``: a KDA layer of Kimi-Linear-48B-A3B (moonshotai/Kimi-Linear-48B-A3B-Instruct,
  ``config.json`` ``linear_attn_config``: ``num_heads`` 32, ``head_dim`` 128 for q, k and v,
  ``short_conv_kernel_size`` 4; 20 of its 27 layers are KDA).  The short convolution runs on q, k, v
  before the recurrence and keeps its own 3-token state: it is not part of this op.
* ``tiny``: 2 key heads, 4 value heads (so a wrong head map shows), K = 16, V = 8, for CPU tests.
* ``tiny-mha``: ``tiny`` with one head count (2) for q, k and v, for kernels without GQA (vLLM
  0.33.0's KDA RecoverSSM).

Laws: the gate pre-activation ``a`` per key channel follows the scenario's gate law (normal times
``dt_scale``); ``A_log [HV]`` is ``log`` of U(``neg_A``), ``dt_bias [HV, K]`` is offset + spread
U per channel (FLA's ``naive_kda_gate`` form, with its ``[H * K]`` bias viewed as ``[HV, K]``), so
each channel decays at its own rate; ``b`` (beta's pre-activation) is N(0, 1); q, k are L2
normalised inside the op; ``v`` follows the value law.  The same laws feed the bounded gate law
(the declared convention ``gate_lower_bound`` lb, ``naive.py``): ``exp(A_log) (a + dt_bias)`` then
sets where in (lb, 0) each channel's log decay falls (a large positive argument: near lb, fast
forgetting; a negative one: near 0, long memory), so the scenarios' gate laws span the same
short-to-long-memory range under either law.
"""

from __future__ import annotations

from dataclasses import dataclass

from replayssm.conventions import DEFAULT
from replayssm.families import FamilyMutant, register_family
from replayssm.ops.delta_rule.family import DeltaRuleFamily, DeltaRuleGeometry
from replayssm.ops.kda import literal, naive
from replayssm.ops.kda import mutants as broken


@dataclass(frozen=True)
class KDAGeometry(DeltaRuleGeometry):
    """State ``[slots, HV, V, K]``; per token ``q, k [H, K]``, ``v [HV, V]``, ``a [HV, K]``, ``b [HV]``;
    parameters ``A_log [HV]``, ``dt_bias [HV, K]``; output ``o [HV, V]``."""

    family: str = "kda"
    per_channel_gate = True


class KimiDeltaAttention(DeltaRuleFamily):
    name = "kda"
    description = ("Kimi Delta Attention, the delta rule with a per-key-channel gate; ReplaySSM records d, "
                   "normalised k, per-channel g")
    geometry_cls = KDAGeometry
    presets = {
        "tiny": KDAGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8),
        "tiny-mha": KDAGeometry(num_k_heads=2, num_v_heads=2, head_k_dim=16, head_v_dim=8),
        # K = V: a state transposed in memory has the same shape (SGLang #40398, mutant-transposed-state)
        "tiny-square": KDAGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16),
        "kimi-linear-48b": KDAGeometry(num_k_heads=32, num_v_heads=32, head_k_dim=128, head_v_dim=128),
    }
    bench_geometry = "kimi-linear-48b"
    conventions = DeltaRuleFamily.conventions + ("gate_lower_bound",)
    literal_replay_cls = literal.KDALiteralReplay
    literal_baseline_cls = literal.KDALiteralBaseline

    def reference_advance(self, state, prep, params, conv=DEFAULT):
        t = prep
        return naive.kda_step(state, t["q"], t["k"], t["v"], t["a"], t["b"], params["A_log"], params["dt_bias"],
                              conv)

    def readout_magnitude(self, state_abs, tok, params):
        qh, _ = naive.kda_prepare(tok["q"], tok["k"], state_abs.shape[-3])
        return (state_abs * qh.abs()[..., None, :]).sum(-1)

    mutants = (
        FamilyMutant(broken.GateOnValueAxis, "mutant-gate-on-value-axis",
                     "KDA history fold applies the per-channel decay along the value axis instead of the key axis",
                     klass="arithmetic"),
        FamilyMutant(broken.ScalarGate, "mutant-scalar-gate",
                     "KDA reads one gate per head (channel 0's) where a per-key-channel vector is declared",
                     klass="arithmetic"),
        FamilyMutant(broken.LogGateSumsBf16, "mutant-log-gate-sums-bf16",
                     "KDA history fold keeps the cumulative sums of the per-channel log gates in bf16",
                     klass="precision"),
        FamilyMutant(broken.SolveWithoutBeta, "mutant-kda-solve-without-beta",
                     "KDA in-window WY/UT solve drops beta_i from the off-diagonal", klass="arithmetic",
                     decodes=("speculative",)),
    )

    def bench_launch_candidates(self, kind, decode, batch):
        # the other path beside the default: the speculative verify's single kernel beside its pre-pass +
        # stream pair; in standard decode the pair beside the default single launch
        if kind == "replay":
            return [{}, {"prepass": False}] if decode.speculative else [{}, {"prepass": True}]
        return [{}]


FAMILY = register_family(KimiDeltaAttention())
