"""Adapter for SGLang 0.5.23's Mamba-2 baseline ``selective_state_update``: ``sglang-baseline``
(family mamba2; ``sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py``).

Oracle: the validation engine against ``literal-baseline`` (fp64 recurrence on the accepted
stream; the literal baseline at the same precision mode for the tolerance rule).  Expected: the
literal model's error within its small factor (or the fp64 running-error bound).

* Standard decode: one state per slot, updated in place (``T = 1``).
* Speculative: SGLang's MTP verify path: one launch over the whole window with
  ``disable_state_update=True`` and an ``intermediate_states_buffer [slots, T', H, P, N]`` (one
  state per draft position, keyed by the state index); commit(k) copies draft state k - 1 into the
  slot's state, as SGLang's post-verify state update does (the accepted count includes the bonus
  token).

Bridges (besides the poisoned output scratch of ``_base.py``): padding rows are ``pad_slot_id =
-1`` (no null block: our slot s is state s + 1, state 0 is never used); the kernel computes and
writes padding rows' outputs from a zero state, so outputs go through the scratch; window inputs are
``[R, T', ...]`` as the kernel takes them (no packing); ``A``, ``dt``, ``dt_bias`` and ``D`` are
stride-0 ``[H, P, N]`` / ``[.., H, P]`` views (its TIE_HDIM path).

Modes: the state in the state tensor's dtype (fp32 / bf16 / fp16, a plain cast when stored; the
draft states too), fp32 / bf16 / fp16 activations, fp32 arithmetic, no dots.  Its ``softplus`` is
``log(exp(x) + 1)`` (as vLLM's: see docs/findings.md).  Its fp16 stochastic rounding
(``enable_stochastic_rounding``: inline PTX, a seed drawn by ``torch.randint`` inside the wrapper on
every call, so a repeated step cannot be reproduced) is not bridged: ``-sr`` modes are refused.
"""

from __future__ import annotations

import torch

from replayssm.adapters._base import broadcast_last, float_mode_reason, tie_hdim
from replayssm.adapters._checkpoint_only import CheckpointOnlyAdapter
from replayssm.adapters._vllm_source import launch_guard


class SGLangMamba2Baseline(CheckpointOnlyAdapter):
    name = "sglang-baseline"
    family = "mamba2"
    kind = "baseline"
    description = ("SGLang 0.5.23 selective_state_update (Mamba-2 baseline; speculative: intermediate state "
                   "buffer, commit copies the accepted draft state)")
    loader = None  # set by replayssm.adapters.sglang.load(): returns the kernel modules

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "SGLang's selective_state_update")

    def __init__(self, config):
        super().__init__(config)
        self.fn = type(self).loader()["mamba_ssm"].selective_state_update
        g, S = self.geometry, self.num_slots + 1
        self.T = self.decode.window if self.decode.speculative else 1
        self.state = torch.zeros((S, *self.state_shape), dtype=self.mode.state_dtype, device=self.device)
        if self.decode.speculative:
            self.inter = torch.zeros((S, self.T, *self.state_shape), dtype=self.mode.state_dtype, device=self.device)
        self.accepted = torch.ones(S, dtype=torch.int64, device=self.device)
        p = {k: v.to(self.device, torch.float32) for k, v in config.params.items()}
        tied = tie_hdim(p, g)
        self.A3, self.bias2, self.D2 = tied["A"], tied["dt_bias"], tied["D"]

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        b = self.blocks(slot_ids).index_select(0, rows).long()
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.accepted[b] = 1
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        g, R, T = self.geometry, slot_ids.shape[0], self.T
        idx = torch.where(slot_ids >= 0, self.blocks(slot_ids), -1).to(torch.int32).contiguous()
        tok = {k: v[:, :T].contiguous() for k, v in inputs.items()}
        dt = broadcast_last(tok["dt"], g.headdim)
        o = self.scratch(R, T, g.nheads, g.headdim)
        kw = dict(intermediate_states_buffer=self.inter, cache_steps=T, disable_state_update=True) \
            if self.decode.speculative else {}
        with launch_guard(self.device):
            self.fn(self.state, tok["x"], dt, self.A3, tok["B"], tok["C"], D=self.D2, z=tok.get("z"),
                    dt_bias=self.bias2, dt_softplus=True, state_batch_indices=idx, pad_slot_id=-1, out=o, **kw)
        act = self.active_rows(slot_ids)
        out[act] = o.index_select(0, act)
        self.end_verify(ids)
        return out

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        if self.decode.speculative:
            act = self.active_rows(slot_ids)
            b = self.blocks(slot_ids).index_select(0, act).long()
            k = accepted.index_select(0, act).long().to(self.device)
            self.state[b] = self.inter[b, k - 1]
            self.accepted[b] = k

    def snapshot_extra(self):
        extra = {"accepted": self.accepted[1:].cpu().clone()}
        if self.decode.speculative:
            extra["drafts"] = self.inter[1:].cpu().clone()
        return extra
