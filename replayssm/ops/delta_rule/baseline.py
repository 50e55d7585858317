"""The Triton baseline decode of a delta-rule family ("triton-baseline" of Gated DeltaNet and KDA): the state is
read and written every token, as serving engines do it without ReplaySSM (flash-linear-attention's fused
recurrent form, one kernel for both gate widths: the ``PER_CHANNEL_GATE`` constexpr).

* Standard decode: one program per (row, value head, block of value rows) loads its state tile,
  applies the delta rule (docs/recurrences.md section 1; ``alpha = exp(g)`` per value head, or per key channel
  with ``S <- S Diag(alpha)``; L2-normalised q/k with the K^-1/2 scale; ``d = beta (v - alpha S k)``), writes
  the state back and the output.
* Speculative decode: the state is stepped through the T' window tokens in fp32 registers and one
  state per window position is stored (``(1 + T') S`` bytes per verify, the baseline of docs/recurrences.md
  section 3).  Each slot keeps T' + 1 state positions; verify reads the committed one (``current``) and
  writes the drafts into the T' others, so ``commit(k)`` only moves ``current`` k positions on
  (a device-side pointer update, no state copy).

Oracle: the family's fp64 recurrence and its literal baseline (``literal-baseline``), which rounds at
the same places (state stores in the state dtype, outputs in the activation dtype; within a
speculative window the fp32 state carries over unrounded).  Expected error: within a small
factor of the literal baseline's at the same precision mode (tests/test_gdn_triton.py, tests/test_kda_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.interface import KernelSnapshot
from replayssm.ops.delta_rule.triton_base import (
    TritonDeltaRuleBase,
    delta_step,
    gate_params,
    program_row,
    ticket,
    token_gates,
    token_qk,
)
from replayssm.ops.triton.rounding import cast_nearest, load_state, store_state


@triton.jit(do_not_specialize=["seed", "num_slots"])
def _baseline_kernel(slot_ptr, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, out_ptr, A_log_ptr, dt_bias_ptr,
                     st_ptr, sc_ptr, cur_ptr, pending_ptr, ticket_ptr, sr_ptr, seed, num_slots,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
                     NPOS: tl.constexpr, SCALE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     NVB: tl.constexpr, SCALED: tl.constexpr, SR: tl.constexpr, INTERPRET: tl.constexpr,
                     PER_CHANNEL_GATE: tl.constexpr):
    r, h, vb, slot, hk, offs_k, mk = program_row(slot_ptr, HV, H, BK, K)
    if slot < 0:
        return
    offs_v = vb * BV + tl.arange(0, BV)
    mv = offs_v < V
    ms = mv[:, None] & mk[None, :]
    tile = offs_v[:, None] * K + offs_k[None, :]
    A_log, dt_bias = gate_params(A_log_ptr, dt_bias_ptr, h, offs_k, mk, K, PER_CHANNEL_GATE)
    cur = tl.load(cur_ptr + slot)
    base = (slot * NPOS + cur) * HV * V + h * V
    s = load_state(st_ptr + base * K + tile, sc_ptr + base + offs_v, ms, mv, SCALED)
    cnt = tl.load(sr_ptr + slot)
    for t in tl.static_range(T):
        tok = r * T + t
        qn, kn = token_qk(q_ptr, k_ptr, tok, hk, offs_k, mk, H, K, SCALE)
        v = tl.load(v_ptr + (tok * HV + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        g, beta = token_gates(a_ptr, b_ptr, tok, h, offs_k, mk, A_log, dt_bias, HV, K, PER_CHANNEL_GATE)
        s, d = delta_step(s, g, beta, v, kn, PER_CHANNEL_GATE)
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


class DeltaRuleBaseline(TritonDeltaRuleBase):
    """The baseline's storage (T' + 1 state positions per slot in speculative decode), launches, commit and
    inspection; a family's kernel class puts its Triton base (``family``, ``PER_CHANNEL_GATE``) before this."""

    kind = "baseline"

    def __init__(self, config) -> None:
        # speculative: T' + 1 state positions per slot (the committed state and T' drafts)
        self.NPOS_EXTRA = config.decode.window if config.decode.speculative else 0
        super().__init__(config)

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
            INTERPRET=self.interpret, PER_CHANNEL_GATE=self.PER_CHANNEL_GATE, num_warps=nw)
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


__all__ = ["DeltaRuleBaseline"]
