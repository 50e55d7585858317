"""What a family's mixer is: which SSM inputs come out of the conv, the gate of the output norm,
the norm's grouping and weight, the fp64 step; and the mixer geometry and its presets.

Each family describes its mixer in ``replayssm/ops/<family>/mixer_naive.py`` (a :class:`MixerSpec`
subclass registered with :func:`register_mixer`; :data:`BUILTIN_MIXERS` lists those modules), so
the mixer code asks :func:`mixer_spec` and holds no family ``if``.

The whole step on one token (:meth:`MixerSpec.reference_step`, plain torch, the dtype of the state):

    u = conv inputs [C]   (Mamba-2: x|B|C,  GDN: q|k|v packed,  KDA: the three short convs' q|k|v)
    c, window = conv_step(window, u, conv_weight, conv_bias);   a = SiLU(c)
    split a into the SSM inputs; y, S = the family's naive step (the gate inputs dt / a, b as given)
    out = RMSNormGated(y, z)   (per-family grouping, gate activation, norm before or after the gate)
"""

from __future__ import annotations

import abc
import importlib
import math
from dataclasses import dataclass, replace

import torch

from replayssm.families import family, preset
from replayssm.ops.conv.naive import conv_step, silu

BUILTIN_MIXERS = (
    "replayssm.ops.mamba2.mixer_naive",
    "replayssm.ops.gdn.mixer_naive",
    "replayssm.ops.kda.mixer_naive",
)


def rms_norm_gated(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group: int, eps: float,
                   gate: str, before_gate: bool) -> torch.Tensor:
    """Gated RMSNorm over the trailing output dims of ``y`` (``[..., *out_shape]``), in its dtype:
    the flattened output split in groups of ``group``; ``weight`` ``[group]`` (shared by every group) or
    ``[numel]``; ``gate`` "silu" or "sigmoid" of ``z``, applied after the norm (``before_gate``) or to
    ``y`` before it (Mamba-2's ``norm_before_gate=False``)."""
    shape = y.shape
    n = math.prod(shape[-2:])
    act = silu(z) if gate == "silu" else torch.sigmoid(z)
    yf = y.reshape(*shape[:-2], n // group, group)
    af = act.reshape(yf.shape)
    if not before_gate:
        yf = yf * af
    r = yf * torch.rsqrt((yf * yf).mean(-1, keepdim=True) + eps)
    r = r * weight.reshape(-1, group)
    if before_gate:
        r = r * af
    return r.reshape(shape)


class MixerSpec(abc.ABC):
    """One family's mixer (subclass per family, registered by its ``mixer_naive.py``)."""

    family: str = ""
    gate_act: str = "silu"  # the output gate's activation
    norm_before_gate: bool = True
    norm_eps: float = 1e-6
    conv_bias: bool = False
    real_presets: tuple[str, ...] = ()  # the family's presets real models use (d_conv = 4)

    @abc.abstractmethod
    def conv_inputs(self, g) -> tuple[str, ...]:
        """The SSM inputs that come out of the conv, in channel order."""

    @abc.abstractmethod
    def norm_group(self, g) -> int:
        """Elements per RMS group of the flattened output."""

    @abc.abstractmethod
    def norm_weight_shape(self, g) -> tuple[int, ...]:
        """Shape of the norm's weight."""

    @abc.abstractmethod
    def ssm_step(self, state: torch.Tensor, tok: dict[str, torch.Tensor], params: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The family's naive recurrence on one token's SSM inputs: ``(y, new state)``."""

    def ssm_geometry(self, g):
        """The SSM geometry the mixer runs (its gate goes to the norm, not into the SSM)."""
        return g

    # ---- derived ------------------------------------------------------------------------------------
    def conv_channels(self, g) -> int:
        shapes = g.input_shapes()
        return sum(math.prod(shapes[n]) for n in self.conv_inputs(g))

    def gate_inputs(self, g) -> tuple[str, ...]:
        """The SSM inputs given to the mixer directly (gate pre-activations)."""
        return tuple(n for n in g.input_shapes() if n not in self.conv_inputs(g))

    def split(self, a: torch.Tensor, g) -> dict[str, torch.Tensor]:
        """Activated conv outputs ``[..., C]`` -> the SSM inputs (views, their shapes)."""
        shapes, out, at = g.input_shapes(), {}, 0
        for n in self.conv_inputs(g):
            size = math.prod(shapes[n])
            out[n] = a[..., at:at + size].reshape(*a.shape[:-1], *shapes[n])
            at += size
        return out

    def norm(self, y, z, weight, g):
        return rms_norm_gated(y, z, weight, self.norm_group(g), self.norm_eps, self.gate_act, self.norm_before_gate)

    def reference_parts(self, state, window, tok, params, g):
        """:meth:`reference_step` with its SSM part: ``(out, new SSM state, new window, the SSM's
        inputs of the token, the SSM output y before the norm)``."""
        dt = state.dtype
        bias = params["conv_bias"].to(dt) if self.conv_bias else None
        c, window = conv_step(window.to(dt), tok["conv_x"].to(dt), params["conv_weight"].to(dt), bias)
        ssm_tok = self.split(silu(c), g)
        ssm_tok.update({n: tok[n].to(dt) for n in self.gate_inputs(g)})
        ssm_params = {n: params[n].to(dt) for n in g.param_shapes()}
        y, state = self.ssm_step(state, ssm_tok, ssm_params)
        return self.norm(y, tok["z"].to(dt), params["norm_weight"].to(dt), g), state, window, ssm_tok, y

    def reference_step(self, state, window, tok, params, g):
        """The whole mixer step on one token in the dtype of ``state`` (all rows):
        ``(out, new SSM state, new window)``.  ``tok``: ``conv_x [..., C]``, the gate inputs, ``z``."""
        return self.reference_parts(state, window, tok, params, g)[:3]


_MIXERS: dict[str, MixerSpec] = {}
_LOADED = False


def register_mixer(spec: MixerSpec) -> MixerSpec:
    if not isinstance(spec, MixerSpec) or not spec.family:
        raise ValueError(f"spec: expected a MixerSpec instance with family set, got {spec!r}")
    family(spec.family)  # the family must exist
    _MIXERS[spec.family] = spec
    return spec


def mixer_specs() -> dict[str, MixerSpec]:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for mod in BUILTIN_MIXERS:
            importlib.import_module(mod)
    return dict(_MIXERS)


def mixer_spec(family_name: str) -> MixerSpec:
    specs = mixer_specs()
    if family_name not in specs:
        raise ValueError(f"family: no mixer described for {family_name!r}; expected one of {sorted(specs)}")
    return specs[family_name]


@dataclass(frozen=True)
class MixerGeometry:
    """A mixer: the family's SSM geometry (``ssm``) and the conv width ``d_conv``.  Per token the
    mixer takes ``conv_x [C]`` (C = :attr:`conv_channels`), the SSM gate inputs and ``z`` (the norm's
    gate, the output's shape); parameters: the SSM's, ``conv_weight [C, d_conv]``, ``conv_bias [C]``
    (families with one), ``norm_weight``."""

    ssm: object
    d_conv: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.d_conv, int) or isinstance(self.d_conv, bool) or self.d_conv < 2:
            raise ValueError(f"d_conv: expected an integer >= 2 (the conv width), got {self.d_conv!r}")
        object.__setattr__(self, "ssm", mixer_spec(self.ssm.family).ssm_geometry(self.ssm))

    @property
    def family(self) -> str:
        return self.ssm.family

    @property
    def spec(self) -> MixerSpec:
        return mixer_spec(self.family)

    @property
    def conv_channels(self) -> int:
        return self.spec.conv_channels(self.ssm)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return tuple(self.ssm.state_shape)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.ssm.out_shape)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = self.ssm.input_shapes()
        return {"conv_x": (self.conv_channels,), **{n: shapes[n] for n in self.spec.gate_inputs(self.ssm)},
                "z": self.out_shape}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        p = dict(self.ssm.param_shapes())
        p["conv_weight"] = (self.conv_channels, self.d_conv)
        if self.spec.conv_bias:
            p["conv_bias"] = (self.conv_channels,)
        p["norm_weight"] = self.spec.norm_weight_shape(self.ssm)
        return p

    def to_dict(self) -> dict:
        return {"ssm": self.ssm.to_dict(), "d_conv": self.d_conv}


def mixer_preset(name: str, family_name: str, d_conv: int = 4) -> MixerGeometry:
    """The mixer over the family's preset ``name`` (``tiny``, ``nano4b``, ``qwen35-4b``, ``kimi-linear-48b``...)."""
    return MixerGeometry(preset(name, family_name), d_conv)


def with_ssm(g: MixerGeometry, **changes) -> MixerGeometry:
    return MixerGeometry(replace(g.ssm, **changes), g.d_conv)
