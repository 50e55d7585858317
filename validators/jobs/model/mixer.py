"""What every recurrent-mixer adapter shares: the layer's own depthwise causal conv, the two drivers of
the recurrence, the kernel's slot and the conv history that rolls back with it.

Oracle: the family adapters (``gdn.py``, ``mamba2.py``) give the layer's own arithmetic around the
recurrence (projections, the split of the conv output into the recurrence's inputs, the output norm
and projection) and the fp64 step; here only the plumbing between them:

* ``"reference"`` (the teacher, a whole prefill): the family's fp64 step token by token from a zero
  state, the conv from a zero history;
* ``"kernel"`` (the student, cached decode): the kernel under test's ``verify`` on the window, its
  inputs rounded to the mode's activation dtype, its output widened back to fp64; ``commit(k)`` then
  keeps the first k tokens, and the conv window rolls back with them (the conv history is the last
  ``d_conv - 1`` committed conv inputs, kept here beside the kernel's slot).

Expected error: "kernel" at s64a64 equals "reference" to ~1e-12.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.registry import build


class RecurrentMixer:
    """One recurrent layer of the model, its ``forward`` replaced by :meth:`forward` (installed by
    :func:`install`).  Subclasses give ``geometry_of``, ``params_of``, ``_project``, ``_inputs``,
    ``_step`` and ``_finish``."""

    layer_classes: tuple = ()

    def __init__(self, mod) -> None:
        self.mod = mod
        self.geometry = self.geometry_of(mod)
        self.driver = "reference"
        self.kernel = None
        self.hook = None  # a callable (out [T, ...]) -> out: a mutant's place in the step
        self.conv_hist = None
        self.window_conv = None

    # ---- the family's part --------------------------------------------------------------------------------
    @staticmethod
    def geometry_of(mod):
        raise NotImplementedError

    @staticmethod
    def params_of(mod) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _project(self, h):
        """``(conv input [T, C], rest)``: the layer's input projection of ``h [1, T, hidden]``."""
        raise NotImplementedError

    def _inputs(self, c, rest) -> dict[str, torch.Tensor]:
        """The recurrence's per-token inputs ``{name: [T, ...]}`` from the conv output ``c [T, C]``."""
        raise NotImplementedError

    def _step(self, state, tok, params):
        """One fp64 step of the family's reference: ``(out, new state)``."""
        raise NotImplementedError

    def _finish(self, o, rest, dtype):
        """The layer's output ``[1, T, hidden]`` from the recurrence's output ``o [T, ...]`` (fp64)."""
        raise NotImplementedError

    # ---- the layer's conv -----------------------------------------------------------------------------------
    def _conv(self, hist, u):
        m = self.mod
        x = torch.cat([hist, u], dim=0).T[None]  # [1, C, d_conv - 1 + T]
        c = F.conv1d(x.to(m.conv1d.weight.dtype), m.conv1d.weight, m.conv1d.bias, groups=x.shape[1])[0].T
        return F.silu(c) if m.activation in ("silu", "swish") else c

    # ---- the step -------------------------------------------------------------------------------------------
    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
        if hidden_states.shape[0] != 1:
            raise ValueError(f"hidden_states: the model level runs one sequence, got batch {hidden_states.shape[0]}")
        u, rest = self._project(hidden_states)
        if self.driver == "reference":
            tok = self._inputs(self._conv(u.new_zeros(self.mod.conv_kernel_size - 1, u.shape[1]), u), rest)
            o = self._reference(tok)
        else:
            self.window_conv = u
            o = self._kernel(self._inputs(self._conv(self.conv_hist, u), rest))
        if self.hook is not None:
            o = self.hook(o)
        return self._finish(o, rest, hidden_states.dtype)

    def _reference(self, tok):
        f64 = torch.float64
        p = self.params_of(self.mod)
        first = next(iter(tok.values()))
        state = torch.zeros(self.geometry.state_shape, dtype=f64, device=first.device)
        outs = []
        for t in range(first.shape[0]):
            o, state = self._step(state, {n: x[t].to(f64) for n, x in tok.items()}, p)
            outs.append(o)
        return torch.stack(outs)

    def _kernel(self, tok):
        act = self.kernel.mode.act_dtype
        dev = self.kernel.device
        inputs = {n: x[None].to(device=dev, dtype=act).contiguous() for n, x in tok.items()}
        out = self.kernel.verify(torch.zeros(1, dtype=torch.int64, device=dev), inputs)
        return out[0].to(device=next(iter(tok.values())).device, dtype=torch.float64)

    # ---- the kernel's slot ------------------------------------------------------------------------------------
    def start(self, kernel_name: str, mode, decode: DecodeConfig, device, options: dict | None = None) -> None:
        """Build the kernel under test for this layer (one slot) and empty it and the conv history."""
        cfg = KernelConfig(geometry=self.geometry, params=self.params_of(self.mod), mode=mode, decode=decode,
                           num_slots=1, device=device, options=dict(options or {}))
        self.kernel = build(kernel_name, cfg)
        self.kernel.reset(torch.zeros(1, dtype=torch.int64, device=self.kernel.device))
        w = self.mod.conv1d.weight
        self.conv_hist = torch.zeros(self.mod.conv_kernel_size - 1, self.mod.conv_dim, dtype=w.dtype, device=w.device)
        self.driver = "kernel"

    def commit(self, k: int) -> None:
        """Keep the first ``k`` tokens of the last window: the kernel's commit and the conv history."""
        dev = self.kernel.device
        self.kernel.commit(torch.zeros(1, dtype=torch.int64, device=dev), torch.tensor([k], dtype=torch.int64,
                                                                                          device=dev))
        d = self.conv_hist.shape[0]
        self.conv_hist = torch.cat([self.conv_hist, self.window_conv[:k]], dim=0)[-d:]
        self.window_conv = None

    def snapshot_cursors(self) -> tuple[int, int, bool]:
        s = self.kernel.snapshot()
        return int(s.write_pos[0]), int(s.origin[0]), bool(s.is_flush[0])


def install(model, cls) -> list[RecurrentMixer]:
    """Replace the forward of every layer of ``model`` whose class is one of ``cls.layer_classes`` by a
    ``cls`` adapter's; the adapters in layer order."""
    out = []
    for mod in model.modules():
        if type(mod).__name__ in cls.layer_classes:
            mixer = cls(mod)
            mod.forward = mixer.forward
            out.append(mixer)
    return out
