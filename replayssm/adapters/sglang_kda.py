"""Adapters for SGLang 0.5.23's KDA ReplaySSM kernels: ``sglang-replay`` (standard decode) and
``sglang-replay-fold`` (speculative decode), family kda.

Oracle: the validation engine (fp64 KDA recurrence on the accepted stream, the literal model of the
kernel's bookkeeping at the same precision mode, exact invariants).  Expected: the literal model's
error within its small factor at every declared mode.

SGLang keeps two bookkeepings for KDA, so they are two kernels (a kernel declares one policy):

* ``sglang-replay``, standard decode, the spec's rule: ``fused_recurrent_linear_replayssm_decode``
  with ``is_kda=True`` on linear d / k / g buffers ``[blocks, HV, L, V]``, ``[blocks, H, L, K]``,
  ``[blocks, HV, L, K]`` (g fp32, one log decay per key channel); the flush is ``write_pos == L - 1``
  inside the kernel (folds L - 1 records + the current token); cursors per row, advanced at commit
  (0 after a flush, else + 1), as for GDN (``sglang_gdn.py``).  Its speculative path does not exist.
* ``sglang-replay-fold``, speculative decode, ``fold-every-commit``
  (``kda_replayssm_spec_decode.py``): the verify is SGLang's KDA recurrent verify
  (``fused_sigmoid_gating_delta_rule_update``, ``is_kda=True``, ``disable_state_update=True``, no
  intermediate states, ``cache_ring=True``: it stores each draft token's raw v, raw (pre-norm) k,
  per-channel log gate and beta into a per-slot window of T' rows); ``commit_kda_replayssm_spec``
  replays the accepted prefix (the bonus token counted: our k as is; k = 0 folds nothing) from the
  checkpoint into the checkpoint, in place.  No history, no flush: ``write_pos`` is 0 before every
  verify.  Its standard decode is ``sglang-replay``.

Bridges (besides the ``_base.py`` slot bridge: slot s = block s + 1, null block 0):

* **Padding.**  The standard kernel takes ``-1`` for a padding row (and writes zeros to its output:
  the poisoned scratch keeps that out of our rows); the verify is given the active rows only
  (packed with ``cu_seqlens``, a draft count per row: the engine's packed calls pass through, ragged
  ones are packed with each row's length, ``_base.py``), the commit the null block 0 for padding rows (it skips them).
* **Gates in the kernels.**  ``a [.., HV, K]`` and ``dt_bias [HV, K]`` raw: the kernels compute
  ``g = -exp(A_log) softplus(a + dt_bias)`` per key channel (softplus ``log(1 + exp(x))`` up to 20),
  ``beta = sigmoid(b)``; q / k L2-normalised in the kernels, scale K^-1/2.
* **Records.**  Standard: d / k in the activation dtype, g fp32 (snapshot records, folded in fp64 by
  ``committed_state``).  Speculative: the raw window (v, k in the activation dtype: exact copies;
  g, beta fp32) is kept in the snapshot's ``extra``; with no committed history there are no records.
* **Launch config.**  ``nk`` splits K into tiles of K / nk >= 16 for ``tl.dot``: ``nk = 1`` where
  the default 2 would go below (K = 16, the tiny geometry).

Conventions, read from the code, and what is declared (``replayssm/conventions.py``).  Every kernel:
softplus ``log(1 + exp(x))`` up to the threshold 20 (the standard kernel's ``SOFTPLUS_THRESHOLD``,
the verify's ``softplus_threshold`` argument, which the adapter passes as 20), L2 eps 1e-6 inside
the square root.  The standard kernel normalises q / k in the reciprocal form
``u * (1 / sqrt(sum u^2 + 1e-6))`` and rounds beta to the gate input's dtype
(``sigmoid(b).to(b.dtype)``): declared, ``beta_rounded`` and ``l2_form = "reciprocal"`` (at fp32
activations the rounding is a no-op).  Speculative: the verify normalises in the reciprocal form with
beta ``1 / (1 + exp(-b))`` in fp32, the commit's fold (which makes the state) in the division form
(its docstring's "bitwise clone" is of FLA's recurrent kernel, not of SGLang's own verify): the
declared recurrence is the state's, the defaults; the verify's outputs differ from it by an fp32 ulp
of k, inside the tolerance (docs/findings.md, KDA).

Modes.  State in the state tensor's dtype (a plain cast, round to nearest).  Standard: the
reconstruction ``tl.dot`` runs at Triton's default precision on operands in the output dtype, with
fp32 activations tf32 on the GPU: ``s32a32-tf32`` (under the interpreter an fp32 dot, inside the
tf32 bound); with 16-bit activations 16-bit operands (exact products, fp32 sums): ieee modes; the
decay-weighted keys ``(k * decay).to(act dtype)`` are rounded before that dot (at s32a16 bf16 fold
weights, as SGLang's GDN standard decode: the GPU run says what that costs).  Speculative: no dots
(fp32 elementwise recurrence), any float state and activations, ieee.

Timed steps (the bench, ``_base.py``): the launches alone on tokens packed once (``mixed_qkv``;
``cu_seqlens`` of T' per row), standard ``write_pos`` from the precomputed cursor positions.
"""

from __future__ import annotations

import contextlib

import torch

from replayssm.adapters._base import (
    SlotAdapter,
    default_dot_reason,
    dot_key_tile_reason,
    float_mode_reason,
    key_tile_splits,
    mixed_qkv,
)
from replayssm.adapters._block_records import BlockRecordsAdapter
from replayssm.adapters._fold_every_commit import FoldEveryCommitAdapter
from replayssm.adapters._vllm_source import launch_guard
from replayssm.adapters.sglang_gdn import STANDARD_FP32_REASON
from replayssm.ops.kda.literal import KDAMath


class _SGLangKDA(SlotAdapter):
    family = "kda"
    kind = "replay"
    loader = None  # set by replayssm.adapters.sglang.load(): returns the kernel modules
    interpreter_loops = None  # set by load(): replayssm.adapters.sglang.interpreter_loops

    def __init__(self, config):
        super().__init__(config)
        self.mods = type(self).loader()
        S = self.num_slots + 1
        self.delta_rule_params(config.params)
        self.state = torch.zeros((S, *self.state_shape), dtype=self.mode.state_dtype, device=self.device)
        self.write_pos = torch.zeros(S, dtype=torch.int32, device=self.device)

    def _reset_rows(self, slot_ids, initial_state, origin):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        b = self.blocks(slot_ids).index_select(0, rows).long()
        self.write_pos[b] = 0
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.mark_reset(ids)


class SGLangKDAReplay(_SGLangKDA, BlockRecordsAdapter):
    name = "sglang-replay"
    decodes = ("standard",)
    description = "SGLang 0.5.23 ReplaySSM KDA standard decode: fused_recurrent_linear_replayssm (is_kda=True)"
    # Read in fused_recurrent_linear_replayssm.py (IS_KDA branch): beta = sigmoid(b).to(b.dtype),
    # q, k * (1 / sqrt(sum u^2 + 1e-6)), softplus threshold 20.
    conventions = {"beta_rounded": True, "l2_form": "reciprocal"}
    record_math = KDAMath

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):
        return dot_key_tile_reason(geometry, "SGLang 0.5.23's fused_recurrent_linear_replayssm")

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if decode.speculative:
            return ("SGLang's KDA speculative decode keeps fold-every-commit books: it is the kernel "
                    "'sglang-replay-fold'")
        return (float_mode_reason(mode, "SGLang's KDA replay kernel", ("ieee", "tf32"))
                or default_dot_reason(mode, STANDARD_FP32_REASON))

    def __init__(self, config):
        super().__init__(config)
        self.d_cache, self.k_cache, self.g_cache = self.delta_rule_rows(self.decode.ring_rows, key_gate=True)

    def reset(self, slot_ids, initial_state=None, origin=None):
        self._reset_rows(slot_ids, initial_state, origin)

    def _launch(self, mixed, tok, o, rows, write_pos):
        fn = self.mods["fused_recurrent_linear_replayssm"].fused_recurrent_linear_replayssm_decode
        with launch_guard(self.device):
            fn(mixed, tok["a"], tok["b"], self.A_log, self.dt_bias, self.scale, self.state, self.d_cache, self.k_cache,
               self.g_cache, o, rows, write_pos, use_qk_l2norm_in_kernel=True, is_kda=True,
               nk=key_tile_splits(self.geometry.head_k_dim))

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        g, R = self.geometry, slot_ids.shape[0]
        blk, act = self.blocks(slot_ids), self.active_rows(slot_ids)
        tok = {k: v[:, 0].contiguous() for k, v in inputs.items()}
        o = self.scratch(R, 1, g.num_v_heads, g.head_v_dim)
        self._launch(mixed_qkv(tok), tok, o, torch.where(slot_ids >= 0, blk, -1).contiguous(),
                     self.write_pos.index_select(0, blk.long()).contiguous())
        out[act] = o.index_select(0, act)
        self.end_verify(ids)
        return out

    def timed_step(self, slot_ids, inputs, out, accepted):
        """The kernel's launch alone on ``mixed_qkv`` packed once; call n at cursor position n mod L
        (``_base.py``)."""
        self.no_padding(slot_ids)
        g, L, blk = self.geometry, self.decode.buffer, self.blocks(slot_ids)
        n, pos = self.cursor_positions(blk, self.write_pos)
        tok = {k: v[:, 0].contiguous() for k, v in inputs.items()}
        mixed, o, calls = mixed_qkv(tok), self.scratch(slot_ids.shape[0], 1, g.num_v_heads, g.head_v_dim), [n]

        def step():
            wp = pos[calls[0] % L][0]
            calls[0] += 1
            self._launch(mixed, tok, o, blk, wp)
        return step

    def _records(self):
        return self.block_records(d=self.d_cache, k=self.k_cache, g=self.g_cache)


class SGLangKDAReplayFold(_SGLangKDA, FoldEveryCommitAdapter):
    name = "sglang-replay-fold"
    decodes = ("speculative",)
    bookkeeping = "fold-every-commit"
    zero_accept = "noop"
    # the verify is varlen (cu_seqlens: each row's draft count, its raw window rows 0..T'_r-1): packed calls
    # pass through, ragged ones are packed with each row's length (_base.py); speculative only
    supports_packed_layout = True
    supports_ragged_windows = True
    description = ("SGLang 0.5.23 ReplaySSM KDA speculative decode: recurrent verify writing the raw window, "
                   "commit_kda_replayssm_spec folding the accepted prefix (fold-every-commit)")
    # The state's recurrence, read in the commit's fold: division-form L2 norm, fp32 beta: the defaults.
    conventions: dict = {}

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if not decode.speculative:
            return "SGLang's KDA standard decode keeps the spec's linear buffer: it is the kernel 'sglang-replay'"
        return float_mode_reason(mode, "SGLang's KDA verify + commit fold")

    def __init__(self, config):
        super().__init__(config)
        T = self.decode.window
        self.rawv, self.rawk, self.gk = self.delta_rule_rows(T, key_gate=True)
        self.beta = torch.zeros((self.num_slots + 1, self.geometry.num_v_heads, T), dtype=torch.float32,
                                device=self.device)

    def reset(self, slot_ids, initial_state=None, origin=None):
        self._reset_rows(slot_ids, initial_state, origin)

    def _launch_verify(self, tok, rows, qsl):
        """The recurrent verify on packed tokens ``tok [1, n T', ...]`` (blocks ``rows``, ``cu_seqlens`` qsl)."""
        fn = self.mods["fused_sigmoid_gating_recurrent"].fused_sigmoid_gating_delta_rule_update
        with launch_guard(self.device):
            return fn(self.A_log, tok["a"], self.dt_bias, 1.0, 20.0, tok["q"], tok["k"], tok["v"], tok["b"],
                      self.state, rows, scale=self.scale, use_qk_l2norm_in_kernel=True, cu_seqlens=qsl, is_kda=True,
                      disable_state_update=True, cache_ring=True, replayssm_rawv=self.rawv, replayssm_rawk=self.rawk,
                      replayssm_g=self.gk, replayssm_beta=self.beta)

    def _launch_commit(self, blk, accepted, qsl=None):  # the commit kernel takes no offsets
        spec = self.mods["kda_replayssm_spec_decode"]
        loops = type(self).interpreter_loops(spec) if self.device.type == "cpu" else contextlib.nullcontext()
        with launch_guard(self.device), loops:
            spec.commit_kda_replayssm_spec(self.state, self.rawv, self.rawk, self.gk, self.beta, blk, accepted,
                                           self.decode.window, self.geometry.num_k_heads, use_qk_l2norm_in_kernel=True,
                                           null_block_id=0)

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        self._launch_commit(self.blocks(slot_ids), accepted.to(torch.int32).contiguous())

    def snapshot_extra(self):
        return {"rawv": self.rawv[1:].cpu().clone(), "rawk": self.rawk[1:].cpu().clone(),
                "g": self.gk[1:].cpu().clone(), "beta": self.beta[1:].cpu().clone()}
