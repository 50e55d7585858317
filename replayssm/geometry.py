"""Layer geometries and the per-token input layouts of the two op families.

Mamba-2 (spec 2.1): state ``[slots, H, P, N]``; per token ``x [H, P]``, ``dt [H]``,
``B, C [G, N]``, optional ``z [H, P]``; parameters ``A, dt_bias, D [H]``; output ``y [H, P]``.

Gated DeltaNet (spec 2.2): state ``[slots, HV, V, K]``; per token ``q, k [H, K]``,
``v [HV, V]``, ``a, b [HV]``; parameters ``A_log, dt_bias [HV]``; output ``o [HV, V]``.

A window of T' tokens for R batch rows prefixes every per-token shape with ``[R, T']``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FAMILIES = ("mamba2", "gdn")


@dataclass(frozen=True)
class Mamba2Geometry:
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    has_z: bool = False
    family: str = "mamba2"

    def __post_init__(self) -> None:
        for f in ("nheads", "headdim", "dstate", "ngroups"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected a positive integer, got {v!r}")
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
        """Per-token input shapes (without the [R, T'] prefix)."""
        s = {
            "x": (self.nheads, self.headdim),
            "dt": (self.nheads,),
            "B": (self.ngroups, self.dstate),
            "C": (self.ngroups, self.dstate),
        }
        if self.has_z:
            s["z"] = (self.nheads, self.headdim)
        return s

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"A": (self.nheads,), "dt_bias": (self.nheads,), "D": (self.nheads,)}

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GDNGeometry:
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    family: str = "gdn"

    def __post_init__(self) -> None:
        for f in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected a positive integer, got {v!r}")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads: expected a multiple of num_k_heads={self.num_k_heads}, got {self.num_v_heads}")
        if self.family != "gdn":
            raise ValueError(f"family: expected 'gdn', got {self.family!r}")

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.num_v_heads, self.head_v_dim, self.head_k_dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.num_v_heads, self.head_v_dim)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "q": (self.num_k_heads, self.head_k_dim),
            "k": (self.num_k_heads, self.head_k_dim),
            "v": (self.num_v_heads, self.head_v_dim),
            "a": (self.num_v_heads,),
            "b": (self.num_v_heads,),
        }

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"A_log": (self.num_v_heads,), "dt_bias": (self.num_v_heads,)}

    def to_dict(self) -> dict:
        return asdict(self)


Geometry = Mamba2Geometry | GDNGeometry

# Presets (spec: nano4b = Nemotron-3-Nano-4B Mamba-2 layer; super120b; qwen35-4b GDN layer).
PRESETS: dict[str, dict[str, Geometry]] = {
    "tiny": {
        "mamba2": Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=2),
        "gdn": GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8),
    },
    "nano4b": {"mamba2": Mamba2Geometry(nheads=96, headdim=80, dstate=128, ngroups=8)},
    "super120b": {"mamba2": Mamba2Geometry(nheads=128, headdim=64, dstate=128, ngroups=8)},
    "qwen35-4b": {"gdn": GDNGeometry(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)},
    "gdn-hv64": {"gdn": GDNGeometry(num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128)},
}


def preset(name: str, family: str) -> Geometry:
    """The preset geometry ``name`` for ``family``; ValueError lists what exists."""
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    if name not in PRESETS or family not in PRESETS[name]:
        have = sorted(n for n, fams in PRESETS.items() if family in fams)
        raise ValueError(f"geometry: no preset {name!r} for family {family!r}; expected one of {have}")
    return PRESETS[name][family]


def geometry_from_dict(d: dict) -> Geometry:
    """Rebuild a geometry from ``to_dict()`` output; unknown or missing fields raise ValueError."""
    if not isinstance(d, dict):
        raise ValueError(f"geometry: expected an object, got {type(d).__name__}")
    family = d.get("family")
    cls = {"mamba2": Mamba2Geometry, "gdn": GDNGeometry}.get(family)
    if cls is None:
        raise ValueError(f"geometry.family: expected one of {FAMILIES}, got {family!r}")
    fields = set(cls.__dataclass_fields__)
    unknown = set(d) - fields
    if unknown:
        raise ValueError(f"geometry: unknown field(s) {sorted(unknown)}; expected {sorted(fields)}")
    try:
        return cls(**d)
    except TypeError as e:
        raise ValueError(f"geometry: {e}") from None
