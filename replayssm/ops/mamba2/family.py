"""The Mamba-2 family: geometry and presets, parameter and input laws, the reference hooks, the
readout magnitude, the Hypothesis geometry piece and the bench's bytes model.

Oracle: docs/recurrences.md section 1 (``naive.py``) for the numbers, the bytes model of its sections 2-4
for traffic.
Presets: ``nano4b`` is a Nemotron-3-Nano-4B Mamba-2 layer (96 heads x 80, dstate 128, 8 groups),
``super120b`` a Nemotron-3-Super-120B layer (128 x 64, dstate 128, 8 groups).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from replayssm.conventions import DEFAULT
from replayssm.families import Family, FamilyMutant, RecordTraffic, check_positive_dims, register_family, uniform_in
from replayssm.ops.mamba2 import literal, naive
from replayssm.ops.mamba2 import mutants as broken
from replayssm.ops.ordered_sum import pairwise_sum
from replayssm.ops.triton.reference import reference_rows
from replayssm.precision import PrecisionMode


@dataclass(frozen=True)
class Mamba2Geometry:
    """State ``[slots, H, P, N]``; per token ``x [H, P]``, ``dt [H]``, ``B, C [G, N]``, optional
    ``z [H, P]``; parameters ``A, dt_bias, D [H]``; output ``y [H, P]``."""

    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    has_z: bool = False
    family: str = "mamba2"

    def __post_init__(self) -> None:
        check_positive_dims(self, ("nheads", "headdim", "dstate", "ngroups"))
        if self.nheads % self.ngroups:
            raise ValueError(f"ngroups: expected a divisor of nheads={self.nheads}, got {self.ngroups}")
        if self.family != "mamba2":
            raise ValueError(f"family: expected 'mamba2', got {self.family!r}")

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.nheads, self.headdim, self.dstate)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.nheads, self.headdim)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        s = {"x": (self.nheads, self.headdim), "dt": (self.nheads,), "B": (self.ngroups, self.dstate),
             "C": (self.ngroups, self.dstate)}
        if self.has_z:
            s["z"] = (self.nheads, self.headdim)
        return s

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"A": (self.nheads,), "dt_bias": (self.nheads,), "D": (self.nheads,)}

    def to_dict(self) -> dict:
        return asdict(self)


class Mamba2(Family):
    name = "mamba2"
    description = "Mamba-2 selective state update (docs/recurrences.md section 1); ReplaySSM records x, B, Δ"
    geometry_cls = Mamba2Geometry
    presets = {
        "tiny": Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=2),
        "nano4b": Mamba2Geometry(nheads=96, headdim=80, dstate=128, ngroups=8),
        "super120b": Mamba2Geometry(nheads=128, headdim=64, dstate=128, ngroups=8),
    }
    bench_geometry = "nano4b"

    def strategy_geometry(self, st, dims, wide):
        return st.builds(
            lambda g, r, p, n, z: {"family": "mamba2", "nheads": g * r, "headdim": p, "dstate": n, "ngroups": g,
                                   "has_z": z},
            st.sampled_from((1, 2)), st.sampled_from((1, 2)), st.sampled_from(dims), st.sampled_from(wide),
            st.booleans())

    def make_params(self, uniform, dist):
        neg_a = uniform_in(uniform("A"), *dist.neg_A)
        return {"A": -neg_a, "D": torch.add(uniform("D"), 0.5),  # D in [0.5, 1.5]
                "dt_bias": torch.add(torch.mul(uniform("dt_bias"), dist.dt_bias[1]), dist.dt_bias[0])}

    def input_law(self, name):
        return {"dt": "gate", "x": "value"}.get(name, "act")

    conventions = ("softplus_threshold",)
    capabilities = frozenset(("replay-fold", "decay-records", "softplus-gate", "dt-bias", "weighted-input-fold",
                              "grouped-heads"))
    mutants = (
        FamilyMutant(broken.ReadoutWithoutSkip, "mutant-readout-without-skip",
                     "Mamba-2 readout drops the D x skip term (outputs wrong, state right)", klass="arithmetic"),
    )

    def reference_prepare(self, tok, params, conv=DEFAULT):
        return naive.prepare(tok["x"], tok["dt"], tok["B"], tok["C"], params["A"], params["dt_bias"], params["D"],
                             tok.get("z"), dtype=tok["x"].dtype, threshold=conv.softplus_threshold)

    def reference_advance(self, state, prep, params, conv=DEFAULT):
        return naive.advance(state, prep, params["A"])

    def _decay(self, p, params, dtype):
        delta = torch.where(p["large"], p["u"], torch.log1p(torch.exp(p["u_clamped"])))
        return torch.exp(params["A"].to(dtype)[:, None, None] * delta), delta * p["x"]

    def reference_hoist(self, prep, params):
        a, dx = self._decay(prep, params, prep["x"].dtype)
        return {**prep, "a": a, "dx": dx}

    def reference_advance_fused(self, state, prep, params, rows=None, keep=None):
        y, new, _ = self.reference_advance_magnitude(state, prep, params, rows, keep)
        return y, new

    def reference_advance_magnitude(self, state, prep, params, rows=None, keep=None):
        # naive.advance line by line; its state-sized work, torch.add(a * S, (delta x) * B) and the readout
        # sums over N (pairwise_sum of S' C and of |S'| |C|), in one pass per row (ops/triton/reference.py)
        p = prep
        a, dx = (p["a"], p["dx"]) if "a" in p else self._decay(p, params, state.dtype)
        H, P, N = state.shape[-3:]
        new, summed, mag = reference_rows(state.reshape(-1, H, P, N), a, dx, p["Bh"], p["Ch"], live=rows,
                                          keep=keep)
        lead = state.shape[:-1]
        y = torch.add(summed.view(lead), p["Dx"])
        if "z" in p:
            y = torch.mul(y * p["z"], torch.sigmoid(p["z"]))
        return y, new.view(state.shape), self._magnitude(mag.view(lead), p["Dx"].abs(), p.get("z"))

    def readout_magnitude(self, state_abs, tok, params):
        H = state_abs.shape[-3]
        C = tok["C"].abs().repeat_interleave(H // tok["C"].shape[-2], dim=-2)
        return self._magnitude(pairwise_sum(state_abs * C[..., None, :]), (params["D"][..., None] * tok["x"]).abs(),
                               tok.get("z"))

    @staticmethod
    def _magnitude(summed, dx_abs, z):
        """``sum_n |S_pn| |C_n| + |D x|``, times ``|z silu'|`` where the layer gates."""
        mag = summed + dx_abs
        if z is not None:
            mag = mag * (z * torch.sigmoid(z)).abs()
        return mag

    @property
    def literal_replay(self):
        return literal.Mamba2LiteralReplay

    @property
    def literal_baseline(self):
        return literal.Mamba2LiteralBaseline

    def traffic(self, geometry, mode: PrecisionMode) -> RecordTraffic:
        g, m = geometry, mode
        a = m.act_bytes_per_element
        state = g.nheads * g.headdim * g.dstate * m.state_bytes_per_element(g.dstate)
        record = g.nheads * g.headdim * a + g.ngroups * g.dstate * a + g.nheads * 4
        inputs = g.nheads * g.headdim * a + g.nheads * a + 2 * g.ngroups * g.dstate * a
        if g.has_z:
            inputs += g.nheads * g.headdim * a
        return RecordTraffic(state, record, inputs, g.nheads * g.headdim * a)

    def bench_launch_candidates(self, kind, decode, batch):
        # The first is the default (the pre-pass path from 8 rows up, 16 in the speculative verify, the
        # fused kernel below); each is checked against fp64 over a whole cursor cycle before it is timed.
        if kind == "baseline":
            return [{"block_p": 16, "num_warps": 4}, {"block_p": 32, "num_warps": 4}][:1 if decode.speculative else 2]
        if decode.speculative:  # + every window readout as one ieee fp32 dot (the stream's, from 8 rows), and
            # the readouts in 4 dstate chunks from 32 rows (the former default, measured slower than whole-dstate
            # readouts: ops/mamba2/replay.py)
            # (the default: the pre-pass path with programmatic dependent launch at every batch; pdl=False: the
            # pair without it from 8 rows, the fused kernel below)
            return [{}, {"prepass": False}, {"vector_readout": True}, {"pdl": False}] + (
                [{"kchunks": 4}] if batch >= 32 else [])
        return [{}, {"prepass": False}, {"prepass": True}, {"prepass": True, "pdl": True}]


FAMILY = register_family(Mamba2())
