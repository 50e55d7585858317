"""The test family's registration: geometry, laws, reference hooks, magnitude, strategy, traffic."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from replayssm.families import Family, RecordTraffic, check_positive_dims, register_family, uniform_in
from toyfam import literal, naive


@dataclass(frozen=True)
class ToyGeometry:
    heads: int
    dk: int
    dv: int
    family: str = "toy"

    def __post_init__(self) -> None:
        check_positive_dims(self, ("heads", "dk", "dv"))

    @property
    def state_shape(self):
        return (self.heads, self.dv, self.dk)

    @property
    def out_shape(self):
        return (self.heads, self.dv)

    def input_shapes(self):
        return {"q": (self.heads, self.dk), "k": (self.heads, self.dk), "v": (self.heads, self.dv), "a": (self.heads,)}

    def param_shapes(self):
        return {"A_log": (self.heads,), "dt_bias": (self.heads,)}

    def to_dict(self):
        return asdict(self)


class Toy(Family):
    name = "toy"
    description = "test family: decaying linear attention"
    geometry_cls = ToyGeometry
    presets = {"tiny": ToyGeometry(heads=2, dk=4, dv=4)}
    bench_geometry = "tiny"

    def strategy_geometry(self, st, dims, wide):
        return st.builds(lambda h, k, v: {"family": "toy", "heads": h, "dk": k, "dv": v},
                         st.sampled_from((1, 2)), st.sampled_from(wide), st.sampled_from(dims))

    def make_params(self, uniform, dist):
        return {"A_log": torch.log(uniform_in(uniform("A_log"), *dist.neg_A)),
                "dt_bias": uniform_in(uniform("dt_bias"), dist.dt_bias[0], dist.dt_bias[0] + dist.dt_bias[1])}

    def input_law(self, name):
        return {"a": "gate", "v": "value"}.get(name, "act")

    def reference_prepare(self, tok, params):
        return tok

    def reference_advance(self, state, t, params):
        return naive.toy_step(state, t["q"], t["k"], t["v"], t["a"], params["A_log"], params["dt_bias"])

    def readout_magnitude(self, state_abs, tok, params):
        return (state_abs * tok["q"].abs()[..., None, :]).sum(-1)

    @property
    def literal_replay(self):
        return literal.ToyLiteralReplay

    @property
    def literal_baseline(self):
        return literal.ToyLiteralBaseline

    def traffic(self, geometry, mode):
        g = geometry
        a = mode.act_bytes_per_element
        return RecordTraffic(g.heads * g.dv * g.dk * mode.state_bytes_per_element(g.dk),
                             g.heads * (g.dv + g.dk) * a + 4 * g.heads, g.heads * (2 * g.dk + g.dv + 1) * a,
                             g.heads * g.dv * a)


FAMILY = register_family(Toy())
