"""Adapter for SGLang 0.5.23's GDN ReplaySSM speculative decode as its server drives it:
``sglang-replay-serving`` (family gdn, speculative decode, bookkeeping ``fold-at-commit``).

Oracle: the validation engine (fp64 gated delta rule on the accepted stream, ``literal-replay-
fold-at-commit`` at the same precision mode, exact invariants under the declared policy).
Expected: the literal model's error within its small factor (or the fp64 running-error bound).

What the server runs (``srt/layers/attention/linear/gdn_backend.py::_replayssm_target_verify``,
``srt/speculative/spec_utils.py``, ``srt/mem_cache/memory_pool.py``), and so this adapter:

* **verify** ``gdn_replayssm_spec_decode(..., launch_mode="verify")``: the verify launch only (no
  exact fold, no flush-output launch); it reads the checkpoint and the ring's committed d / k / g
  history and writes the window's compact records at ring rows ``(cache_base + write_pos + t) &
  (L - 1)``.  The pool's ``is_flush`` is 0 at every verify (the commit clears it), so no verify
  flushes.  Records in the activation dtype (g fp32); with 16-bit activations the pool also keeps
  low parts (``d - d_hi``, ``k_norm - k_hi``: ``rawv`` / ``rawk`` with ``beta = None``), none with fp32.
* **commit** ``commit_gdn_replayssm_spec`` (``write_pos += k``; ``is_flush = write_pos + 2 T' > L``,
  or ``write_pos > 0`` with ``fold_every_commit``, which the server sets for a non-fp32 checkpoint)
  then ``commit_gdn_replayssm_circular`` (flagged rows: fold all ``write_pos`` held records, high +
  low parts, into the checkpoint; ``cache_base += write_pos``; ``write_pos = is_flush = 0``).
  That is the ``fold-at-commit`` policy with threshold B + T' = L (a power of two: the ring is the
  threshold) and, with ``fold_every_commit``, B = T' (its rule ``write_pos > 0`` equals ``write_pos
  + 2 T' > 2 T'``; the ring is then next_pow2(2 T')).  k = 0 moves nothing (``zero_accept="noop"``).

Bridges (besides the poisoned output scratch of ``_base.py``): **padding** is the server's
(slot ids as mamba slots, ``-1`` for padding, ``null_block_id=-1``); the cursors are request-keyed
and the checkpoint block-keyed, both our slot; **layers**: the commit kernels take
``[layers, slots, ...]`` tensors, the adapter keeps one layer; **tokens** packed per row with
``query_start_loc`` (padding rows: no tokens; spec_len per row: the engine's packed calls pass through,
ragged ones are packed with each row's length, ``_base.py``); **reset** zeroes the cursors as the pool does for a
fresh request (``cache_base = origin``).  Option ``fold_every_commit`` (bool; default: the server's
choice, ``state dtype != fp32``) exercises that cursor path with an fp32 checkpoint on CPU.

Modes, read from the code.  The commit fold's ``tl.dot`` runs at Triton's default precision: with
fp32 activations tf32 on the GPU (``s32a32-tf32`` only), with 16-bit ones 16-bit hi / lo operands
(exact products).  Verify dots as for ``sglang-replay`` (``dot_precision`` from the mode for an fp32
checkpoint; a 16-bit checkpoint is cast to the key dtype: same-dtype activations, ieee).
"""

from __future__ import annotations

import torch

from replayssm.adapters._base import SlotAdapter, dot_key_tile_reason, float_mode_reason
from replayssm.adapters._vllm_source import launch_guard
from replayssm.interface import KernelSnapshot
from replayssm.ops.gdn.literal import GDNMath


def _fold_every(mode, options) -> bool:
    return bool(options.get("fold_every_commit", mode.state != "fp32"))


class SGLangGDNReplayServing(SlotAdapter):
    name = "sglang-replay-serving"
    family = "gdn"
    kind = "replay"
    decodes = ("speculative",)
    bookkeeping = "fold-at-commit"
    zero_accept = "noop"
    # the verify launch reads spec_len per row from query_start_loc: packed calls pass through, ragged ones
    # are packed with each row's length (_base.py); speculative decode only, so no standard steps
    supports_packed_layout = True
    supports_ragged_windows = True
    accepted_options = ("fold_every_commit",)
    description = ("SGLang 0.5.23 ReplaySSM GDN, its serving path: gdn_replayssm_spec_decode(launch_mode='verify') "
                   "+ commit_gdn_replayssm_spec + commit_gdn_replayssm_circular (fold at commit)")
    loader = None  # set by replayssm.adapters.sglang.load(): returns the kernel modules

    @classmethod
    def check_options(cls, options):
        super().check_options(options)
        if not isinstance(options.get("fold_every_commit", False), bool):
            raise ValueError(f"options.fold_every_commit: expected a bool, got {options['fold_every_commit']!r}")

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):
        return dot_key_tile_reason(geometry, "SGLang 0.5.23's GDN replay kernels")

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        reason = float_mode_reason(mode, "SGLang's GDN replay kernel", ("ieee", "tf32"))
        if reason:
            return reason
        if not decode.speculative:
            return "SGLang's server runs this path for speculative verify only"
        if _fold_every(mode, options):
            if decode.buffer != decode.window:
                return (f"fold_every_commit folds after every commit: the fold-at-commit rule with B = T' "
                        f"(got B = {decode.buffer}, T' = {decode.window})")
        elif decode.ring_rows != decode.lspec:
            return (f"its ring length is its fold threshold and a power of two: B + T' must be a power of two "
                    f"(got B + T' = {decode.lspec})")
        if mode.act == "fp32" and mode.dot != "tf32":
            return ("with fp32 activations its commit fold's tl.dot runs at Triton's default precision, tf32 on "
                    "the GPU: s32a32-tf32, not ieee")
        if mode.state != "fp32" and (mode.act != mode.state or mode.dot != "ieee"):
            return (f"a {mode.state} checkpoint is cast to the key dtype for its dots (16-bit operands): declared "
                    f"only with {mode.state} activations and ieee")
        if mode.act != "fp32" and decode.ring_rows < 16:
            # on an H200 (docs/findings.md): Triton refuses the fold's 16-bit dot over an 8-row ring
            return (f"with {mode.act} records its commit fold is a tl.dot over the ring's rows, which Triton "
                    f"compiles for the GPU only from 16 rows (the server's ring, linear_replayssm_cache_len, "
                    f"defaults to 16): got a ring of {decode.ring_rows} rows")
        return None

    def __init__(self, config):
        super().__init__(config)
        self.mods = type(self).loader()
        g, m, S = self.geometry, self.mode, self.num_slots
        p = {k: v.to(self.device, torch.float32).contiguous() for k, v in config.params.items()}
        self.A_log, self.dt_bias = p["A_log"], p["dt_bias"]
        self.params64 = {k: v.double() for k, v in p.items()}
        self.scale = g.head_k_dim ** -0.5
        self.fold_every = _fold_every(m, config.options)
        L = self.decode.ring_rows
        H, HV, K, V = g.num_k_heads, g.num_v_heads, g.head_k_dim, g.head_v_dim
        z = dict(device=self.device)
        self.state5 = torch.zeros((1, S, *self.state_shape), dtype=m.state_dtype, **z)
        self.d5 = torch.zeros((1, S, HV, L, V), dtype=m.act_dtype, **z)
        self.k5 = torch.zeros((1, S, H, L, K), dtype=m.act_dtype, **z)
        self.g5 = torch.zeros((1, S, HV, L), dtype=torch.float32, **z)
        lo = m.act != "fp32"  # the pool keeps low parts for 16-bit rings
        self.dlo5 = torch.zeros_like(self.d5) if lo else None
        self.klo5 = torch.zeros_like(self.k5) if lo else None
        self.write_pos = torch.zeros(S, dtype=torch.int32, **z)
        self.cache_base = torch.zeros(S, dtype=torch.int32, **z)
        self.is_flush = torch.zeros(S, dtype=torch.int8, **z)
        self.nk = 1 if (1 << max(0, (K - 1).bit_length())) // 2 < 16 else 2

    def _ids(self, slot_ids):
        return slot_ids.to(device=self.device, dtype=torch.int32).contiguous()

    # ---- the step calls ------------------------------------------------------------------------------
    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        s = slot_ids.index_select(0, rows).long()
        self.write_pos[s], self.is_flush[s] = 0, 0
        self.cache_base[s] = 0 if origin is None else origin.index_select(0, rows).to(self.device, torch.int32)
        self.state5[0, s] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state5)
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        ids, out = self.begin_serving_verify(slot_ids, inputs, out, window_lens, query_start_loc)
        d, g = self.decode, self.geometry
        T, HV, V = d.window, g.num_v_heads, g.head_v_dim
        tok, qsl, lens, put = self.pack_tokens(ids, inputs, window_lens, query_start_loc)
        tok = {k: v.contiguous() for k, v in tok.items()}
        o = self.scratch(sum(lens), HV, V)
        sid = self._ids(slot_ids)
        lo = self.dlo5 is not None
        with launch_guard(self.device):
            self.mods["gdn_replayssm_spec_decode"].gdn_replayssm_spec_decode(
                tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], self.A_log, self.dt_bias, self.state5[0],
                self.d5[0], self.k5[0], self.g5[0], self.dlo5[0] if lo else None, self.klo5[0] if lo else None,
                None, o, qsl, sid, sid, self.write_pos, self.cache_base, self.is_flush, d.ring_rows, T,
                scale=self.scale, use_qk_l2norm_in_kernel=True, null_block_id=-1, nk=self.nk,
                launch_mode="verify", dot_precision=self.mode.dot)
        put(o, out)
        self.end_verify(ids, lens)
        return out

    def commit(self, slot_ids, accepted):
        self.begin_commit(slot_ids, accepted)
        sid, acc = self._ids(slot_ids), accepted.to(device=self.device, dtype=torch.int32).contiguous()
        spec = self.mods["gdn_replayssm_spec_decode"]
        with launch_guard(self.device):
            spec.commit_gdn_replayssm_spec(self.write_pos, self.cache_base, self.is_flush, acc, sid,
                                           self.decode.ring_rows, self.decode.window,
                                           fold_every_commit=self.fold_every, null_block_id=-1)
            spec.commit_gdn_replayssm_circular(
                checkpoint_state=self.state5, d_cache=self.d5, k_cache=self.k5, g_cache=self.g5,
                d_residual_cache=self.dlo5, k_residual_cache=self.klo5, state_batch_indices=sid,
                replay_indices=sid, write_pos=self.write_pos, cache_base=self.cache_base, is_flush=self.is_flush,
                accept_lens=acc, null_block_id=-1)

    # ---- inspection ------------------------------------------------------------------------------------
    def _records(self) -> dict[str, torch.Tensor]:
        """Per-slot ``[S, L, heads, dim]`` records: d / k (+ their low parts) and g."""
        rec = {"d": self.d5[0].permute(0, 2, 1, 3), "k": self.k5[0].permute(0, 2, 1, 3),
               "g": self.g5[0].permute(0, 2, 1)}
        if self.dlo5 is not None:
            rec.update(d_lo=self.dlo5[0].permute(0, 2, 1, 3), k_lo=self.klo5[0].permute(0, 2, 1, 3))
        return rec

    def checkpoint_state(self, slot_ids):
        return self.per_slot(slot_ids, lambda s: self.state5[0, s].double())

    def committed_state(self, slot_ids):
        """Checkpoint + the held d / k / g records (high + low parts) folded in fp64."""
        rec = self._records()

        def fold(s):
            idx = self.hist_rows(s, int(self.write_pos[s]), int(self.cache_base[s]))
            h = {k: v[s].index_select(0, idx).double() for k, v in rec.items()}
            hist = {"d": h["d"] + h.get("d_lo", 0), "k": h["k"] + h.get("k_lo", 0), "g": h["g"]}
            return GDNMath().fold(self.state5[0, s].double(), hist, self.params64, self.mode)
        return self.per_slot(slot_ids, fold)

    def snapshot(self):
        return KernelSnapshot(
            checkpoint=self.state5[0].cpu().clone(), checkpoint_scale=None,
            records={k: v.cpu().clone() for k, v in self._records().items()},
            write_pos=self.write_pos.cpu().to(torch.int64), origin=self.cache_base.cpu().to(torch.int64),
            is_flush=self.is_flush.cpu() != 0, extra={})


__all__ = ["SGLangGDNReplayServing"]
