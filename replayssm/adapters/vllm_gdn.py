"""Adapter for the official ReplaySSM GDN kernels (vLLM fork): ``vllm-replay`` (family gdn).

Oracle: the validation engine (fp64 gated delta rule on the accepted stream, ``literal-replay`` at
the same precision mode, exact invariants).  Expected: the literal model's error within its small
factor at every declared mode.

* Standard decode: ``fused_recurrent_gated_delta_rule_replayssm`` on linear d / k / g buffers
  (``[blocks, HV, L, V]``, ``[blocks, H, L, K]``, ``[blocks, HV, L]`` fp32); the flush is
  ``write_pos == L - 1`` inside the kernel.
* Speculative: ``gdn_replayssm_spec_decode`` (verify + flush launches) on the circular buffers of
  ``next_pow2(B + T')`` rows, ``commit_gdn_replayssm_spec`` / ``reset_gdn_replayssm_spec_cursors``.

Bridges (besides null block 0 / poisoned output scratch, ``_base.py``; both kernels write zeros
into padding rows' outputs): standard-decode cursors are per row (gathered from the adapter's
per-block cursor, advanced at commit: 0 after a flush, else +1); speculative cursors are per block
and moved by the fork's commit/reset kernels, ``num_accepted`` counting the bonus token; the fork's
reset starts the ring at 0, so ``reset(origin=...)`` writes the ring start into ``cache_base``;
tokens are packed ``mixed_qkv = [q | k | v]`` with ``query_start_loc`` (padding rows: no tokens;
the kernel reads spec_len = ``Q[r+1] - Q[r]`` per row, so packed calls pass their buffer and offsets
through, ragged calls and standard steps on the speculative slots are packed with each row's length,
``_base.py``; the flush flag is set at commit with T'max);
q / k are L2-normalised in the kernel (``use_qk_l2norm_in_kernel=True``), scale K^-1/2.  Launch
config: the fork's default ``nk = 2`` splits K into tiles of K / 2, below the 16 a ``tl.dot`` needs
at K = 16 (the tiny geometry): there the adapter asks for ``nk = 1`` through the fork's own
``override_replayssm_config`` / ``nk=`` (a launch choice, not numerics).

Modes: state in the state tensor's dtype (fp32 / bf16 / fp16), activations and d / k records in the
activation dtype, g in fp32.  The fold and readout ``tl.dot`` calls use Triton's default precision,
which for fp32 operands is tf32 on the GPU: with fp32 activations the kernels implement ``-tf32``
modes only (``s32a32-tf32``); with 16-bit activations the operands are 16-bit (exact products),
ieee.  Read from the code, for the GPU run: the speculative flush stores the new checkpoint after
``.to(mixed_qkv.dtype)``, i.e. rounded to bf16 with bf16 activations even in an fp32 state tensor.
"""

from __future__ import annotations

import contextlib

import torch

from replayssm.adapters._base import (
    default_dot_reason,
    dot_key_tile_reason,
    float_mode_reason,
    key_tile_splits,
    mixed_qkv,
)
from replayssm.adapters._block_records import BlockRecordsAdapter
from replayssm.adapters._vllm_source import launch_guard
from replayssm.ops.gdn.literal import GDNMath


class VllmGDNReplay(BlockRecordsAdapter):
    name = "vllm-replay"
    family = "gdn"
    kind = "replay"
    description = ("official ReplaySSM GDN (vLLM fork): fused_recurrent_replayssm standard decode; "
                   "gdn_replayssm_spec_decode speculative verify + commit + cursor reset")
    # Read in the fork: fused_recurrent_replayssm.py rounds beta = sigmoid(b).to(b.dtype) and both
    # kernels normalise q, k as u * (1.0 / sqrt(sum u^2 + 1e-6)); softplus threshold 20 (the defaults').
    conventions = {"standard": {"beta_rounded": True, "l2_form": "reciprocal"},
                   "speculative": {"l2_form": "reciprocal"}}
    # the speculative kernel takes query_start_loc (spec_len per row); a standard step on a speculative
    # slot is a one-token row of it (the speculative conventions)
    supports_packed_layout = True
    supports_ragged_windows = True
    supports_mixed_decode = True
    record_math = GDNMath

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "the fork's GDN replay kernel", ("ieee", "tf32")) or default_dot_reason(
            mode, "with fp32 activations its tl.dot calls run at Triton's default precision, tf32 on the GPU: "
                  "it implements s32a32-tf32, not ieee")

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):  # fused_recurrent_replayssm.py, gdn_replayssm_spec_decode.py
        return dot_key_tile_reason(geometry, "the fork's GDN replay kernels")

    def __init__(self, config):
        super().__init__(config)
        S = self.num_slots + 1
        self.delta_rule_params(config.params)
        self.state = torch.zeros((S, *self.state_shape), dtype=self.mode.state_dtype, device=self.device)
        self.d_cache, self.k_cache, self.g_cache = self.delta_rule_rows(self.decode.ring_rows)
        self.write_pos = torch.zeros(S, dtype=torch.int32, device=self.device)
        self.origin = torch.zeros(S, dtype=torch.int32, device=self.device)
        self.is_flush = torch.zeros(S, dtype=torch.int8, device=self.device)
        self.small_k = key_tile_splits(self.geometry.head_k_dim) == 1  # K tiles of K / 2 would be below 16

    def _config(self):
        """The fork's launch config, with nk = 1 where its default would tile K below 16."""
        if not self.small_k:
            return contextlib.nullcontext()
        cfg = self.modules["replayssm_config"]
        stack = contextlib.ExitStack()
        for key in ("gdn_spec_verify", "gdn_spec_flush"):
            bv, nw, _, ns = cfg.get_replayssm_config(key, max_spec_len=self.decode.window)
            stack.enter_context(cfg.override_replayssm_config(key, (bv, nw, 1, ns)))
        return stack

    # ---- the step calls ------------------------------------------------------------------------------
    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        blk, rows = self.blocks(slot_ids), self.active_rows(slot_ids)
        b = blk.index_select(0, rows).long()
        if self.decode.speculative:
            d = self.decode
            spec = self.modules["gdn_replayssm_spec_decode"]
            with launch_guard(self.device):
                spec.reset_gdn_replayssm_spec_cursors(self.write_pos, self.origin, self.is_flush,
                                                      (slot_ids >= 0).to(torch.int32), blk, d.lspec, d.window)
            if origin is not None:  # bridge: the fork's reset starts the ring at 0
                self.origin[b] = origin.index_select(0, rows).to(torch.int32)
        else:
            self.write_pos[b] = 0
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        if not self.decode.speculative and query_start_loc is not None:
            return self.standard_from_packed(slot_ids, inputs, out, query_start_loc, self.verify)
        ids, out = self.begin_serving_verify(slot_ids, inputs, out, window_lens, query_start_loc)
        g, d, R = self.geometry, self.decode, len(ids)
        HV, V = g.num_v_heads, g.head_v_dim
        blk, act = self.blocks(slot_ids), self.active_rows(slot_ids)
        if not d.speculative:
            tok = {k: v[:, 0] for k, v in inputs.items()}
            o = self.scratch(R, HV, V)
            fn = self.modules["fused_recurrent_replayssm"].fused_recurrent_gated_delta_rule_replayssm
            with launch_guard(self.device):
                fn(mixed_qkv(tok), tok["a"].contiguous(), tok["b"].contiguous(), self.A_log, self.dt_bias,
                   self.scale, self.state, self.d_cache, self.k_cache, self.g_cache, o, blk,
                   self.write_pos.index_select(0, blk.long()).contiguous(), use_qk_l2norm_in_kernel=True,
                   nk=1 if self.small_k else None)
            out[act, 0] = o.index_select(0, act)
        else:
            T = d.window
            tok, qsl, lens, put = self.pack_tokens(ids, inputs, window_lens, query_start_loc)
            o = self.scratch(sum(lens), HV, V)
            spec = self.modules["gdn_replayssm_spec_decode"]
            with launch_guard(self.device), self._config():
                spec.gdn_replayssm_spec_decode(
                    mixed_qkv(tok), tok["a"].contiguous(), tok["b"].contiguous(), self.A_log, self.dt_bias,
                    self.state, self.d_cache, self.k_cache, self.g_cache, o, qsl, blk, self.write_pos,
                    self.origin, self.is_flush, d.lspec, T, scale=self.scale, use_qk_l2norm_in_kernel=True,
                    null_block_id=0)
            put(o, out)
            self.end_verify(ids, lens)
            return out
        self.end_verify(ids)
        return out

    def timed_step(self, slot_ids, inputs, out, accepted):
        """The fork's launches alone on packed ``mixed_qkv`` (``_base.py``)."""
        g, d, R = self.geometry, self.decode, slot_ids.shape[0]
        HV, V, blk = g.num_v_heads, g.head_v_dim, self.blocks(slot_ids)
        if not d.speculative:
            n, pos = self.cursor_positions(blk, self.write_pos)
            tok = {k: v[:, 0].contiguous() for k, v in inputs.items()}
            mixed, o = mixed_qkv(tok), self.scratch(R, HV, V)
            fn, calls = self.modules["fused_recurrent_replayssm"].fused_recurrent_gated_delta_rule_replayssm, [n]

            def step():
                wp = pos[calls[0] % d.buffer][0]
                calls[0] += 1
                with launch_guard(self.device):
                    fn(mixed, tok["a"], tok["b"], self.A_log, self.dt_bias, self.scale, self.state, self.d_cache,
                       self.k_cache, self.g_cache, o, blk, wp, use_qk_l2norm_in_kernel=True,
                       nk=1 if self.small_k else None)
            return step
        self.no_padding(slot_ids, "a timed speculative step")
        T = d.window
        tok = {k: v.flatten(0, 1).contiguous() for k, v in inputs.items()}
        mixed, o = mixed_qkv(tok), self.scratch(R * T, HV, V)
        qsl = self.uniform_offsets(R)
        acc, spec = accepted.to(torch.int32), self.modules["gdn_replayssm_spec_decode"]

        def step():
            with launch_guard(self.device), self._config():
                spec.gdn_replayssm_spec_decode(
                    mixed, tok["a"], tok["b"], self.A_log, self.dt_bias, self.state, self.d_cache, self.k_cache,
                    self.g_cache, o, qsl, blk, self.write_pos, self.origin, self.is_flush, d.lspec, T,
                    scale=self.scale, use_qk_l2norm_in_kernel=True, null_block_id=0)
            spec.commit_gdn_replayssm_spec(self.write_pos, self.origin, self.is_flush, acc, blk, d.lspec, T,
                                           d.ring_rows)
        return step

    def commit_spec(self, blk, accepted):
        d, spec = self.decode, self.modules["gdn_replayssm_spec_decode"]
        with launch_guard(self.device):
            spec.commit_gdn_replayssm_spec(self.write_pos, self.origin, self.is_flush, accepted.to(torch.int32),
                                           blk, d.lspec, d.window, d.ring_rows)

    # ---- inspection ------------------------------------------------------------------------------------
    def _records(self):
        return self.block_records(d=self.d_cache, k=self.k_cache, g=self.g_cache)

    def ring_origins(self):
        return self.origin
