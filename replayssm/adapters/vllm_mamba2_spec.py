"""The official ReplaySSM Mamba-2 speculative kernels (vLLM fork) as ``vllm-replay``'s speculative
decode: ``selective_state_update_replayssm_spec`` + ``commit_replayssm_spec`` +
``reset_replayssm_spec_cursors`` (loaded by :mod:`replayssm.adapters.vllm`, never copied); its
standard decode is ``vllm_mamba2.py``'s output_only route.

Oracle: the validation engine (fp64 recurrence on the accepted stream, the literal models at the
same precision mode, exact invariants).  Expected: the literal model's error within its small
factor at every mode the kernel declares; anything else is a finding.

Bridges (besides null block 0 / poisoned output scratch, ``_base.py``, and the standard decode's,
``vllm_mamba2.py``):

* **Speculative cursors are per block** and moved by the fork's own commit / reset kernels.
  ``num_accepted_tokens`` includes the bonus token: our ``accepted`` k (1..T') as is.  The fork's
  reset always starts the ring at row 0; our ``reset(origin=...)`` then writes the given ring start
  into the block's ``post_conv_state_pos`` (vLLM never re-bases an admitted sequence's ring; the
  engine does, to reach the wrap-around phases).
* **Packed tokens.**  The speculative kernel takes ``query_start_loc`` and packed
  ``conv_out = [x | B | C]`` rows (``[tokens, H P + 2 G N]``) with raw ``dt``; padding rows get no
  tokens.  Records: ``x | B`` in the post-conv ring (activation dtype), *raw* dt in fp32 (the
  kernel applies bias and softplus when it reads them).
  Packed calls pass their buffer and offsets through as given; ragged calls (``window_lens``) and
  standard steps on the speculative slots (one-token inputs) are packed with each row's own length
  (``_base.py``), the kernel reading spec_len = ``Q[r+1] - Q[r]`` per row; its flush flag is set at
  commit with T'max (``write_pos + 2 T' > B + T'``), the spec's rule for ragged windows.

Precision: the speculative kernel reads the checkpoint out with ``tl.dot(...,
input_precision="tf32")`` when activations are 16-bit ("tf32x3" ~ fp32 with fp32 activations), so
with bf16/fp16 activations it claims only ``-tf32`` modes.
"""

from __future__ import annotations

import torch

from replayssm.adapters._base import float_mode_reason, triton_interpreted
from replayssm.adapters._vllm_source import launch_guard
from replayssm.adapters.vllm_mamba2 import _VllmMamba2ReplayStandard
from replayssm.ops.mamba2.literal import Mamba2Math
from replayssm.ops.mamba2.naive import softplus


def _spec_dot_reason(mode, decode):
    if decode.speculative and mode.act != "fp32" and mode.dot != "tf32":
        return (f"with {mode.act} activations the speculative kernel reads the checkpoint out with a tf32 "
                f"tl.dot: it implements the -tf32 form of this mode (e.g. s32a16-tf32), not {mode.dot}")
    if decode.speculative and mode.act == "fp32" and mode.dot != "ieee":
        return "with fp32 activations the speculative kernel reads out with tf32x3 dots (fp32): ieee modes only"
    return None


class VllmMamba2Replay(_VllmMamba2ReplayStandard):
    """``vllm-replay``: output_only standard decode, the fork's speculative verify/commit/reset."""

    name = "vllm-replay"
    description = ("official ReplaySSM Mamba-2 (vLLM fork): output_only standard decode; speculative "
                   "verify + commit + cursor reset on the circular post-conv ring")
    route_fn = "selective_state_update_replayssm_output_only"
    # the speculative kernel reads each row's tokens from query_start_loc (spec_len per row): packed and
    # ragged calls and standard steps on the speculative slots (one token per row) pass the offsets through
    supports_packed_layout = True
    supports_ragged_windows = True
    supports_mixed_decode = True

    @classmethod
    def unsupported_geometry(cls, geometry, decode=None):
        # _fused_scatter_precompute_kernel: bc = tl.dot(B [window, next_pow2(dstate)], C^T), the
        # contraction over dstate; Triton on NVIDIA compiles a dot only with K >= 16 for 16-bit
        # operands (>= 8 for fp32): a CompilationError on an H200 at dstate 2 (found by the GPU fuzz).
        # A compiler limit: under the Triton interpreter (the CPU) the kernel runs there.
        if decode is not None and decode.speculative and geometry.dstate < 9 and not triton_interpreted():
            return ("the fork's speculative kernel contracts dstate with tl.dot on a tile of next_pow2(dstate) "
                    "columns, which Triton compiles for 16-bit operands only from 16: dstate >= 9, "
                    f"got {geometry.dstate}")
        return None

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        return float_mode_reason(mode, "the fork's Mamba-2 replay kernel", ("ieee", "tf32")) or (
            _spec_dot_reason(mode, decode) if decode.speculative else
            (None if mode.dot == "ieee" else "the standard-decode kernel reads out in fp32 (ieee modes only)"))

    def __init__(self, config):
        super().__init__(config)
        if not self.decode.speculative:
            return
        g, S, d = self.geometry, self.num_slots + 1, self.decode
        self.d_inner, self.gn = g.nheads * g.headdim, g.ngroups * g.dstate
        self.ring = torch.zeros((S, d.ring_rows, self.d_inner + self.gn), dtype=self.mode.act_dtype,
                                device=self.device)
        self.dt_cache = torch.zeros((S, g.nheads, d.ring_rows), dtype=torch.float32, device=self.device)
        self.origin = torch.zeros(S, dtype=torch.int32, device=self.device)
        self.is_flush = torch.zeros(S, dtype=torch.int8, device=self.device)
        self.spec = self.modules["selective_state_update_replayssm_spec"]

    def reset(self, slot_ids, initial_state=None, origin=None):
        if not self.decode.speculative:
            return super().reset(slot_ids, initial_state, origin)
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        d, blk = self.decode, self.blocks(slot_ids)
        with launch_guard(self.device):
            self.spec.reset_replayssm_spec_cursors(self.write_pos, self.origin, self.is_flush,
                                                   (slot_ids >= 0).to(torch.int8), blk, d.lspec, d.window,
                                                   null_block_id=0)
        rows = self.active_rows(slot_ids)
        b = blk.index_select(0, rows).long()
        self.state[b] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        if origin is not None:  # bridge: the fork's reset starts the ring at 0
            self.origin[b] = origin.index_select(0, rows).to(torch.int32)
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        if not self.decode.speculative:
            if query_start_loc is not None:
                return self.standard_from_packed(slot_ids, inputs, out, query_start_loc, super().verify)
            self.check_window_lens(self._check_slot_ids(slot_ids), window_lens, 1)
            return super().verify(slot_ids, inputs, out)
        ids, out = self.begin_serving_verify(slot_ids, inputs, out, window_lens, query_start_loc)
        g, d = self.geometry, self.decode
        T = d.window
        tok, qsl, lens, put = self.pack_tokens(ids, inputs, window_lens, query_start_loc)
        n = sum(lens)
        conv_out = torch.cat([tok["x"].reshape(n, -1), tok["B"].reshape(n, -1), tok["C"].reshape(n, -1)], 1)
        o = self.scratch(n, g.nheads, g.headdim)
        with launch_guard(self.device):
            self.spec.selective_state_update_replayssm_spec(
                self.state, self.ring, self.dt_cache, conv_out.contiguous(), tok["dt"].contiguous(), self.A3,
                self.write_pos, self.origin, self.is_flush, qsl, self.blocks(slot_ids), d.lspec, T,
                self.d_inner, g.ngroups, g.dstate, D=self.D2, z=tok.get("z"), dt_bias=self.bias,
                dt_softplus=True, out=o, null_block_id=0)
        put(o, out)
        self.end_verify(ids, lens)
        return out

    def timed_step(self, slot_ids, inputs, out, accepted):
        """Speculative: verify (+ flush) launches and the fork's commit on packed ``conv_out``."""
        if not self.decode.speculative:
            return super().timed_step(slot_ids, inputs, out, accepted)
        g, d, R = self.geometry, self.decode, slot_ids.shape[0]
        T, n = d.window, R * d.window
        if bool((slot_ids < 0).any()):
            raise ValueError("slot_ids: a timed speculative step takes no padding rows")
        tok = {k: v.flatten(0, 1).contiguous() for k, v in inputs.items()}
        conv_out = torch.cat([tok["x"].reshape(n, -1), tok["B"].reshape(n, -1), tok["C"].reshape(n, -1)],
                             1).contiguous()
        qsl = torch.arange(0, n + 1, T, dtype=torch.int32, device=self.device)
        blk, acc, o = self.blocks(slot_ids), accepted.to(torch.int32), self.scratch(n, g.nheads, g.headdim)

        def step():
            with launch_guard(self.device):
                self.spec.selective_state_update_replayssm_spec(
                    self.state, self.ring, self.dt_cache, conv_out, tok["dt"], self.A3, self.write_pos,
                    self.origin, self.is_flush, qsl, blk, d.lspec, T, self.d_inner, g.ngroups, g.dstate, D=self.D2,
                    z=tok.get("z"), dt_bias=self.bias, dt_softplus=True, out=o, null_block_id=0)
                self.spec.commit_replayssm_spec(self.write_pos, self.origin, self.is_flush, acc, blk, d.lspec, T,
                                                d.ring_rows, null_block_id=0)
        return step

    def commit_spec(self, blk, accepted):
        d = self.decode
        with launch_guard(self.device):
            self.spec.commit_replayssm_spec(self.write_pos, self.origin, self.is_flush, accepted.to(torch.int32),
                                            blk, d.lspec, d.window, d.ring_rows, null_block_id=0)

    def _records(self):
        if not self.decode.speculative:
            return super()._records()
        g, S = self.geometry, self.num_slots
        ring = self.ring[1:]
        # "dt_raw": the fork keeps raw dt (before bias and softplus), not the family's Δ record, so the
        # checks that re-fold a kernel's own records (flush-increment) see another layout and say so
        return {"x": ring[..., :self.d_inner].reshape(S, -1, g.nheads, g.headdim),
                "B": ring[..., self.d_inner:].reshape(S, -1, g.ngroups, g.dstate),
                "dt_raw": self.dt_cache[1:].permute(0, 2, 1)}

    def committed_state(self, slot_ids):
        """Checkpoint + committed ring rows folded in fp64 (raw dt records: bias + softplus here)."""
        if not self.decode.speculative:
            return super().committed_state(slot_ids)
        rec = self._records()

        def fold(s):
            idx = self.hist_rows(s, int(self.write_pos[s + 1]), int(self.origin[s + 1]))
            hist = {k: v[s].index_select(0, idx).double() for k, v in rec.items()}
            hist["dt"] = softplus(hist.pop("dt_raw") + self.params64["dt_bias"])
            return Mamba2Math().fold(self.state[s + 1].double(), hist, self.params64, self.mode)
        return self.per_slot(slot_ids, fold)

    def ring_origins(self):
        """Speculative rings start where the fork's cursor reset put them; standard decode's at row 0."""
        return self.origin if self.decode.speculative else None


__all__ = ["VllmMamba2Replay"]
