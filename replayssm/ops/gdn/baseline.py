"""Triton baseline Gated DeltaNet decode ("triton-baseline"): the state is read and written every
token, as serving engines do it without ReplaySSM.

* Standard decode: one program per (row, value head, block of value rows) loads its state tile,
  applies the gated delta rule (docs/recurrences.md section 1: gating, L2-normalised q/k with the K^-1/2 scale,
  corrected value d = beta (v - alpha S k)), writes the state back and the output.
* Speculative decode: the state is stepped through the T' window tokens in fp32 registers and one
  state per window position is stored (``(1 + T') S`` bytes per verify, the baseline of docs/recurrences.md section 3).
  Each slot keeps T' + 1 state positions; verify reads the committed one (``current``) and
  writes the drafts into the T' others, so ``commit(k)`` only moves ``current`` k positions on
  (a device-side pointer update, no state copy).

Oracle: ``gdn_sequence`` in fp64 and the literal baseline (``literal-baseline``), which rounds at
the same places (state stores in the state dtype, outputs in the activation dtype; within a
speculative window the fp32 state carries over unrounded).  Expected error: within a small
factor of the literal baseline's at the same precision mode (tests/test_gdn_triton.py).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.interface import KernelSnapshot
from replayssm.ops.delta_rule.triton_base import gates, l2_normalise, ticket
from replayssm.ops.gdn.triton_base import TritonGDNBase
from replayssm.ops.triton.rounding import cast_nearest, load_state, store_state
from replayssm.registry import register


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _baseline_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
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
    dt_bias = tl.load(dt_bias_ptr + h)
    cur = tl.load(cur_ptr + slot)
    base = (slot * NPOS + cur) * HV * V + h * V
    s = load_state(st_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
    cnt = tl.load(sr_ptr + slot)
    for t in tl.static_range(T):
        tok = r * T + t
        q = tl.load(q_ptr + (tok * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + (tok * H + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (tok * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + tok * HV + h).to(tl.float32)
        b = tl.load(b_ptr + tok * HV + h).to(tl.float32)
        qn = l2_normalise(q, 0) * SCALE
        kn = l2_normalise(k, 0)
        g, beta = gates(a, b, A_log, dt_bias)
        alpha = tl.exp(g)
        d = beta * (v - alpha * tl.sum(s * kn[None, :], 1))
        s = alpha * s + d[:, None] * kn[None, :]
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


@triton.jit(do_not_specialize=["R"])
def _baseline_commit_kernel(slot_ptr, acc_ptr, cur_ptr, pending_ptr, sr_ptr, R, NPOS: tl.constexpr,
                            BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + offs, mask=offs < R, other=-1)
    m = (offs < R) & (slot >= 0)
    k = tl.load(acc_ptr + offs, mask=m, other=1).to(tl.int32)
    cur = tl.load(cur_ptr + slot, mask=m, other=0)
    tl.store(cur_ptr + slot, (cur + k) % NPOS, mask=m)
    tl.store(pending_ptr + slot, 0, mask=m)
    cnt = tl.load(sr_ptr + slot, mask=m, other=0)
    tl.store(sr_ptr + slot, cnt + 1, mask=m)


class _BaselineStorage(TritonGDNBase):
    kind = "baseline"

    def __init__(self, config) -> None:
        # speculative: T' + 1 state positions per slot (the committed state and T' drafts)
        self.NPOS_EXTRA = config.decode.window if config.decode.speculative else 0
        super().__init__(config)


@register
class TritonGDNBaseline(_BaselineStorage):
    name = "triton-baseline"
    description = ("Triton baseline: state read and written every token; speculative stores one state per "
                   "draft position and keeps the accepted one")

    def verify_padded(self, slot_ids, inputs, out=None):
        if self.checks:
            ids = self.check_verify_args(slot_ids, inputs, out)
            self._check_ready(ids)
        R, T = slot_ids.shape[0], self.decode.window
        out = self._alloc_out(R, out)
        if R == 0:
            return out
        bv, nvb, nw = self.launch_shape(R)
        _baseline_kernel[(R, self.HV, nvb)](
            slot_ids, inputs["q"], inputs["k"], inputs["v"], inputs["a"], inputs["b"], out, self.A_log,
            self.dt_bias, self.states, self.scales, self.current, self.pending, self.ticket, self.sr_count,
            self.seed, self.num_slots, H=self.H, HV=self.HV, K=self.K, V=self.V, T=T, NPOS=self.npos,
            SCALE=self.K ** -0.5, BK=self.BK, BV=bv, NVB=nvb, SCALED=self.scaled, SR=self.sr,
            INTERPRET=self.interpret, num_warps=nw)
        return out

    def commit(self, slot_ids, accepted) -> None:
        if self.checks:
            ids, ks = self.check_commit_args(slot_ids, accepted, window_lens=self.window_bound())
            self._check_pending(ids)
        R = slot_ids.shape[0]
        if R == 0:
            return
        if self.decode.speculative:
            _baseline_commit_kernel[(triton.cdiv(R, 256),)](slot_ids, accepted, self.current, self.pending,
                                                            self.sr_count, R, NPOS=self.npos, BLOCK=256)
        elif self.checks:
            self._close_step(slot_ids)

    def _checkpoint_pos(self, slot: int) -> int:
        return int(self.current[slot])

    def committed_state(self, slot_ids) -> torch.Tensor:
        return self.checkpoint_state(slot_ids)

    def snapshot(self) -> KernelSnapshot:
        S = self.num_slots
        cur = self.current.long()
        idx = torch.arange(S, device=self.device)
        return KernelSnapshot(
            checkpoint=self.states[idx, cur].clone(),
            checkpoint_scale=self.scales[idx, cur].clone() if self.scaled else None,
            records={},
            write_pos=torch.zeros(S, dtype=torch.int64),
            origin=torch.zeros(S, dtype=torch.int64),
            # the baseline rewrites its state at every standard step: each one is a "flush"
            is_flush=torch.full((S,), not self.decode.speculative, dtype=torch.bool),
            extra={"states": self.states.clone(), "scales": self.scales.clone(),
                   "current": self.current.clone(), **self._flags()},
        )

    def restore(self, snapshot: KernelSnapshot) -> None:
        for name in ("states", "scales", "current"):
            if name not in snapshot.extra:
                raise ValueError(f"snapshot.extra: expected key {name!r} (a snapshot of {self.name!r})")
        st = snapshot.extra["states"]
        if tuple(st.shape) != tuple(self.states.shape) or st.dtype != self.states.dtype:
            raise ValueError(f"snapshot.extra['states']: expected {self.states.dtype} {tuple(self.states.shape)}, "
                             f"got {st.dtype} {tuple(st.shape)}")
        self._restore_flags(snapshot)
        self.states.copy_(st)
        self.scales.copy_(snapshot.extra["scales"])
        self.current.copy_(snapshot.extra["current"])


__all__ = ["TritonGDNBaseline"]
