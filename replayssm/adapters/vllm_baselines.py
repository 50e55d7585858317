"""Adapters for vLLM's baseline decode kernels (state read and written every token).

Oracle: the validation engine against ``literal-baseline`` (fp64 recurrence on the accepted
stream; the literal baseline at the same precision mode for the tolerance rule).  Expected: the
literal model's error within its small factor.

* ``vllm-baseline`` (Mamba-2): ``mamba_ssm.selective_state_update``.  Standard decode: one block
  per slot, updated in place.  Speculative: vLLM's layout of one state block per draft position,
  ``state_batch_indices [R, T']`` (block ``1 + slot T' + t``) with ``num_accepted_tokens`` picking
  the block the next verify starts from; packed tokens with ``cu_seqlens`` (padding rows: none).
* ``vllm-baseline`` (GDN): ``fused_recurrent_gated_delta_rule_packed_decode`` (standard; packed
  ``mixed_qkv = [q | k | v]``) and ``fused_sigmoid_gating_delta_rule_update`` (speculative, the same
  per-draft blocks and ``num_accepted_tokens``; varlen ``cu_seqlens``).

Bridges: null block 0 and our slot s -> block(s) (``_base.py``); ``num_accepted_tokens`` counts
the bonus token, so our ``accepted`` k is stored as is and the next verify starts from draft block
k - 1; reset writes the initial state into draft block 0 and sets the count to 1.  Both kernels
write padding rows' outputs (zeros, or leave them unwritten): outputs go through the poisoned
scratch.  Modes: fp32 / bf16 / fp16 state (a plain cast), fp32 / bf16 / fp16 activations, fp32
arithmetic; ``selective_state_update``'s stochastic rounding (fp16 state, inline PTX) is not
bridged, so ``-sr`` modes are refused.
"""

from __future__ import annotations

import torch

from replayssm.adapters._base import SlotAdapter, broadcast_last, float_mode_reason, tie_hdim
from replayssm.adapters._vllm_source import launch_guard
from replayssm.interface import KernelSnapshot


class _VllmBaseline(SlotAdapter):
    kind = "baseline"
    # the speculative kernels are varlen (cu_seqlens, a seq_len per row; the live block chosen by
    # num_accepted_tokens): packed calls pass their buffer and offsets through, ragged calls and standard
    # steps on the speculative slots are packed with each row's length (_base.py)
    supports_packed_layout = True
    supports_ragged_windows = True
    supports_mixed_decode = True

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, f"vLLM's {cls.family} baseline")

    def __init__(self, config):
        super().__init__(config)
        T = self.decode.window if self.decode.speculative else 1
        self.T = T
        self.states = torch.zeros((1 + self.num_slots * T, *self.state_shape), dtype=self.mode.state_dtype,
                                  device=self.device)
        self.live = torch.ones(self.num_slots + 1, dtype=torch.int32, device=self.device)  # accepted count

    def draft_blocks(self, slot_ids) -> torch.Tensor:
        """int32 ``[R, T']``: the state block of each draft position (padding rows: the null block)."""
        t = torch.arange(self.T, device=self.device)
        blk = 1 + slot_ids[:, None].long() * self.T + t[None, :]
        return torch.where(slot_ids[:, None] >= 0, blk, 0).to(torch.int32).contiguous()

    def live_block(self, s: int) -> int:
        return 1 + s * self.T + int(self.live[s + 1]) - 1

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        first = self.draft_blocks(slot_ids)[:, 0].index_select(0, rows).long()
        self.states[first] = (0 if initial_state is None
                              else initial_state.index_select(0, rows).to(self.states.dtype))
        self.live[self.blocks(slot_ids).index_select(0, rows).long()] = 1
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        if not self.decode.speculative and query_start_loc is not None:
            return self.standard_from_packed(slot_ids, inputs, out, query_start_loc, self.verify)
        ids, out = self.begin_serving_verify(slot_ids, inputs, out, window_lens, query_start_loc)
        live = self.live.index_select(0, self.blocks(slot_ids).long()).contiguous()
        if not self.decode.speculative:
            act = self.active_rows(slot_ids)
            fn, o = self.launch_fn(slot_ids, inputs, live)
            with launch_guard(self.device):
                fn()
            out[act] = self.packed_out(o).view(len(ids), 1, *self.out_shape).index_select(0, act)
            self.end_verify(ids)
            return out
        tok, cu, lens, put = self.pack_tokens(ids, inputs, window_lens, query_start_loc)
        fn, o = self.launch_fn(slot_ids, inputs, live, (sum(lens), cu, tok))
        with launch_guard(self.device):
            fn()
        put(self.packed_out(o), out)
        self.end_verify(ids, lens)
        return out

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        if self.decode.speculative:
            act = self.active_rows(slot_ids)
            self.live[self.blocks(slot_ids).index_select(0, act).long()] = accepted.index_select(0, act).to(
                torch.int32)

    def timed_step(self, slot_ids, inputs, out, accepted):
        """The kernel alone (``_base.py``): inputs packed once; speculative ``num_accepted_tokens`` is
        the step's input in vLLM, here ``accepted`` (every step of the bench commits the same k)."""
        if bool((slot_ids < 0).any()):
            raise ValueError("slot_ids: a timed step takes no padding rows")
        launch, _ = self.launch_fn(slot_ids, inputs, accepted.to(torch.int32).contiguous())

        def step():
            with launch_guard(self.device):
                launch()
        return step

    def packing(self, slot_ids, inputs):
        """(packed token count, int32 cu_seqlens, packed tokens): T' tokens per active row, none for
        padding (the timed step's layout)."""
        counts = (slot_ids >= 0).to(torch.int32) * self.T
        tok = {k: v.index_select(0, self.active_rows(slot_ids)).flatten(0, 1) for k, v in inputs.items()}
        return int(counts.sum()), torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32), tok

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, lambda s: self.states[self.live_block(s)].double())

    def committed_state(self, slot_ids):
        return self.checkpoint_state(slot_ids)

    def snapshot(self):
        n = self.num_slots
        live = torch.tensor([self.live_block(s) for s in range(n)], dtype=torch.long)
        return KernelSnapshot(
            checkpoint=self.states.cpu()[live].clone(), checkpoint_scale=None, records={},
            write_pos=torch.zeros(n, dtype=torch.int64), origin=torch.zeros(n, dtype=torch.int64),
            is_flush=torch.full((n,), not self.decode.speculative),
            extra={"drafts": self.states[1:].cpu().reshape(n, self.T, *self.state_shape).clone(),
                   "accepted": self.live[1:].cpu().clone()})


class VllmMamba2Baseline(_VllmBaseline):
    name = "vllm-baseline"
    family = "mamba2"
    description = ("vLLM selective_state_update (Mamba-2 baseline; speculative: num_accepted_tokens, "
                   "one state block per draft)")

    def __init__(self, config):
        super().__init__(config)
        g = self.geometry
        p = {k: v.to(self.device, torch.float32) for k, v in config.params.items()}
        tied = tie_hdim(p, g)
        self.A3, self.bias2, self.D2 = tied["A"], tied["dt_bias"], tied["D"]

    def launch_fn(self, slot_ids, inputs, num_accepted, packed=None):
        """``(launch, packed output)``: the kernel call on inputs gathered here (speculative: on
        ``packed`` = (token count, cu_seqlens, packed tokens) when given)."""
        g, R = self.geometry, slot_ids.shape[0]
        fn = self.modules["mamba_ssm"].selective_state_update
        if not self.decode.speculative:
            tok = {k: v[:, 0].contiguous() for k, v in inputs.items()}
            o = self.scratch(R, g.nheads, g.headdim)
            kw = dict(state_batch_indices=self.blocks(slot_ids))
        else:
            n, cu, tok = packed if packed is not None else self.packing(slot_ids, inputs)
            tok = {k: v.contiguous() for k, v in tok.items()}
            o = self.scratch(n, g.nheads, g.headdim)
            kw = dict(state_batch_indices=self.draft_blocks(slot_ids), cu_seqlens=cu, num_accepted_tokens=num_accepted)
        dt = broadcast_last(tok["dt"], g.headdim)
        return lambda: fn(self.states, tok["x"], dt, self.A3, tok["B"], tok["C"], self.D2, self.bias2,
                          z=tok.get("z"), dt_softplus=True, null_block_id=0, out=o, **kw), o

    @staticmethod
    def packed_out(o):
        """The launch's outputs, one per token (``[tokens, H, P]``)."""
        return o


class VllmGDNBaseline(_VllmBaseline):
    name = "vllm-baseline"
    family = "gdn"
    description = ("vLLM GDN baselines: packed recurrent decode (standard), fused sigmoid-gating delta rule "
                   "(speculative: num_accepted_tokens, one state block per draft)")
    # Read in vLLM: the packed decode (fused_recurrent.py) rounds beta = sigmoid(b).to(b.dtype) and
    # divides by sqrt(sum u^2 + 1e-6); fused_sigmoid_gating.py keeps beta in fp32 and multiplies by
    # rsqrt(sum u^2 + 1e-6); softplus threshold 20 in both.
    conventions = {"standard": {"beta_rounded": True}, "speculative": {"l2_form": "reciprocal"}}

    def __init__(self, config):
        super().__init__(config)
        p = {k: v.to(self.device, torch.float32).contiguous() for k, v in config.params.items()}
        self.A_log, self.dt_bias = p["A_log"], p["dt_bias"]
        self.scale = self.geometry.head_k_dim ** -0.5

    def launch_fn(self, slot_ids, inputs, num_accepted, packed=None):
        """``(launch, packed output)``: the kernel call on inputs gathered and packed here (speculative:
        on ``packed`` = (token count, cu_seqlens, packed tokens) when given)."""
        g, R = self.geometry, slot_ids.shape[0]
        if not self.decode.speculative:
            tok = {k: v[:, 0] for k, v in inputs.items()}
            mixed = torch.cat([tok["q"].flatten(1), tok["k"].flatten(1), tok["v"].flatten(1)], 1).contiguous()
            a, b, blk = tok["a"].contiguous(), tok["b"].contiguous(), self.blocks(slot_ids)
            o = self.scratch(R, 1, g.num_v_heads, g.head_v_dim)
            fn = self.modules["fused_recurrent"].fused_recurrent_gated_delta_rule_packed_decode
            return lambda: fn(mixed, a, b, self.A_log, self.dt_bias, self.scale, self.states, o, blk,
                              use_qk_l2norm_in_kernel=True), o
        n, cu, tok = packed if packed is not None else self.packing(slot_ids, inputs)
        tok = {k: v[None].contiguous() for k, v in tok.items()}
        fn = self.modules["fused_sigmoid_gating"].fused_sigmoid_gating_delta_rule_update
        blk, res = self.draft_blocks(slot_ids), [None]

        def launch():
            res[0] = fn(self.A_log, tok["a"], tok["b"], self.dt_bias, tok["q"], tok["k"], tok["v"], scale=self.scale,
                        initial_state=self.states, inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=blk,
                        num_accepted_tokens=num_accepted, use_qk_l2norm_in_kernel=True)[0]
        return launch, res

    def packed_out(self, o):
        """The launch's outputs, one per token: the standard scratch ``[R, 1, HV, V]``, or the
        speculative kernel's returned ``[1, tokens, HV, V]``."""
        return o.flatten(0, 1) if isinstance(o, torch.Tensor) else o[0][0]
