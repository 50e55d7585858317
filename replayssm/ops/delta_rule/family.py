"""The delta-rule family base: the geometry and the family hooks Gated DeltaNet and KDA share, with the
gate's width a parameter (``per_channel_gate``: one gate per value head, or one per key channel).

Oracle: each family's ``naive.py`` for the numbers (the reference hooks call its step), the bytes model of
docs/recurrences.md sections 2-4 for traffic.  Expected error: none (shapes, laws and byte counts are exact).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from replayssm.conventions import DEFAULT
from replayssm.families import Family, RecordTraffic, check_positive_dims, uniform_in
from replayssm.precision import PrecisionMode


@dataclass(frozen=True)
class DeltaRuleGeometry:
    """State ``[slots, HV, V, K]``; per token ``q, k [H, K]``, ``v [HV, V]``, ``a [HV]`` (or ``[HV, K]`` with a
    per-channel gate), ``b [HV]``; parameters ``A_log [HV]``, ``dt_bias`` shaped as ``a``; output ``o [HV, V]``.
    A subclass names its family (the ``family`` field's default) and sets ``per_channel_gate``."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    family: str = ""
    per_channel_gate: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_positive_dims(self, ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads: expected a multiple of num_k_heads={self.num_k_heads}, got {self.num_v_heads}")
        expected = type(self).__dataclass_fields__["family"].default
        if self.family != expected:
            raise ValueError(f"family: expected {expected!r}, got {self.family!r}")

    @property
    def gate_shape(self) -> tuple[int, ...]:
        """The shape of one token's gate pre-activation ``a`` (and of ``dt_bias``)."""
        return (self.num_v_heads, self.head_k_dim) if self.per_channel_gate else (self.num_v_heads,)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.num_v_heads, self.head_v_dim)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"q": (self.num_k_heads, self.head_k_dim), "k": (self.num_k_heads, self.head_k_dim),
                "v": (self.num_v_heads, self.head_v_dim), "a": self.gate_shape, "b": (self.num_v_heads,)}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"A_log": (self.num_v_heads,), "dt_bias": self.gate_shape}

    def to_dict(self) -> dict:
        return asdict(self)


class DeltaRuleFamily(Family):
    """The hooks of a delta-rule family: a subclass sets ``name``, ``geometry_cls``, ``presets``, ``literal``
    (its literal module, holding ``literal_replay_cls`` / ``literal_baseline_cls``), its reference step and its
    mutants."""

    conventions = ("beta_rounded", "softplus_threshold", "l2_eps", "l2_form")
    capabilities = frozenset(("replay-fold", "decay-records", "softplus-gate", "dt-bias", "state-read-records",
                              "grouped-heads"))
    dot_order_literals = ("literal-replay-recurrent", "literal-replay-ieee-dot", "literal-replay-tf32-truncated")
    literal_replay_cls: ClassVar[type]
    literal_baseline_cls: ClassVar[type]

    def strategy_geometry(self, st, dims, wide):
        name = self.name
        return st.builds(
            lambda h, r, k, v: {"family": name, "num_k_heads": h, "num_v_heads": h * r, "head_k_dim": k,
                                "head_v_dim": v},
            st.sampled_from((1, 2)), st.sampled_from((1, 2)), st.sampled_from(wide), st.sampled_from(dims))

    def make_params(self, uniform, dist):
        neg_a = uniform_in(uniform("A_log"), *dist.neg_A)
        return {"A_log": torch.log(neg_a),
                "dt_bias": torch.add(torch.mul(uniform("dt_bias"), dist.dt_bias[1]), dist.dt_bias[0])}

    def input_law(self, name):
        return {"a": "gate", "b": "normal", "v": "value"}.get(name, "act")

    def reference_prepare(self, tok, params, conv=DEFAULT):
        return tok

    @property
    def literal_replay(self):
        return self.literal_replay_cls

    @property
    def literal_baseline(self):
        return self.literal_baseline_cls

    def traffic(self, geometry, mode: PrecisionMode) -> RecordTraffic:
        g, m = geometry, mode
        a = m.act_bytes_per_element
        gate = g.num_v_heads * (g.head_k_dim if g.per_channel_gate else 1)  # elements of g (and of a) per token
        state = g.num_v_heads * g.head_v_dim * g.head_k_dim * m.state_bytes_per_element(g.head_k_dim)
        record = g.num_v_heads * g.head_v_dim * a + g.num_k_heads * g.head_k_dim * a + gate * 4
        inputs = (2 * g.num_k_heads * g.head_k_dim * a + g.num_v_heads * g.head_v_dim * a + gate * a
                  + g.num_v_heads * a)
        return RecordTraffic(state, record, inputs, g.num_v_heads * g.head_v_dim * a)


__all__ = ["DeltaRuleFamily", "DeltaRuleGeometry"]
