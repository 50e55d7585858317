"""Adapters for the official ReplaySSM Mamba-2 kernels (vLLM fork) and vLLM's baseline.

Oracle: the validation engine (fp64 recurrence on the accepted stream, the literal models at the
same precision mode, exact invariants).  Expected: the literal model's error within its small
factor at every mode the kernel declares; anything else is a finding.

Kernels (loaded by :mod:`replayssm.adapters.vllm`, never copied):

* ``vllm-replay`` -- standard decode ``selective_state_update_replayssm_output_only``; speculative
  ``selective_state_update_replayssm_spec`` + ``commit_replayssm_spec`` + ``reset_replayssm_spec_cursors``.
* ``vllm-replay-state`` -- standard decode ``selective_state_update_replayssm_state_and_output``.
* ``vllm-baseline`` -- ``mamba_ssm.selective_state_update``; speculative with ``num_accepted_tokens``
  and one state block per draft position (``state_batch_indices [R, T']``).

Bridges (besides null block 0 / poisoned output scratch, see ``_base.py``):

* **Standard-decode cursors are per row.**  The standard kernels read ``write_pos[row]`` and
  ``is_flush[row]`` (vLLM's metadata builder gathers them).  The adapter keeps one device cursor
  per block, gathers it per row before a launch (``is_flush = write_pos == L - 1``) and advances
  it at commit (``0`` after a flush, else ``+1``).
* **Speculative** (``vllm-replay``'s verify / commit / reset, per-block cursors, packed tokens):
  ``vllm_mamba2_spec.py``.
* ``A``, ``dt``, ``dt_bias`` are passed as stride-0 ``[H, P, N]`` / ``[.., H, P]`` views (TIE_HDIM).

Precision each kernel really implements: the state in the state tensor's dtype (fp32 / bf16 / fp16,
a plain cast), activations and records in the activation dtype (the speculative kernel's dot
readouts: ``vllm_mamba2_spec.py``).  On CPU (interpreter) use fp32 activations: bf16 ``tl.dot`` is
wrong there (docs/kernel_interface.md).
"""

from __future__ import annotations

import torch

from replayssm.adapters._base import SlotAdapter, broadcast_last, float_mode_reason, tie_hdim
from replayssm.adapters._block_records import BlockRecordsAdapter
from replayssm.adapters._vllm_source import launch_guard
from replayssm.ops.mamba2.literal import Mamba2Math


class _VllmMamba2(SlotAdapter):
    # The fork's kernels apply softplus as where(dt <= 20.0, softplus(dt), dt): the default threshold.
    conventions: dict = {}

    family = "mamba2"

    def __init__(self, config):
        super().__init__(config)
        g = self.geometry
        p = {k: v.to(self.device, torch.float32) for k, v in config.params.items()}
        self.params64 = {k: v.double() for k, v in p.items()}
        self.bias = p["dt_bias"].contiguous()
        tied = tie_hdim({**p, "dt_bias": self.bias}, g)
        self.A3, self.bias2, self.D2 = tied["A"], tied["dt_bias"], tied["D"]

    def guard(self):
        """Around a launch: :func:`launch_guard` over the kernel modules this adapter loaded."""
        return launch_guard(self.device, list(self.modules.values()) or None)

    def _tok(self, inputs, rows, t=None):
        """Per-token tensors of ``rows``: window position ``t`` or all positions packed."""
        def take(k):
            v = inputs[k].index_select(0, rows)
            return (v[:, t] if t is not None else v.flatten(0, 1)).contiguous()
        return {k: take(k) for k in inputs}


class _VllmMamba2ReplayStandard(_VllmMamba2, BlockRecordsAdapter):
    """Standard decode through the fork's linear buffers (per-row cursors gathered here); the records
    are the committed Δ (already softplus'd), x and B."""

    kind = "replay"
    route_fn = ""
    record_math = Mamba2Math

    def __init__(self, config):
        super().__init__(config)
        g, S, m = self.geometry, self.num_slots + 1, self.mode
        L = self.decode.buffer
        self.state = torch.zeros((S, *self.state_shape), dtype=m.state_dtype, device=self.device)
        self.x_cache = torch.zeros((S, g.nheads, L, g.headdim), dtype=m.act_dtype, device=self.device)
        self.dt_cache = torch.zeros((S, g.nheads, L), dtype=torch.float32, device=self.device)
        self.B_cache = torch.zeros((S, g.ngroups, L, g.dstate), dtype=m.act_dtype, device=self.device)
        self.write_pos = torch.zeros(S, dtype=torch.int32, device=self.device)

    def reset(self, slot_ids, initial_state=None, origin=None):
        ids = self.check_reset_args(slot_ids, initial_state, origin)
        rows = self.active_rows(slot_ids)
        blk = self.blocks(slot_ids).index_select(0, rows).long()
        self.state[blk] = 0 if initial_state is None else initial_state.index_select(0, rows).to(self.state.dtype)
        self.write_pos[blk] = 0
        self.mark_reset(ids)

    def verify(self, slot_ids, inputs, out=None):
        ids = self.begin_verify(slot_ids, inputs, out)
        out = self.new_out(len(ids)) if out is None else out
        R, g, L = len(ids), self.geometry, self.decode.buffer
        blk = self.blocks(slot_ids)
        wp = self.write_pos.index_select(0, blk.long()).contiguous()
        tok = self._tok(inputs, torch.arange(R, device=self.device), t=0)
        o = self.scratch(R, g.nheads, g.headdim)
        kw = dict(D=self.D2, dt_bias=self.bias2, z=tok.get("z"), dt_softplus=True, x_cache=self.x_cache,
                  dt_cache=self.dt_cache, B_cache=self.B_cache, write_pos=wp, is_flush=wp == L - 1,
                  max_cache_len=L, state_batch_indices=blk, null_block_id=0, out=o)
        if self.route_fn.endswith("output_only"):
            kw["bc_pre"] = torch.zeros((R, g.ngroups, L), dtype=torch.float32, device=self.device)
        dt = broadcast_last(tok["dt"], g.headdim)
        fn = getattr(self.modules[self.route_fn], self.route_fn)
        with self.guard():
            fn(self.state, tok["x"], dt, self.A3, tok["B"], tok["C"], **kw)
        act = self.active_rows(slot_ids)
        out[act, 0] = o.index_select(0, act)
        self.end_verify(ids)
        return out

    def timed_step(self, slot_ids, inputs, out, accepted):
        """The standard kernel alone on pre-gathered inputs and per-row cursors (``_base.py``)."""
        R, g, L = slot_ids.shape[0], self.geometry, self.decode.buffer
        blk = self.blocks(slot_ids)
        n, pos = self.cursor_positions(blk, self.write_pos)
        tok = {k: v[:, 0].contiguous() for k, v in inputs.items()}
        dt = broadcast_last(tok["dt"], g.headdim)
        kw = dict(D=self.D2, dt_bias=self.bias2, z=tok.get("z"), dt_softplus=True, x_cache=self.x_cache,
                  dt_cache=self.dt_cache, B_cache=self.B_cache, max_cache_len=L, state_batch_indices=blk,
                  null_block_id=0, out=self.scratch(R, g.nheads, g.headdim))
        if self.route_fn.endswith("output_only"):
            kw["bc_pre"] = torch.zeros((R, g.ngroups, L), dtype=torch.float32, device=self.device)
        fn, calls = getattr(self.modules[self.route_fn], self.route_fn), [n]

        def step():
            wp, flush = pos[calls[0] % L]
            calls[0] += 1
            with self.guard():
                fn(self.state, tok["x"], dt, self.A3, tok["B"], tok["C"], write_pos=wp, is_flush=flush, **kw)
        return step

    # ---- inspection (records in our layout: [slots, rows, ...]) --------------------------------------
    def _records(self):
        return self.block_records(x=self.x_cache, B=self.B_cache, dt=self.dt_cache)


class VllmMamba2ReplayState(_VllmMamba2ReplayStandard):
    """``vllm-replay-state``: the state_and_output route (standard decode only)."""

    name = "vllm-replay-state"
    description = "official ReplaySSM Mamba-2 (vLLM fork): state_and_output standard decode (y = S C)"
    route_fn = "selective_state_update_replayssm_state_and_output"
    literal_twin = "literal-replay-state"

    @classmethod
    def unsupported_reason(cls, mode, decode, options):
        if decode.speculative:
            return "the fork has the state_and_output route for standard decode only (speculative: vllm-replay)"
        return float_mode_reason(mode, "the fork's state_and_output kernel")
