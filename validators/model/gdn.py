"""A transformers Gated DeltaNet layer (``Qwen3NextGatedDeltaNet``) with its recurrence taken out.

Oracle: transformers 5.23's ``Qwen3NextGatedDeltaNet.forward``, read line by line: the layer's own
``in_proj_qkvz`` / ``in_proj_ba`` projections and head ordering, its depthwise causal conv
(``conv1d.weight``, SiLU), its gated RMSNorm and ``out_proj`` run unchanged in the model's dtype;
only the gated delta rule between them is replaced:

* ``"reference"`` (the teacher, a whole prefill): ``naive.gdn_step`` token by token in fp64 from a zero
  state (transformers' own recurrence, whose torch fallback computes in fp32 whatever the model's
  dtype; tests/test_model.py checks the adapter against it to fp32 rounding);
* ``"kernel"`` (the student, cached decode): the kernel under test's ``verify`` on the window, its
  inputs rounded to the mode's activation dtype, its output widened back; ``commit(k)`` then keeps
  the first k tokens, and the conv window rolls back with them (the conv history is the last
  ``d_conv - 1`` committed conv inputs, kept here beside the kernel's slot).

Expected error: "reference" equals transformers' fallback to ~1e-6 relative (its fp32 arithmetic);
"kernel" at s64a64 equals "reference" to ~1e-12.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.ops.gdn.family import GDNGeometry
from replayssm.ops.gdn.naive import gdn_step
from replayssm.registry import build

FAMILY = "gdn"
LAYER_CLASSES = ("Qwen3NextGatedDeltaNet",)


def geometry_of(mod) -> GDNGeometry:
    return GDNGeometry(num_k_heads=mod.num_k_heads, num_v_heads=mod.num_v_heads, head_k_dim=mod.head_k_dim,
                       head_v_dim=mod.head_v_dim)


def params_of(mod) -> dict[str, torch.Tensor]:
    return {"A_log": mod.A_log.detach().to(torch.float64), "dt_bias": mod.dt_bias.detach().to(torch.float64)}


class GDNMixer:
    """One GDN layer of the model, its ``forward`` replaced by :meth:`forward` (installed by
    :func:`install`).  ``driver`` is ``"reference"`` or ``"kernel"``; in kernel mode :meth:`start`
    builds the kernel and empties the slot, :meth:`commit` keeps k tokens of the last window."""

    def __init__(self, mod) -> None:
        self.mod = mod
        self.geometry = geometry_of(mod)
        self.driver = "reference"
        self.kernel = None
        self.hook = None  # a callable (out [T, HV, V]) -> out: a mutant's place in the step
        self.conv_hist = None
        self.window_conv = None

    # ---- the layer's own arithmetic -------------------------------------------------------------------
    def _project(self, h):
        m = self.mod
        q, k, v, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(h), m.in_proj_ba(h))
        u = torch.cat([x.reshape(x.shape[0], x.shape[1], -1) for x in (q, k, v)], dim=-1)[0]  # [T, C]
        return u, z[0], b[0], a[0]

    def _conv(self, hist, u):
        m = self.mod
        x = torch.cat([hist, u], dim=0).T[None]  # [1, C, d_conv - 1 + T]
        c = F.conv1d(x.to(m.conv1d.weight.dtype), m.conv1d.weight, m.conv1d.bias, groups=x.shape[1])[0].T
        return F.silu(c) if m.activation in ("silu", "swish") else c

    def _split(self, c):
        m, g = self.mod, self.geometry
        q, k, v = torch.split(c, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
        T = c.shape[0]
        return (q.reshape(T, g.num_k_heads, g.head_k_dim), k.reshape(T, g.num_k_heads, g.head_k_dim),
                v.reshape(T, g.num_v_heads, g.head_v_dim))

    def _finish(self, o, z, dtype):
        m = self.mod
        T = o.shape[0]
        y = m.norm(o.to(dtype).reshape(-1, o.shape[-1]), z.reshape(-1, z.shape[-1]))
        return m.out_proj(y.reshape(1, T, -1))

    # ---- the step ---------------------------------------------------------------------------------------
    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
        if hidden_states.shape[0] != 1:
            raise ValueError(f"hidden_states: the model level runs one sequence, got batch {hidden_states.shape[0]}")
        u, z, b, a = self._project(hidden_states)
        d = self.mod.conv_kernel_size - 1
        if self.driver == "reference":
            c = self._conv(u.new_zeros(d, u.shape[1]), u)
            q, k, v = self._split(c)
            o = self._reference(q, k, v, a, b)
        else:
            c = self._conv(self.conv_hist, u)
            self.window_conv = u
            q, k, v = self._split(c)
            o = self._kernel(q, k, v, a, b)
        if self.hook is not None:
            o = self.hook(o)
        return self._finish(o, z, hidden_states.dtype)

    def _reference(self, q, k, v, a, b):
        p = params_of(self.mod)
        f64 = torch.float64
        state = torch.zeros(self.geometry.state_shape, dtype=f64, device=q.device)
        outs = []
        for t in range(q.shape[0]):
            o, state = gdn_step(state, q[t].to(f64), k[t].to(f64), v[t].to(f64), a[t].to(f64), b[t].to(f64),
                                p["A_log"], p["dt_bias"])
            outs.append(o)
        return torch.stack(outs)

    def _kernel(self, q, k, v, a, b):
        act = self.kernel.mode.act_dtype
        dev = self.kernel.device
        inputs = {n: x[None].to(device=dev, dtype=act).contiguous() for n, x in
                  (("q", q), ("k", k), ("v", v), ("a", a), ("b", b))}
        out = self.kernel.verify(torch.zeros(1, dtype=torch.int64, device=dev), inputs)
        return out[0].to(device=q.device, dtype=torch.float64)

    # ---- the kernel's slot --------------------------------------------------------------------------------
    def start(self, kernel_name: str, mode, decode: DecodeConfig, device, options: dict | None = None) -> None:
        """Build the kernel under test for this layer (one slot) and empty it and the conv history."""
        cfg = KernelConfig(geometry=self.geometry, params=params_of(self.mod), mode=mode, decode=decode,
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


def install(model) -> list[GDNMixer]:
    """Replace the forward of every GDN layer of ``model``; the mixers in layer order."""
    out = []
    for mod in model.modules():
        if type(mod).__name__ in LAYER_CLASSES:
            mixer = GDNMixer(mod)
            mod.forward = mixer.forward
            out.append(mixer)
    return out
