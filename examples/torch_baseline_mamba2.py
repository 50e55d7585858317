"""Worked example for docs/kernel_interface.md: an outside kernel plugged into replayssm.

A plain-PyTorch Mamba-2 *baseline* decode kernel (the state is read and written every token;
speculative windows keep one state per draft position), written the way a serving engine would:
batched over rows, slot-indexed state, padding rows skipped, fp32 arithmetic, state stored in
fp32 or bf16.  It is validated by the suite like any other kernel (tests/core/test_example_kernel.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replayssm import PAD_SLOT, KernelSnapshot, KernelUnderTest, register


@register
class TorchBaselineMamba2(KernelUnderTest):
    name = "example-torch-baseline"
    family = "mamba2"
    kind = "baseline"
    description = "worked example: batched PyTorch baseline decode (docs/kernel_interface.md)"

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if mode.state not in ("fp32", "bf16") or mode.act not in ("fp32", "bf16"):
            return "this example stores fp32/bf16 states and takes fp32/bf16 activations only"
        if mode.dot != "ieee" or mode.rounding != "nearest":
            return "this example reads out in ieee fp32 with round-to-nearest state writes"
        return None

    def __init__(self, config):
        super().__init__(config)
        p = {k: v.to(self.device, torch.float32) for k, v in config.params.items()}
        self.A, self.dt_bias, self.D = p["A"], p["dt_bias"], p["D"]
        T = self.decode.window
        self.state = torch.zeros((self.num_slots, *self.state_shape), dtype=self.mode.state_dtype, device=self.device)
        self.drafts = torch.zeros((self.num_slots, T, *self.state_shape), dtype=self.mode.state_dtype,
                                  device=self.device)

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                self.state[s] = 0 if initial_state is None else initial_state[r].to(self.state.dtype)

    def verify(self, slot_ids, inputs, out=None):
        self.check_verify_args(slot_ids, inputs, out)
        R, T = slot_ids.shape[0], self.decode.window
        if out is None:
            out = torch.full((R, T, *self.out_shape), float("nan"), dtype=self.mode.act_dtype, device=self.device)
        rows = (slot_ids != PAD_SLOT).nonzero().flatten()
        slots = slot_ids[rows]
        H = self.geometry.nheads
        rep = H // self.geometry.ngroups
        S = self.state[slots].float()
        for t in range(T):
            x, dt = inputs["x"][rows, t].float(), inputs["dt"][rows, t].float()
            B = inputs["B"][rows, t].float().repeat_interleave(rep, dim=1)
            C = inputs["C"][rows, t].float().repeat_interleave(rep, dim=1)
            delta = F.softplus(dt + self.dt_bias, threshold=20.0)
            S = torch.exp(self.A * delta)[..., None, None] * S + (delta[..., None] * x)[..., None] * B[:, :, None, :]
            y = torch.einsum("rhpn,rhn->rhp", S, C) + self.D[:, None] * x
            out[rows, t] = y.to(out.dtype)
            if self.decode.speculative:
                self.drafts[slots, t] = S.to(self.drafts.dtype)
        if not self.decode.speculative:
            self.state[slots] = S.to(self.state.dtype)
        return out

    def commit(self, slot_ids, accepted):
        self.check_commit_args(slot_ids, accepted)
        if self.decode.speculative:
            rows = (slot_ids != PAD_SLOT).nonzero().flatten()
            self.state[slot_ids[rows]] = self.drafts[slot_ids[rows], accepted[rows] - 1]

    def committed_state(self, slot_ids):
        return self.checkpoint_state(slot_ids)

    def checkpoint_state(self, slot_ids):
        self._check_slot_ids(slot_ids)
        out = self.state[slot_ids.clamp(min=0)].double()
        out[slot_ids == PAD_SLOT] = float("nan")
        return out

    def snapshot(self):
        n = self.num_slots
        return KernelSnapshot(
            checkpoint=self.state.cpu().clone(), checkpoint_scale=None, records={},
            write_pos=torch.zeros(n, dtype=torch.int64), origin=torch.zeros(n, dtype=torch.int64),
            is_flush=torch.full((n,), not self.decode.speculative), extra={"drafts": self.drafts.cpu().clone()})
