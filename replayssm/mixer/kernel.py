"""The mixer kernel under test, and the suite's own mixer kernels.

A mixer kernel owns, for ``num_slots`` sequences of one layer, the SSM state and the conv state.
Each decode step is the SSM interface's (``replayssm/interface.py``) at the mixer level:

    out = kernel.verify(slot_ids, inputs, out=None)   # inputs: conv_x [R, T', C], gate inputs, z
    kernel.commit(slot_ids, accepted)                 # k accepted per row, 1 <= k <= T'

(``slot_ids[r] = -1``: a padding row, its outputs untouched), plus ``reset(slot_ids, initial_state=None,
initial_conv=None)`` (``initial_conv [R, C, d_conv - 1]``, activation dtype: the prefill's last inputs),
``committed_state(slot_ids)`` (the SSM state after the committed prefix, fp64), ``ssm_snapshot()``
(raw SSM storage) and ``conv_storage()`` (raw conv storage in the layout of the declared
``conv_policy``, ``replayssm/ops/conv/policies.py``; the validator reads the committed window from it).

:class:`ComposedMixer` builds one from a conv store (a literal design, or an adapter's) and a
registered SSM kernel (``ssm_kernel``): the literal mixers (``mixer-literal-<policy>``: the literal
conv store of that design + the family's ``literal-replay``, the norm in the compute dtype rounded
once to the activation dtype) and the suite's Triton mixer (``mixer-triton-replay``: the compacted
conv + the family's ``triton-replay`` kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from replayssm.interface import PAD_SLOT, DecodeConfig, KernelConfig
from replayssm.mixer.spec import MixerGeometry
from replayssm.ops.conv.literal import STORES, ConvStore, ReversedOrderStore
from replayssm.ops.conv.policies import conv_policy
from replayssm.precision import PrecisionMode, parse_mode
from replayssm.registry import build


@dataclass
class MixerConfig:
    geometry: MixerGeometry
    params: dict[str, torch.Tensor]
    mode: PrecisionMode
    decode: DecodeConfig
    num_slots: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        self.mode = parse_mode(self.mode)
        self.device = torch.device(self.device)
        if not isinstance(self.geometry, MixerGeometry):
            raise ValueError(f"geometry: expected a MixerGeometry, got {type(self.geometry).__name__}")
        shapes = self.geometry.param_shapes()
        if set(shapes) != set(self.params):
            raise ValueError(f"params: expected exactly {sorted(shapes)}, got {sorted(self.params)}")
        for n, shp in shapes.items():
            if tuple(self.params[n].shape) != shp:
                raise ValueError(f"params[{n!r}]: expected shape {shp}, got {tuple(self.params[n].shape)}")


class MixerKernel:
    """Base of every mixer kernel: class attributes, argument checks."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    conv_policy: ClassVar[str] = ""  # the declared design (replayssm/ops/conv/policies.py)
    decodes: ClassVar[tuple[str, ...]] = ("speculative", "standard")
    triton_conv: ClassVar[bool] = False  # its conv is a Triton kernel (the interpreter on a CPU: slow)

    def __init__(self, config: MixerConfig) -> None:
        conv_policy(self.conv_policy)
        self.config, self.geometry, self.mode = config, config.geometry, config.mode
        self.decode, self.num_slots, self.device = config.decode, config.num_slots, config.device
        self.spec = config.geometry.spec
        self.T = self.decode.window

    @classmethod
    def source_reason(cls) -> str | None:
        """Why the kernel's external code cannot be loaded (one line saying how to get it), or None."""
        return None

    @classmethod
    def unsupported_reason(cls, geometry: MixerGeometry, mode: PrecisionMode) -> str | None:
        return None

    def check_slots(self, slot_ids) -> list[int]:
        if not isinstance(slot_ids, torch.Tensor) or slot_ids.dim() != 1 or slot_ids.is_floating_point():
            raise ValueError(f"slot_ids: expected a 1-D integer tensor, got {getattr(slot_ids, 'shape', slot_ids)!r}")
        ids = [int(s) for s in slot_ids.tolist()]
        for r, s in enumerate(ids):
            if s != PAD_SLOT and not 0 <= s < self.num_slots:
                raise ValueError(f"slot_ids[{r}]: expected a slot in [0, {self.num_slots}) or {PAD_SLOT}, got {s}")
        act = [s for s in ids if s != PAD_SLOT]
        if len(set(act)) != len(act):
            raise ValueError(f"slot_ids: an active slot appears twice in {ids}")
        return ids

    def check_inputs(self, ids: list[int], inputs: dict) -> None:
        shapes = self.geometry.input_shapes()
        if not isinstance(inputs, dict) or set(inputs) != set(shapes):
            raise ValueError(f"inputs: expected keys {sorted(shapes)}, got "
                             f"{sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__}")
        for k, shp in shapes.items():
            want = (len(ids), self.T, *shp)
            t = inputs[k]
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != self.mode.act_dtype:
                raise ValueError(f"inputs[{k!r}]: expected {self.mode.act_dtype} of shape {want}, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")

    def check_accepted(self, ids: list[int], accepted) -> list[int]:
        if not isinstance(accepted, torch.Tensor) or tuple(accepted.shape) != (len(ids),) \
                or accepted.is_floating_point():
            raise ValueError(f"accepted: expected an integer tensor of shape ({len(ids)},)")
        ks = [int(k) for k in accepted.tolist()]
        for r, (s, k) in enumerate(zip(ids, ks)):
            if s != PAD_SLOT and not 1 <= k <= self.T:
                raise ValueError(f"accepted[{r}]: expected 1 <= k <= T' = {self.T}, got {k}")
        return ks


class ComposedMixer(MixerKernel):
    """Conv store + registered SSM kernel + gated norm (compute dtype, one rounding)."""

    ssm_kernel: ClassVar[str] = "literal-replay"
    store: ClassVar[type[ConvStore]] = ConvStore

    def __init__(self, config: MixerConfig) -> None:
        super().__init__(config)
        g, m = self.geometry, self.mode
        self.ct = m.compute_dtype
        ssm_params = {n: config.params[n] for n in g.ssm.param_shapes()}
        self.ssm = build(self.ssm_kernel, KernelConfig(g.ssm, ssm_params, m, self.decode, self.num_slots,
                                                       self.device))
        self.conv = self.make_store()
        self.w = {n: config.params[n].to(self.device, torch.float32).to(self.ct)
                  for n in ("conv_weight", "conv_bias", "norm_weight") if n in config.params}
        self.pending = [False] * self.num_slots

    def make_store(self) -> ConvStore:
        return self.store(self.num_slots, self.geometry.conv_channels, self.geometry.d_conv, self.T,
                          self.mode.act_dtype, self.ct, self.device)

    def reset(self, slot_ids, initial_state=None, initial_conv=None) -> None:
        ids = self.check_slots(slot_ids)
        want = (len(ids), self.geometry.conv_channels, self.geometry.d_conv - 1)
        if initial_conv is not None and (not isinstance(initial_conv, torch.Tensor)
                                         or tuple(initial_conv.shape) != want):
            raise ValueError(f"initial_conv: expected shape {want}, got {tuple(getattr(initial_conv, 'shape', ()))}")
        self.ssm.reset(slot_ids, initial_state)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                self.conv.reset(s, None if initial_conv is None else initial_conv[r])
                self.pending[s] = False

    def conv_forward(self, rows, x):
        """SiLU(conv) ``[R, T, C]`` in the activation dtype, the store updated (overridden by adapters)."""
        return self.conv.verify(rows, x, self.w["conv_weight"], self.w.get("conv_bias"))

    def verify(self, slot_ids, inputs, out=None):
        ids = self.check_slots(slot_ids)
        self.check_inputs(ids, inputs)
        R, g = len(ids), self.geometry
        want = (R, self.T, *g.out_shape)
        if out is not None and (tuple(out.shape) != want or out.dtype != self.mode.act_dtype):
            raise ValueError(f"out: expected {self.mode.act_dtype} of shape {want}, got {out.dtype} "
                             f"{tuple(out.shape)}")
        rows = [(r, s) for r, s in enumerate(ids) if s != PAD_SLOT]
        a = self.conv_forward(rows, inputs["conv_x"])
        ssm_in = {n: t.contiguous() for n, t in self.spec.split(a, g.ssm).items()}
        ssm_in.update({n: inputs[n] for n in self.spec.gate_inputs(g.ssm)})
        y = self.ssm.verify(slot_ids, ssm_in)
        if out is None:
            out = torch.full(want, float("nan"), dtype=self.mode.act_dtype, device=self.device)
        for r, s in rows:
            o = self.spec.norm(y[r].to(self.ct), inputs["z"][r].to(self.ct), self.w["norm_weight"], g.ssm)
            out[r] = o.to(self.mode.act_dtype)
            self.pending[s] = True
        return out

    def commit(self, slot_ids, accepted) -> None:
        ids = self.check_slots(slot_ids)
        ks = self.check_accepted(ids, accepted)
        for r, s in enumerate(ids):
            if s != PAD_SLOT and not self.pending[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} has no verify to commit")
        self.ssm.commit(slot_ids, accepted)
        rows = [(r, s) for r, s in enumerate(ids) if s != PAD_SLOT]
        self.conv.commit(rows, [ks[r] for r, _ in rows])
        for _, s in rows:
            self.pending[s] = False

    def committed_state(self, slot_ids) -> torch.Tensor:
        return self.ssm.committed_state(slot_ids)

    def ssm_snapshot(self):
        return self.ssm.snapshot()

    def conv_storage(self) -> dict[str, torch.Tensor]:
        return self.conv.storage()


MIXER_KERNELS: dict[str, type[MixerKernel]] = {}


def register_mixer_kernel(cls: type[MixerKernel], *, replace: bool = False) -> type[MixerKernel]:
    if not (isinstance(cls, type) and issubclass(cls, MixerKernel)) or not cls.name:
        raise ValueError(f"cls: expected a MixerKernel subclass with a name, got {cls!r}")
    if cls.name in MIXER_KERNELS and MIXER_KERNELS[cls.name] is not cls and not replace:
        raise ValueError(f"name: mixer kernel {cls.name!r} is already registered")
    MIXER_KERNELS[cls.name] = cls
    return cls


def mixer_kernels() -> dict[str, type[MixerKernel]]:
    return dict(sorted(MIXER_KERNELS.items()))


def mixer_kernel(name: str) -> type[MixerKernel]:
    ks = mixer_kernels()
    if name not in ks:
        raise ValueError(f"--kernel: no mixer kernel {name!r}; expected one of {sorted(ks)}")
    return ks[name]


def _literal(policy_name: str) -> type[ComposedMixer]:
    p = conv_policy(policy_name)
    return type(f"MixerLiteral_{policy_name.replace('-', '_')}", (ComposedMixer,), {
        "name": f"mixer-literal-{policy_name}", "conv_policy": policy_name, "store": STORES[policy_name],
        "description": f"literal mixer, conv state {p.description} ({p.source}); SSM: literal-replay"})


LITERALS = {p: register_mixer_kernel(_literal(p)) for p in STORES}


@register_mixer_kernel
class ReversedOrderMixer(ComposedMixer):
    name = "mixer-literal-reversed-order"
    description = ("legitimate variant: the literal compact-at-commit mixer with the conv taps summed newest first, "
                   "the bias last, SiLU as x * sigmoid(x)")
    conv_policy = "compact-at-commit"
    store = ReversedOrderStore


@register_mixer_kernel
class TritonMixer(ComposedMixer):
    name = "mixer-triton-replay"
    description = "the compacted conv window + the family's Triton ReplaySSM kernel (triton-replay)"
    conv_policy = "compact-at-commit"
    store = STORES["compact-at-commit"]
    ssm_kernel = "triton-replay"
