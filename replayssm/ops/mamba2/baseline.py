"""The baseline Mamba-2 decode kernel in Triton: the state is read and written every token.

Oracle: the literal baseline ("literal-baseline" in ``naive.py``) and the fp64 recurrence
``mamba2_step`` (docs/recurrences.md section 1).  Expected error against fp64: the literal baseline's error at the same
precision mode within a small factor (fp32 summation order, the GPU's exp/log).

Standard decode: one launch per step reads the slot's state, applies
``S <- exp(A Δ) S + Δ x Bᵀ``, writes ``y = S C + D x`` and stores S back in place (``2 S`` bytes
per step: the comparison point of docs/recurrences.md section 2).

Speculative decode (docs/recurrences.md section 3, the "store one state per draft position" baseline, done the way a
serving engine does it, without a copy): each slot owns ``T' + 1`` state buffers and a device-side
index of the live one.  A verify reads the live buffer once, steps through the window in fp32 and
stores the state after each position in the T' other buffers (``(1 + T') S`` bytes);
``commit(k)`` makes the buffer holding position k-1 live (a cursor write, no state copy).

One program owns one (batch row, head) and ``NCH`` tiles of ``BP`` state rows, like the replay
kernel; stochastic rounding keys its Philox stream by (slot, per-slot write counter, window
position), the counter moving in the commit launch.

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm.interface import PAD_SLOT, KernelSnapshot
from replayssm.ops.mamba2.replay import write_state_kernel
from replayssm.ops.mamba2.triton_common import TritonMamba2Base
from replayssm.ops.triton.math import softplus
from replayssm.ops.triton.rounding import INTERPRET, STREAM_RESET, cast_nearest, load_state, store_state
from replayssm.registry import register
from replayssm.rounding import dequantize_state


@triton.jit
def _baseline_kernel(
        slot_ptr, x_ptr, dt_ptr, B_ptr, C_ptr, z_ptr, A_ptr, bias_ptr, D_ptr, out_ptr,
        st_ptr, sts_ptr, live_ptr, cnt_ptr, seed,
        H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr, T: tl.constexpr,
        NBUF: tl.constexpr, HAS_Z: tl.constexpr, STATE: tl.constexpr, ACT: tl.constexpr, SR: tl.constexpr,
        INTERP: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, NSPLIT: tl.constexpr, NCH: tl.constexpr):
    pid = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    h = pid // NSPLIT
    split = pid % NSPLIT
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot < 0:
        return
    g = h // (H // G)
    SCALED: tl.constexpr = STATE.primitive_bitwidth == 8
    if NBUF > 1:
        live = tl.load(live_ptr + slot)
    else:
        live = 0
    if SR:
        ctr = tl.load(cnt_ptr + slot)
    else:
        ctr = 0
    A = tl.load(A_ptr + h)
    bias = tl.load(bias_ptr + h)
    Dh = tl.load(D_ptr + h)
    n = tl.arange(0, BN)
    nm = n < N
    for ch in range(NCH):
        p = (split * NCH + ch) * BP + tl.arange(0, BP)
        pm = p < P
        m2 = pm[:, None] & nm[None, :]
        hp = ((slot * NBUF + live) * H + h) * P + p
        S = load_state(st_ptr + hp[:, None] * N + n[None, :], sts_ptr + hp, m2, pm, SCALED)
        for s in tl.static_range(T):
            dt_s = tl.load(dt_ptr + (r * T + s) * H + h).to(tl.float32)
            delta = softplus(dt_s + bias)
            a = tl.exp(A * delta)
            x_s = tl.load(x_ptr + ((r * T + s) * H + h) * P + p, mask=pm, other=0.0).to(tl.float32)
            B_s = tl.load(B_ptr + ((r * T + s) * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
            C_s = tl.load(C_ptr + ((r * T + s) * G + g) * N + n, mask=nm, other=0.0).to(tl.float32)
            S = a * S + (delta * x_s)[:, None] * B_s[None, :]
            y = tl.sum(S * C_s[None, :], axis=1) + Dh * x_s
            if HAS_Z:
                zz = tl.load(z_ptr + ((r * T + s) * H + h) * P + p, mask=pm, other=0.0).to(tl.float32)
                y = y * zz / (1.0 + tl.exp(-zz))
            tl.store(out_ptr + ((r * T + s) * H + h) * P + p, cast_nearest(y, ACT, INTERP), mask=pm)
            if NBUF > 1:
                dst = s + (s >= live).to(tl.int32)
            else:
                dst = 0
            hq = ((slot * NBUF + dst) * H + h) * P + p
            elem = (h * P + p)[:, None] * N + n[None, :]
            store_state(st_ptr + hq[:, None] * N + n[None, :], sts_ptr + hq, S, m2, pm, elem, seed, slot, ctr, s,
                        SCALED, SR, INTERP)


@triton.jit
def _baseline_commit_kernel(slot_ptr, acc_ptr, live_ptr, cnt_ptr, R, NBUF: tl.constexpr, SR: tl.constexpr,
                            BLOCK: tl.constexpr):
    """commit(k): the buffer holding window position k-1 becomes live; a write counter step (SR)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + i, mask=i < R, other=-1).to(tl.int64)
    act = (i < R) & (slot >= 0)
    if NBUF > 1:
        k = tl.load(acc_ptr + i, mask=act, other=1).to(tl.int32)
        live = tl.load(live_ptr + slot, mask=act, other=0)
        t = k - 1
        tl.store(live_ptr + slot, t + (t >= live).to(tl.int32), mask=act)
    if SR:
        c = tl.load(cnt_ptr + slot, mask=act, other=0)
        tl.store(cnt_ptr + slot, c + 1, mask=act)


@register
class TritonBaseline(TritonMamba2Base):
    name = "triton-baseline"
    kind = "baseline"
    description = ("baseline Triton kernel: state read and written every token; speculative: one state per "
                   "draft position, the accepted one made live by index")
    dots = ("ieee",)

    def __init__(self, config):
        super().__init__(config)
        g, m = self.geometry, self.mode
        S, dev = self.num_slots, self.device
        self.nbuf = 1 if not self.decode.speculative else self.decode.window + 1
        self.states = torch.zeros((S, self.nbuf, *self.state_shape), dtype=m.state_dtype, device=dev)
        self.scales = (torch.ones((S, self.nbuf, g.nheads, g.headdim), dtype=torch.float32, device=dev)
                       if m.scaled_state else torch.ones(1, dtype=torch.float32, device=dev))

    # ---- raw launches ---------------------------------------------------------------------------------
    def launch_verify(self, slot_ids, inputs, out) -> None:
        g, d = self.geometry, self.decode
        R = slot_ids.shape[0]
        split = self.split_for(R)
        with self._device_ctx():
            _baseline_kernel[(g.nheads * split, R)](
                slot_ids, inputs["x"], inputs["dt"], inputs["B"], inputs["C"], self._z(inputs),
                self.A, self.dt_bias, self.D, out, self.states, self.scales, self.live, self.counter, self.seed,
                H=g.nheads, P=g.headdim, N=g.dstate, G=g.ngroups, T=d.window, NBUF=self.nbuf, HAS_Z=g.has_z,
                STATE=self.state_kind, ACT=self.act_kind, SR=self.sr, INTERP=INTERPRET, BP=self.block_p,
                BN=self.block_n, NSPLIT=split, NCH=triton.cdiv(self.nchunks, split), num_warps=self.num_warps)

    @property
    def commit_launches(self) -> bool:
        """Whether commit does device work (speculative live index, or the SR write counter)."""
        return self.nbuf > 1 or self.sr

    def launch_commit(self, slot_ids, accepted) -> None:
        if not self.commit_launches:
            return
        R = slot_ids.shape[0]
        BLOCK = 128
        with self._device_ctx():
            _baseline_commit_kernel[(triton.cdiv(R, BLOCK),)](
                slot_ids, accepted, self.live, self.counter, R, NBUF=self.nbuf, SR=self.sr, BLOCK=BLOCK)

    # ---- the interface ----------------------------------------------------------------------------------
    def reset(self, slot_ids, initial_state=None, origin=None) -> None:
        ids = self.check_reset_args(slot_ids, initial_state, origin) if self.checks else slot_ids.tolist()
        g = self.geometry
        src = None if initial_state is None else initial_state.to(torch.float32).contiguous()
        with self._device_ctx():
            write_state_kernel[(g.nheads, slot_ids.shape[0])](
                slot_ids, src if src is not None else self._dummy, self.states, self.scales, self.counter,
                self.seed, self.nbuf, H=g.nheads, P=g.headdim, N=g.dstate, HAS_SRC=src is not None,
                STATE=self.state_kind, SR=self.sr, INTERP=INTERPRET, STREAM=STREAM_RESET, BP=self.block_p,
                BN=self.block_n, NCH=self.nchunks, num_warps=self.num_warps)
        self._reset_cursors(slot_ids, origin)
        self._host_reset(ids)

    def verify_padded(self, slot_ids, inputs, out=None):
        if self.checks:
            ids = self.check_verify_args(slot_ids, inputs, out, None, None)
            for r, s in enumerate(ids):
                if s != PAD_SLOT and not self.ready[s]:
                    raise ValueError(f"slot_ids[{r}]: slot {s} was never reset")
        out = self._new_out(slot_ids.shape[0]) if out is None else out
        self.launch_verify(slot_ids, inputs, out)
        if self.checks:
            for s in ids:
                if s != PAD_SLOT:
                    self.pending[s] = True
        return out

    def commit(self, slot_ids, accepted) -> None:
        if self.checks:
            ids, _ = self.check_commit_args(slot_ids, accepted, self.pending, self.window_bound())
            if accepted.device != self.device:
                raise ValueError(f"accepted: expected device {self.device}, got {accepted.device}")
        self.launch_commit(slot_ids, accepted)
        if self.checks:
            for s in ids:
                if s != PAD_SLOT:
                    self.pending[s] = False

    # ---- inspection ---------------------------------------------------------------------------------------
    def checkpoint_state(self, slot_ids):
        ids = self._check_slot_ids(slot_ids)
        live = self.live.tolist()
        out = torch.full((len(ids), *self.state_shape), float("nan"), dtype=torch.float64, device=self.device)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                scale = self.scales[s, live[s]] if self.mode.scaled_state else None
                out[r] = dequantize_state(self.states[s, live[s]], scale, torch.float64)
        return out

    def launch_checkpoint(self, slot_ids) -> torch.Tensor:
        """Raw checkpoint_state of slots that are not padding: the same fp64 values, gathered on the
        device (live buffer included) without host checks (no host sync)."""
        ids = slot_ids.long()
        live = self.live.index_select(0, ids).long()
        scale = self.scales[ids, live] if self.mode.scaled_state else None
        return dequantize_state(self.states[ids, live], scale, torch.float64)

    def committed_state(self, slot_ids):
        return self.checkpoint_state(slot_ids)

    supports_restore = True

    def snapshot(self) -> KernelSnapshot:
        S = self.num_slots
        dev_live = self.live.detach().to(torch.int64)
        live = dev_live.cpu()
        idx = torch.arange(S, device=self.device)
        states = self.states.detach()
        scales = self.scales.detach() if self.mode.scaled_state else None
        return KernelSnapshot(
            checkpoint=states[idx, dev_live].clone(),
            checkpoint_scale=None if scales is None else scales[idx, dev_live].clone(),
            records={},
            write_pos=torch.zeros(S, dtype=torch.int64),
            origin=torch.zeros(S, dtype=torch.int64),
            # The baseline rewrites its state at every standard step: each one is a "flush".
            is_flush=torch.full((S,), not self.decode.speculative, dtype=torch.bool),
            extra={"states": states.clone(), "live": live.clone(),
                   **({} if scales is None else {"scales": scales.clone()}), **self._host_flags()},
        )

    def restore(self, snapshot: KernelSnapshot) -> None:
        extra = snapshot.extra
        for key in ("states", "live"):
            if key not in extra:
                raise ValueError(f"snapshot.extra: expected key {key!r} (a snapshot of {self.name!r}), "
                                 f"got {sorted(extra)}")
        self._check_tensor("snapshot.extra['states']", extra["states"], self.states.shape, self.states.dtype)
        if self.mode.scaled_state:
            self._check_tensor("snapshot.extra['scales']", extra.get("scales"), self.scales.shape, torch.float32)
        self._restore_flags(snapshot)
        self.states.copy_(extra["states"].to(self.device))
        if self.mode.scaled_state:
            self.scales.copy_(extra["scales"].to(self.device))
        self.live.copy_(extra["live"].to(self.device, torch.int32))


__all__ = ["TritonBaseline"]
