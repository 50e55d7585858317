"""Adapter for SGLang 0.5.23's ReplaySSM GDN kernels: ``sglang-replay`` (family gdn).

Oracle: the validation engine (fp64 gated delta rule on the accepted stream, ``literal-replay`` at
the same precision mode, exact invariants).  Expected: the literal model's error within its small
factor (or the fp64 running-error bound) at every declared mode.

* Standard decode: ``fused_recurrent_linear_replayssm_decode`` (GDN branch, ``is_kda=False``) on
  linear d / k / g buffers ``[blocks, HV, L, V]``, ``[blocks, H, L, K]``, ``[blocks, HV, L]`` (fp32);
  the flush is ``write_pos == L - 1`` inside the kernel (folds L - 1 records + the current token).
* Speculative: ``gdn_replayssm_spec_decode`` (launch mode ``both``: the exact fold of the raw
  history into the checkpoint on flush rows, the verify of non-flush rows, the flush-output of
  flush rows) on circular buffers, and ``commit_gdn_replayssm_spec`` (cursor advance, the
  early-flush rule ``write_pos + 2 T' > L``: the spec's rule with L = B + T').  This is the
  wrapper's default path.  SGLang's server runs another (``gdn_backend.py``, ``spec_utils.py``):
  ``launch_mode="verify"`` and the fold at commit (``commit_gdn_replayssm_circular``: compact
  D / K high+low parts), for an fp32 checkpoint when the capacity rule fires, for a 16-bit one after
  every commit (``fold_every_commit``) with the ring base moving: a bookkeeping the suite's policies
  do not yet describe, so it is not adapted here.

Bridges (besides the poisoned output scratch of ``_base.py``):

* **Padding.**  The standard kernel takes the padding slot as ``-1`` (``state_idx < 0``) and writes
  zeros into that row's output; the speculative kernels take null block 0 (``<= null_block_id``).
  The adapter keeps ``num_slots + 1`` blocks (slot s = block s + 1) for both and passes ``-1``
  (standard) or ``0`` (speculative) for padding rows.
* **Standard-decode cursors are per row** (``write_pos [B]``, advanced by the caller: the kernel's
  docstring): one device cursor per block, gathered per row before a launch, advanced at commit
  (``0`` after a flush, else ``+1``).
* **Speculative cursors are request-keyed** (``replay_indices``) while the checkpoint is keyed by
  physical block (``ssm_state_indices``): both are our block, so one slot is one request.  The
  accepted count includes the bonus token: our ``accepted`` k as is.  SGLang has no cursor-reset
  kernel (its pool zeroes a new request's cursors): ``reset`` writes ``write_pos = 0``,
  ``cache_base = origin`` (0 by default) and the flush flag of ``write_pos = 0`` on the host side.
* **The ring is its logical threshold.**  The circular cache must be a power of two and the
  early-flush rule compares with the same length, so B + T' must be a power of two (e.g. T' = 4,
  B = 12); other buffers are refused.
* **Split, packed tokens.**  q / k / v go in split (``[tokens, H, K]``, ``[tokens, HV, V]``), packed
  per row with ``query_start_loc`` (padding rows: no tokens; spec_len per row, so the engine's packed
  calls pass through and ragged calls and standard steps on the speculative slots are packed with each
  row's length, ``_base.py``; the early-flush flag is set at commit with T'max); the standard kernel takes packed
  ``mixed_qkv = [q | k | v]``.  q / k are L2-normalised in the kernels, scale K^-1/2.
* **Records.**  d / k in the activation dtype, g in fp32; the speculative path's raw v / raw k (in
  the activation dtype: exact) and beta (fp32) feed its exact fold and are kept in the snapshot's
  ``extra``; the snapshot's records are d / k / g (what ``committed_state`` folds in fp64).
* **Launch config.**  ``nk`` splits K into tiles of K / nk, which must be >= 16 for ``tl.dot``: the
  adapter asks for ``nk = 1`` where the default (2) would go below (K = 16, the tiny geometry).

Modes, read from the code.  State in the state tensor's dtype (a plain cast, round to nearest).
Standard: its reconstruction ``tl.dot`` runs at Triton's default precision on operands in the
output dtype: with fp32 activations tf32 on the GPU (``s32a32-tf32`` only), with 16-bit activations
16-bit operands (exact products: ieee modes); note that ``(d * decay).to(act dtype)`` rounds the
decay-weighted records to the activation dtype before the fold and ``beta`` is rounded to the
gate input's dtype (bf16 at s32a16): the GPU run says what that costs.  Speculative: an fp32
checkpoint takes fp32 dot operands at ``dot_precision`` (the wrapper's argument: ``ieee`` or
``tf32`` from the mode), with any float activations; a 16-bit checkpoint is cast to the key dtype
for its dots, so it is declared only with activations of the same dtype (ieee).
"""

from __future__ import annotations

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

# the refusal of ieee at fp32 activations by the standard kernels of SGLang's GDN and KDA (sglang_kda.py)
STANDARD_FP32_REASON = ("with fp32 activations its reconstruction tl.dot runs at Triton's default precision, tf32 "
                        "on the GPU: standard decode implements s32a32-tf32, not ieee")


def _standard_reason(mode) -> str | None:
    return default_dot_reason(mode, STANDARD_FP32_REASON)


def _spec_reason(mode, decode) -> str | None:
    if decode.ring_rows != decode.lspec:
        return (f"SGLang's circular cache is its early-flush threshold and a power of two: B + T' must be a "
                f"power of two (got B + T' = {decode.lspec})")
    if mode.state != "fp32" and mode.act != mode.state:
        return (f"a {mode.state} checkpoint is cast to the key dtype ({mode.act}) for its dots: declared only "
                f"with {mode.state} activations")
    if mode.state != "fp32" and mode.dot != "ieee":
        return "a 16-bit checkpoint's dots take 16-bit operands (exact products): ieee modes only"
    return None


class SGLangGDNReplay(BlockRecordsAdapter):
    name = "sglang-replay"
    family = "gdn"
    kind = "replay"
    description = ("SGLang 0.5.23 ReplaySSM GDN: fused_recurrent_linear_replayssm standard decode; "
                   "gdn_replayssm_spec_decode speculative verify + commit_gdn_replayssm_spec")
    loader = None  # set by replayssm.adapters.sglang.load(): returns the kernel modules
    # the speculative kernel reads spec_len = query_start_loc[r+1] - query_start_loc[r] per row (its padding
    # lanes clamped): packed calls pass through, ragged ones and standard steps on speculative slots are
    # packed with each row's length (_base.py)
    supports_packed_layout = True
    supports_ragged_windows = True
    supports_mixed_decode = True
    record_math = GDNMath

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):
        return dot_key_tile_reason(geometry, "SGLang 0.5.23's GDN replay kernels")

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        reason = float_mode_reason(mode, "SGLang's GDN replay kernel", ("ieee", "tf32"))
        if reason:
            return reason
        return _spec_reason(mode, decode) if decode.speculative else _standard_reason(mode)

    def __init__(self, config):
        super().__init__(config)
        self.mods = type(self).loader()
        S, rows, z = self.num_slots + 1, self.decode.ring_rows, dict(device=self.device)
        self.delta_rule_params(config.params)
        self.state = torch.zeros((S, *self.state_shape), dtype=self.mode.state_dtype, **z)
        self.d_cache, self.k_cache, self.g_cache = self.delta_rule_rows(rows)
        if self.decode.speculative:
            self.rawv, self.rawk, self.beta = self.delta_rule_rows(rows)
        self.write_pos = torch.zeros(S, dtype=torch.int32, **z)
        self.cache_base = torch.zeros(S, dtype=torch.int32, **z)
        self.is_flush = torch.zeros(S, dtype=torch.int8, **z)
        self.nk = key_tile_splits(self.geometry.head_k_dim)

    # ---- the step calls ------------------------------------------------------------------------------
    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        b = self.blocks(slot_ids).index_select(0, rows).long()
        self.write_pos[b] = 0
        self.cache_base[b] = 0 if origin is None else origin.index_select(0, rows).to(torch.int32)
        self.is_flush[b] = int(self.decode.speculative and self.decode.is_flush(0))
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        if not self.decode.speculative and query_start_loc is not None:
            return self.standard_from_packed(slot_ids, inputs, out, query_start_loc, self.verify)
        ids, out = self.begin_serving_verify(slot_ids, inputs, out, window_lens, query_start_loc)
        lens = None
        if self.decode.speculative:
            lens = self._verify_spec(slot_ids, self.pack_tokens(ids, inputs, window_lens, query_start_loc), out)
        else:
            self._verify_standard(slot_ids, inputs, out)
        self.end_verify(ids, lens)
        return out

    def _verify_standard(self, slot_ids, inputs, out):
        g, R = self.geometry, slot_ids.shape[0]
        blk, act = self.blocks(slot_ids), self.active_rows(slot_ids)
        tok = {k: v[:, 0] for k, v in inputs.items()}
        mixed = mixed_qkv(tok)
        o = self.scratch(R, 1, g.num_v_heads, g.head_v_dim)
        fn = self.mods["fused_recurrent_linear_replayssm"].fused_recurrent_linear_replayssm_decode
        with launch_guard(self.device):
            fn(mixed, tok["a"].contiguous(), tok["b"].contiguous(), self.A_log, self.dt_bias, self.scale, self.state,
               self.d_cache, self.k_cache, self.g_cache, o, torch.where(slot_ids >= 0, blk, -1).contiguous(),
               self.write_pos.index_select(0, blk.long()).contiguous(), use_qk_l2norm_in_kernel=True, nk=self.nk)
        out[act] = o.index_select(0, act)

    def _verify_spec(self, slot_ids, packed, out) -> list[int]:
        """The speculative kernel on ``packed`` (``pack_tokens``); returns the rows' window lengths."""
        g, d = self.geometry, self.decode
        T, HV, V = d.window, g.num_v_heads, g.head_v_dim
        blk = self.blocks(slot_ids)
        tok, qsl, lens, put = packed
        tok = {k: v.contiguous() for k, v in tok.items()}
        o = self.scratch(sum(lens), HV, V)
        spec = self.mods["gdn_replayssm_spec_decode"]
        with launch_guard(self.device):
            spec.gdn_replayssm_spec_decode(
                tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], self.A_log, self.dt_bias, self.state, self.d_cache,
                self.k_cache, self.g_cache, self.rawv, self.rawk, self.beta, o, qsl, blk, blk, self.write_pos,
                self.cache_base, self.is_flush, d.lspec, T, scale=self.scale, use_qk_l2norm_in_kernel=True,
                null_block_id=0, nk=self.nk, nk_flush=self.nk, dot_precision=self.mode.dot)
        put(o, out)
        return lens

    def commit_spec(self, blk, accepted):
        d, spec = self.decode, self.mods["gdn_replayssm_spec_decode"]
        with launch_guard(self.device):
            spec.commit_gdn_replayssm_spec(self.write_pos, self.cache_base, self.is_flush,
                                           accepted.to(torch.int32).contiguous(), blk, d.lspec, d.window,
                                           null_block_id=0)

    # ---- inspection ------------------------------------------------------------------------------------
    def _records(self):
        return self.block_records(d=self.d_cache, k=self.k_cache, g=self.g_cache)

    def ring_origins(self):
        return self.cache_base

    def snapshot_extra(self):
        return ({"rawv": self.rawv[1:].cpu().clone(), "rawk": self.rawk[1:].cpu().clone(),
                 "beta": self.beta[1:].cpu().clone()} if self.decode.speculative else {})
