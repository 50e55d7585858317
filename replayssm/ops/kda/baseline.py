"""Triton baseline KDA decode ("triton-baseline", family kda): the state is read and written every
token, as serving engines do it without ReplaySSM (FLA's fused recurrent KDA form).

* Standard decode: one program per (row, value head, block of value rows) loads its state tile,
  applies the per-channel gated delta rule (``naive.py``: ``alpha = exp(g)`` per key channel,
  L2-normalised q/k with the K^-1/2 scale, ``S <- S Diag(alpha)``, ``d = beta (v - S k)``,
  ``S <- S + d k^T``, ``o = S q``), writes the state back and the output.
* Speculative decode: the state is stepped through the T' window tokens in fp32 registers and one
  state per window position is stored (``(1 + T') S`` bytes per verify, the baseline of docs/recurrences.md section 3);
  ``commit(k)`` moves the slot's ``current`` position k on (no state copy), as the GDN baseline.

Oracle: ``naive.py``'s recurrence in fp64 and the literal baseline (``literal-baseline``, family
kda), which rounds at the same places (state stores in the state dtype, outputs in the activation
dtype; within a speculative window the fp32 state carries over unrounded).  Expected error: within
a small factor of the literal baseline's at the same precision mode (tests/test_kda_triton.py).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm.ops.delta_rule.triton_base import gates, l2_normalise, ticket
from replayssm.ops.gdn.baseline import TritonGDNBaseline
from replayssm.ops.kda.triton_base import TritonKDABase
from replayssm.ops.triton.rounding import cast_nearest, load_state, store_state
from replayssm.registry import register


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _kda_baseline_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                         st_ptr, sc_ptr, cur_ptr, pending_ptr, ticket_ptr, sr_ptr, seed, num_slots,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                         NPOS: tl.constexpr, SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                         NVB: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr, INTERPRET: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    hk = h // (HV // H)
    offs_k = tl.arange(0, BK)
    offs_v = vb * BV + tl.arange(0, BV)
    mk = offs_k < K
    mv = offs_v < V
    ms = mv[:, None] & mk[None, :]
    tile = offs_v[:, None] * K + offs_k[None, :]
    A_log = tl.load(A_log_ptr + h)
    dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mk, other=0.0)
    cur = tl.load(cur_ptr + slot)
    base = (slot * NPOS + cur) * HV * V + h * V
    s = load_state(st_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
    cnt = tl.load(sr_ptr + slot)
    for t in tl.static_range(T):
        tok = r * T + t
        q = tl.load(q_ptr + (tok * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (tok * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (tok * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + (tok * HV + h) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + tok * HV + h).to(tl.float32)
        qn = l2_normalise(q, 0) * SCALE
        kn = l2_normalise(k, 0)
        g, beta = gates(a, b, A_log, dt_bias)
        s = s * tl.exp(g)[None, :]
        d = beta * (v - tl.sum(s * kn[None, :], 1))
        s = s + d[:, None] * kn[None, :]
        o = tl.sum(s * qn[None, :], 1)
        tl.store(out_ptr + (tok * HV + h) * V + offs_v, cast_nearest(o, out_ptr.dtype.element_ty, INTERPRET), mask=mv)
        # standard decode rewrites the state in place; speculative writes draft t after `current`
        if NPOS > 1:
            pos = (cur + 1 + t) % NPOS
        else:
            pos = cur
        obase = (slot * NPOS + pos) * HV * V + h * V
        store_state(st_ptr + obase * K + tile, sc_ptr + obase + offs_v, s, ms, mv, h * V * K + tile, seed, slot,
                    cnt, t, SCALED, SR, INTERPRET)
    tl.store(pending_ptr + slot, 1, mask=(h + vb) == 0)
    if NPOS == 1 and SR:
        # standard decode: the last program of the slot counts the write (fresh random stream next step)
        last = ticket(ticket_ptr, slot, HV * NVB)
        tl.store(sr_ptr + slot, cnt + 1, mask=last)


@register
class TritonKDABaseline(TritonKDABase, TritonGDNBaseline):
    """The GDN baseline's storage, commit and inspection (one state per draft position, ``current``
    moved on commit) with the per-channel gated step."""

    name = "triton-baseline"
    family = "kda"
    description = ("Triton baseline: state read and written every token (per-channel gates); speculative "
                   "stores one state per draft position and keeps the accepted one")

    def verify_padded(self, slot_ids, inputs, out=None):
        if self.checks:
            ids = self.check_verify_args(slot_ids, inputs, out)
            self._check_ready(ids)
        R, T = slot_ids.shape[0], self.decode.window
        out = self._alloc_out(R, out)
        if R == 0:
            return out
        bv, nvb, nw = self.launch_shape(R)
        _kda_baseline_kernel[(R, self.HV, nvb)](
            slot_ids, inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["b"], out, self.A_log,
            self.dt_bias, self.states, self.scales, self.current, self.pending, self.ticket, self.sr_count,
            self.seed, self.num_slots, H=self.H, HV=self.HV, K=self.K, V=self.V, T=T, NPOS=self.npos,
            SCALE=self.K ** -0.5, BK=self.BK, BV=bv, NVB=nvb, SCALED=self.scaled, SR=self.sr,
            INTERPRET=self.interpret, num_warps=nw)
        return out


__all__ = ["TritonKDABaseline"]
