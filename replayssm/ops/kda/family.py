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

from dataclasses import asdict, dataclass

import torch

from replayssm.conventions import DEFAULT
from replayssm.families import Family, FamilyMutant, RecordTraffic, check_positive_dims, register_family, uniform_in
from replayssm.ops.kda import literal, naive
from replayssm.ops.kda import mutants as broken
from replayssm.precision import PrecisionMode


@dataclass(frozen=True)
class KDAGeometry:
    """State ``[slots, HV, V, K]``; per token ``q, k [H, K]``, ``v [HV, V]``, ``a [HV, K]``, ``b [HV]``;
    parameters ``A_log [HV]``, ``dt_bias [HV, K]``; output ``o [HV, V]``."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    family: str = "kda"

    def __post_init__(self) -> None:
        check_positive_dims(self, ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads: expected a multiple of num_k_heads={self.num_k_heads}, got {self.num_v_heads}")
        if self.family != "kda":
            raise ValueError(f"family: expected 'kda', got {self.family!r}")

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.num_v_heads, self.head_v_dim)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"q": (self.num_k_heads, self.head_k_dim), "k": (self.num_k_heads, self.head_k_dim),
                "v": (self.num_v_heads, self.head_v_dim), "a": (self.num_v_heads, self.head_k_dim),
                "b": (self.num_v_heads,)}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"A_log": (self.num_v_heads,), "dt_bias": (self.num_v_heads, self.head_k_dim)}

    def to_dict(self) -> dict:
        return asdict(self)


class KimiDeltaAttention(Family):
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

    def strategy_geometry(self, st, dims, wide):
        return st.builds(
            lambda h, r, k, v: {"family": "kda", "num_k_heads": h, "num_v_heads": h * r, "head_k_dim": k,
                                "head_v_dim": v},
            st.sampled_from((1, 2)), st.sampled_from((1, 2)), st.sampled_from(wide), st.sampled_from(dims))

    def make_params(self, uniform, dist):
        neg_a = uniform_in(uniform("A_log"), *dist.neg_A)
        return {"A_log": torch.log(neg_a),
                "dt_bias": torch.add(torch.mul(uniform("dt_bias"), dist.dt_bias[1]), dist.dt_bias[0])}

    def input_law(self, name):
        return {"a": "gate", "b": "normal", "v": "value"}.get(name, "act")

    conventions = ("beta_rounded", "softplus_threshold", "l2_eps", "l2_form", "gate_lower_bound")
    capabilities = frozenset(("replay-fold", "decay-records", "softplus-gate", "dt-bias", "state-read-records",
                              "grouped-heads"))
    dot_order_literals = ("literal-replay-recurrent",)

    def reference_prepare(self, tok, params, conv=DEFAULT):
        return tok

    def reference_advance(self, state, prep, params, conv=DEFAULT):
        t = prep
        return naive.kda_step(state, t["q"], t["k"], t["v"], t["a"], t["b"], params["A_log"], params["dt_bias"],
                              conv)

    def readout_magnitude(self, state_abs, tok, params):
        qh, _ = naive.kda_prepare(tok["q"], tok["k"], state_abs.shape[-3])
        return (state_abs * qh.abs()[..., None, :]).sum(-1)

    @property
    def literal_replay(self):
        return literal.KDALiteralReplay

    @property
    def literal_baseline(self):
        return literal.KDALiteralBaseline

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

    def traffic(self, geometry, mode: PrecisionMode) -> RecordTraffic:
        g, m = geometry, mode
        a = m.act_bytes_per_element
        state = g.num_v_heads * g.head_v_dim * g.head_k_dim * m.state_bytes_per_element(g.head_k_dim)
        record = g.num_v_heads * g.head_v_dim * a + g.num_k_heads * g.head_k_dim * a + g.num_v_heads * g.head_k_dim * 4
        inputs = (2 * g.num_k_heads * g.head_k_dim * a + g.num_v_heads * g.head_v_dim * a
                  + g.num_v_heads * g.head_k_dim * a + g.num_v_heads * a)
        return RecordTraffic(state, record, inputs, g.num_v_heads * g.head_v_dim * a)


FAMILY = register_family(KimiDeltaAttention())
